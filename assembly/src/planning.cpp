// The planner's functions: an ExecutionPlan for a budget from the image's layer table and the
// executor's options (blocks, residency, ring size, pinned slots), the minimum budget, and what
// the partitioner is told. Pure functions of their arguments: the Executor's Planner
// (planner.h) keeps the state they are called with.
#include "planning.h"
#include "device_backend.h"

#include <ATen/Context.h>

#include <algorithm>
#include <initializer_list>

namespace swapnet {

std::vector<LayerCost> layer_costs(const ImageInfo& info, const ExecutorOptions& o) {
  std::vector<LayerCost> l;
  for (const auto& L : info.layers) {
    l.push_back(LayerCost{L.size, L.num_tensors, o.measured_exec ? L.time_ms : o.gamma_ms_per_flop * L.flops,
                          L.live_bytes, L.peak_bytes});
  }
  return l;
}


// Slots read by some layer outside the block owning them, when that block is swapped (a
// resident block's slots stay bound).
std::uint64_t pinned_bytes(const ImageInfo& info, const Skeleton& sk, const std::vector<int>& block_of_layer,
                           const std::vector<char>& resident, std::vector<int>* pinned) {
  std::uint64_t bytes = 0;
  for (size_t s = 0; s < sk.slots().size(); ++s) {
    const SlotInfo& sl = sk.slots()[s];
    if (resident[block_of_layer[sl.layer]]) continue;
    bool outside = false;
    for (int k : sl.used_by) outside |= block_of_layer[k] != block_of_layer[sl.layer];
    if (outside) {
      bytes += (info.tensors[s].nbytes + 63) / 64 * 64;
      if (pinned) pinned->push_back(static_cast<int>(s));
    }
  }
  return bytes;
}

std::vector<int> block_of_layer(const ImageInfo& info, const Blocks& blocks) {
  std::vector<int> of(info.layers.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (int k = blocks[b].first; k <= blocks[b].second; ++k) of[k] = static_cast<int>(b);
  }
  return of;
}

namespace {

Blocks from_cuts(const ImageInfo& info, const std::vector<int>& cuts, const std::string& origin) {
  Blocks blocks;
  int first = 0;
  const int L = static_cast<int>(info.layers.size());
  for (int c : cuts) {
    if (c <= first || c >= L) {
      throw Error(origin + ": partition point " + std::to_string(c) + " must be increasing and within 1.." +
                  std::to_string(L - 1));
    }
    blocks.emplace_back(first, c - 1);
    first = c;
  }
  blocks.emplace_back(first, L - 1);
  return blocks;
}

// One block is kept resident (read once), as before partitions had flags.
std::vector<char> default_flags(const Blocks& blocks) { return std::vector<char>(blocks.size(), blocks.size() == 1); }

}  // namespace

// Layers on the CPU read their blocks into host memory, also where a GPU is usable (the GPU
// never reads them; on the H100 such runs had lost the ring and the lent reserve). Only pinned
// memory, asked for by name, stays.
bool host_blocks(const ExecutorOptions& o) {
  return o.device == ExecutorOptions::Device::kCPU && o.memory != MemoryKind::kRegistered;
}

// The plan for `blocks` within `budget` (0: the least memory): the ring gets what activations,
// pinned slots and resident blocks leave (never more than one inference of swapped bytes), or
// the largest consecutive pair for the two-block pipelines.
ExecutionPlan finish_plan(const ImageInfo& info, const Skeleton& sk, Blocks blocks, std::vector<char> resident,
                          const std::vector<LayerCost>& costs, const CostModel& m, const PartitionOptions& pipe,
                          std::uint64_t budget, int retain_block, std::uint64_t retained) {
  const ReadAhead ra = pipe.read_ahead;
  ExecutionPlan p;
  for (const auto& [first, last] : blocks) {
    std::uint64_t bytes = 0;
    for (int k = first; k <= last; ++k) bytes += info.layers[k].size;
    p.block_bytes.push_back(bytes);
  }
  Partition part;
  part.blocks = blocks;
  part.resident = resident;
  part.ring_depth = ra == ReadAhead::kTwoEnded ? 2 : 0;
  part.lend_bytes = ra == ReadAhead::kRing ? pipe.lend : 0;  // Note [Lending the activation reserve]
  // Part of a block kept (Note [Keeping part of a block]): the deep ring's, of a swapped block,
  // whole pages, and never all of it.
  if (ra == ReadAhead::kRing && retain_block >= 0 && retain_block < static_cast<int>(blocks.size()) &&
      !resident[retain_block]) {
    const std::uint64_t bytes = p.block_bytes[retain_block];
    retained = std::min(retained / kImageAlign * kImageAlign, bytes > kImageAlign ? bytes - kImageAlign : 0);
    if (retained > 0) {
      part.retain_block = retain_block;
      part.retained_bytes = retained;
    }
  }
  evaluate(costs, m, &part);
  p.blocks = std::move(blocks);
  p.resident = std::move(resident);
  p.read_ahead = ra;
  p.pair_bytes = part.arena_bytes;
  p.resident_bytes = part.resident_bytes;
  p.read_bytes = part.read_bytes;
  p.retain_block = part.retain_block;
  p.retained_bytes = part.retained_bytes;
  p.activation_bytes = info.activation_bytes;
  p.pinned_bytes = pinned_bytes(info, sk, block_of_layer(info, p.blocks), p.resident, nullptr);
  // The deep ring needs only the largest block (Note [A ring of one block]; of a block kept in
  // part, the rest); two ends a pair.
  std::uint64_t ring = ra == ReadAhead::kRing ? part.block_max : p.pair_bytes;
  const std::uint64_t fixed = p.activation_bytes + p.pinned_bytes + p.resident_bytes + p.retained_bytes;
  if (ra == ReadAhead::kRing && p.read_bytes > 0 && budget > fixed) {
    // Whole pages: the ring is mapped in pages, and what it maps is what it holds.
    ring = std::max(ring, std::min(p.read_bytes, (budget - fixed) / kImageAlign * kImageAlign));
  }
  p.arena_bytes = p.read_bytes == 0 ? 0 : ring;
  if (ra != ReadAhead::kPaper && p.read_bytes > 0) {
    part.ring_bytes = std::max<std::uint64_t>(ring, 1);
    evaluate(costs, m, &part);
    if (ra == ReadAhead::kRing && prefer_two_ended(costs, m, &part)) p.read_ahead = ReadAhead::kTwoEnded;
  }
  p.predicted_ms = part.predicted_ms;
  return p;
}

namespace {
// A pipeline with nothing lent (memory only: min_budget_for, planning_reserve).
PartitionOptions bare(ReadAhead ra) {
  PartitionOptions po;
  po.read_ahead = ra;
  return po;
}
}  // namespace

// The deep ring needs the largest layer (Note [A ring of one block]), the two-block pipelines the
// largest adjacent pair.
std::uint64_t min_budget_for(const ImageInfo& info, const Skeleton& sk, ReadAhead ra) {
  const int L = static_cast<int>(info.layers.size());
  if (L == 0) return info.activation_bytes;
  const std::vector<LayerCost> costs = layer_costs(info, ExecutorOptions{});
  Blocks finest;
  for (int k = 0; k < L; ++k) finest.emplace_back(k, k);
  const CostModel m;
  ExecutionPlan p = finish_plan(info, sk, finest, std::vector<char>(L, 0), costs, m,
                                bare(ra == ReadAhead::kRing ? ReadAhead::kRing : ReadAhead::kPaper), 0);
  // The finest partition minimises the largest adjacent pair; one block may still be smaller
  // (a one- or two-layer model).
  ExecutionPlan one = finish_plan(info, sk, {{0, L - 1}}, {1}, costs, m, bare(ReadAhead::kPaper), 0);
  return std::min(p.total(), one.total());
}

// The partitioner plans the ring and the resident blocks; the rest of the budget holds
// activations and pinned shared weights, reserved at the finest partition's pinned bytes (an
// upper bound: coarser blocks and resident blocks pin fewer).
std::uint64_t planning_reserve(const ImageInfo& info, const Skeleton& sk, const ExecutorOptions& o) {
  Blocks finest;
  for (int k = 0; k < static_cast<int>(info.layers.size()); ++k) finest.emplace_back(k, k);
  std::vector<char> none(finest.size(), 0);
  ExecutionPlan p = finish_plan(info, sk, std::move(finest), std::move(none), layer_costs(info, o), o.cost,
                                bare(ReadAhead::kPaper), 0);
  return p.activation_bytes + p.pinned_bytes;
}

// The activation reserve the deep ring is lent where activations leave it (Note [Lending the
// activation reserve]): what adopt() gives the ring as its zone (but for the CPU meter being
// outranked by a host program's allocator, found only then). Only where the CPU meter counts the
// activations (Caps::meters_activations) and they live in host memory.
std::uint64_t lend_for(const ImageInfo& info, const ExecutorOptions& o) {
  return o.lend && host_blocks(o) && backend_caps(o).meters_activations && o.read_ahead == ReadAhead::kRing &&
                 info.activation_bytes >= (1u << 20) && info.version >= kImageZoneReserveVersion
             ? info.activation_bytes
             : 0;
}

// What the partitioner (search and budget grid) is told of these options.
PartitionOptions partition_options(const ImageInfo& info, const ExecutorOptions& o) {
  PartitionOptions po;
  po.residency = o.residency;
  po.read_ahead = o.read_ahead;
  po.lend = lend_for(info, o);
  return po;
}

ExecutionPlan plan_for(const ImageInfo& info, const Skeleton& sk, const ExecutorOptions& o, const std::string& origin) {
  const ReadAhead ra = o.read_ahead;
  const PartitionOptions pipe = partition_options(info, o);
  const std::uint64_t minimum = min_budget_for(info, sk, ra);
  auto too_small = [&](const std::string& what) {
    return Error(origin + ": budget " + std::to_string(o.budget) + " bytes (" + format_bytes(o.budget) + ") " + what +
                 "; the minimum for this model is " + std::to_string(minimum) + " bytes (" + format_bytes(minimum) +
                 (ra == ReadAhead::kRing ? ": the largest layer + " : ": the two largest adjacent layers + ") +
                 format_bytes(info.activation_bytes) + " of activations)");
  };
  if (info.layers.empty()) throw Error(origin + ": the image has no layers");
  const int L = static_cast<int>(info.layers.size());
  const std::vector<LayerCost> costs = layer_costs(info, o);
  auto done = [&](ExecutionPlan p) {
    p.min_budget = minimum;
    return p;
  };
  if (!o.partition.empty() || o.blocks > 0) {
    Blocks blocks = o.partition.empty() ? equal_bytes_blocks(costs, o.blocks) : from_cuts(info, o.partition, origin);
    std::vector<char> flags = o.resident.empty() ? default_flags(blocks) : std::vector<char>(blocks.size(), 0);
    for (int r : o.resident) {
      if (r < 0 || r >= static_cast<int>(blocks.size())) {
        throw Error(origin + ": resident block " + std::to_string(r) + " is not one of the partition's blocks 0.." +
                    std::to_string(blocks.size() - 1));
      }
      flags[r] = 1;
    }
    if (o.retain_block >= 0 && (o.retain_block >= static_cast<int>(blocks.size()) || flags[o.retain_block])) {
      throw Error(origin + ": block " + std::to_string(o.retain_block) + " to keep in part is not one of the " +
                  "partition's swapped blocks (0.." + std::to_string(blocks.size() - 1) + ")");
    }
    ExecutionPlan p = finish_plan(info, sk, std::move(blocks), std::move(flags), costs, o.cost, pipe, o.budget,
                                  o.retain_block, o.retained_bytes);
    if (p.total() > o.budget) {
      throw too_small("does not fit this partition (" + std::to_string(p.blocks.size()) + " blocks need " +
                      format_bytes(p.total()) + ")");
    }
    return done(std::move(p));
  }
  if (o.budget < minimum) throw too_small("is below the minimum");
  if (o.planner == ExecutorOptions::Planner::kOptimal) {
    const std::uint64_t reserve = planning_reserve(info, sk, o);
    if (o.budget > reserve) {
      Partition best = optimal_partition(costs, o.budget - reserve, o.cost, pipe);
      if (best.feasible) {
        ExecutionPlan p = finish_plan(info, sk, best.blocks, best.resident, costs, o.cost, pipe, o.budget,
                                      best.retain_block, best.retained_bytes);
        if (p.total() <= o.budget) return done(std::move(p));
      }
    }
    // Near the minimum the reserve is too coarse: fall through to equal bytes, which is exact.
  }
  // The fewest equal-byte blocks whose adjacent pairs fit: fewer blocks, fewer boundaries.
  for (int n = 1; n <= L; ++n) {
    Blocks blocks = equal_bytes_blocks(costs, n);
    std::vector<char> flags = default_flags(blocks);
    ExecutionPlan p = finish_plan(info, sk, std::move(blocks), std::move(flags), costs, o.cost, pipe, o.budget);
    if (p.total() <= o.budget) return done(std::move(p));
  }
  // n = L is the finest partition, which fits any budget >= minimum.
  throw Error(origin + ": internal: no partition fits " + std::to_string(o.budget) + " bytes above the minimum");
}


std::uint64_t default_grid_step(const ImageInfo& info) {
  return std::max<std::uint64_t>(1u << 20, info.data_size / 64);
}

std::uint64_t min_budget(const ImageInfo& info, const ExecutorOptions& options) {
  return min_budget_for(info, Skeleton::from_image(info, info.source), options.read_ahead);
}

std::uint64_t planning_reserve(const ImageInfo& info, const ExecutorOptions& o) {
  return planning_reserve(info, Skeleton::from_image(info, info.source), o);
}

std::uint64_t min_read_bytes(const ImageInfo& info, const ExecutorOptions& options) {
  return min_read_bytes(layer_costs(info, options),
                        options.budget > info.activation_bytes ? options.budget - info.activation_bytes : 0,
                        options.read_ahead != ReadAhead::kRing);
}

ExecutionPlan plan_execution(const ImageInfo& info, const ExecutorOptions& options) {
  ExecutionPlan p = plan_for(info, Skeleton::from_image(info, info.source), options, info.source);
  p.min_read_bytes = min_read_bytes(info, options);
  return p;
}

// ---- options as the CLI and the Python package spell them ----------------------------------

namespace {

// `value` looked up in `choices` (text, value), or Error("NAME 'VALUE' is not one of a|b|c").
template <typename T>
T choose(const std::string& name, const std::string& value, std::initializer_list<std::pair<const char*, T>> choices) {
  std::string all;
  for (const auto& [text, v] : choices) {
    if (value == text) return v;
    all += (all.empty() ? "" : "|") + std::string(text);
  }
  throw Error(name + " '" + value + "' is not one of " + all);
}

}  // namespace

void set_executor_option(ExecutorOptions* o, const std::string& name, const std::string& value) {
  std::string key = name.substr(name.find_first_not_of('-') == std::string::npos ? name.size() : name.find_first_not_of('-'));
  std::replace(key.begin(), key.end(), '-', '_');
  using Planner = ExecutorOptions::Planner;
  using Verify = ExecutorOptions::Verify;
  using Device = ExecutorOptions::Device;
  if (key == "plan") {
    o->planner = choose<Planner>(name, value, {{"auto", Planner::kOptimal}, {"optimal", Planner::kOptimal},
                                               {"equal", Planner::kEqual}});
    if (o->planner == Planner::kOptimal) o->residency = value == "auto";
  } else if (key == "read_ahead") {
    // ring-whole: the ring without streaming (Note [Streaming into the ring]); ring-blocks:
    // without layer-by-layer pipelining (Note [Layer by layer]); for comparison.
    // ring-reserved: without lending the activation reserve (Note [Lending the activation reserve]).
    // ring-serial: nothing read after a streamed block until it is whole (Note [Streaming into
    // the ring]). two-ended: two blocks at the two ends (the GPU's pipeline before its deep ring).
    o->read_ahead = choose<ReadAhead>(name, value, {{"ring", ReadAhead::kRing}, {"ring-whole", ReadAhead::kRing},
                                                    {"ring-blocks", ReadAhead::kRing}, {"ring-reserved", ReadAhead::kRing},
                                                    {"ring-serial", ReadAhead::kRing},
                                                    {"two-ended", ReadAhead::kTwoEnded}, {"paper", ReadAhead::kPaper}});
    o->stream = value != "ring-whole";
    o->layer_by_layer = value == "ring" || value == "ring-reserved" || value == "ring-serial" || value == "two-ended";
    o->lend = value == "ring" || value == "ring-serial";
    o->read_past_streamed = value != "ring-serial";
  } else if (key == "verify") {
    o->verify = choose<Verify>(name, value, {{"first", Verify::kFirst}, {"always", Verify::kAlways},
                                             {"never", Verify::kNever}});
  } else if (key == "device") {
    o->device = choose<Device>(name, value, {{"cpu", Device::kCPU}, {"cuda", Device::kCUDA}});
  } else {
    throw Error("unknown executor option '" + name + "' (plan, read-ahead, verify, device)");
  }
}

void require_cuda(const std::string& origin) {
  if (!at::hasCUDA()) {
    throw Error(origin + ": --device cuda: this libtorch has no CUDA support (a CPU-only build); swapnet must be "
                         "built against a CUDA libtorch (scripts/gpu-check.sh shows how)");
  }
  if (!cuda_device().usable) throw Error(origin + ": --device cuda: no usable CUDA device: " + cuda_device().reason);
}

}  // namespace swapnet
