// Swapped execution within a budget: plan blocks, fetch block i+1 while block i runs, bind by
// reference, release after use. Also the CPU allocation meter used to account activations.
//
// Budget accounting (ExecutionPlan): budget = arena + activations + pinned slots, where
//  - arena: the two-ended block arena (Note [Two-ended arena]), sized to the largest pair of
//    adjacent blocks, so block i+1 can arrive while block i executes;
//  - activations: the peak bytes forward allocated at the image's example input (measured by
//    the CPU meter when packing);
//  - pinned: slots read by a layer outside the block that owns them (shared weights); they are
//    read once at open and stay resident, so a released block never leaves a dangling view.
//
// Note [Swapping onto the GPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With ExecutorOptions::Device::kCUDA the arena is managed memory: the reader DMAs a block
// into it, and the same bytes are bound as CUDA tensors (no copy). On discrete GPUs
// (concurrentManagedAccess) the block is prefetched to the GPU once read; on integrated GPUs
// (Jetson: no concurrent managed access, so the host may not touch managed memory while any
// kernel runs, and the reader writes and checksums block i+1 while block i computes) the arena
// is pinned host memory registered with CUDA instead: the same DRAM, readable in place, and
// without that rule. Kernels run asynchronously, so an arena end may only be
// refilled once the kernels reading its previous block are done: after a block's layers are
// queued, an event is recorded for its end, and the read into that end waits for it. The order
// per block is therefore: wait for its read, bind, queue its kernels, then submit the next read
// (which waits for the block before, two back) — the read of block i+1 still overlaps the
// kernels of block i. The first block of an inference waits for both ends: the previous
// inference's last block may still be computing at the other one. If the reader cannot DMA into managed memory (EFAULT/EOPNOTSUPP, found
// with a one-page read at open), the arena is host memory pinned with cudaHostRegister instead.
// Activations live in PyTorch's CUDA caching allocator; the budget reserves the activation
// bytes measured on the CPU at pack time (the same tensors; cuDNN workspaces are not counted).
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <c10/core/Allocator.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "swapnet/assembly.h"

namespace swapnet {

// ---- CPU meter --------------------------------------------------------------------------

namespace {

std::atomic<std::uint64_t> g_cpu_current{0};
std::atomic<std::uint64_t> g_cpu_peak{0};

// Accounts (new_cpu_account): per-account counters, never freed, so a tensor that outlives
// whoever charged it still finds its account when it is freed. Account 0 is "none".
struct Account {
  std::atomic<std::uint64_t> current{0};
  std::atomic<std::uint64_t> peak{0};
};
constexpr int kMaxAccounts = 256;
Account g_accounts[kMaxAccounts];
std::atomic<int> g_next_account{1};
thread_local int t_account = 0;

void raise_peak(std::atomic<std::uint64_t>& peak, std::uint64_t now) {
  std::uint64_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

// Each allocation carries its size and account in a 64-byte header (which keeps the 64-byte
// alignment libtorch expects), so the raw deleter (used by oneDNN through raw_allocate) can
// count frees, on whichever thread they happen.
constexpr std::size_t kHeader = 64;  // bytes

void meter_free(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  std::size_t bytes = 0;
  std::int32_t account = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  std::memcpy(&account, base + sizeof bytes, sizeof account);
  g_cpu_current.fetch_sub(bytes);
  if (account > 0) g_accounts[account].current.fetch_sub(bytes);
  c10::free_cpu(base);
}

class MeterAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) const override {
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &meter_free, c10::Device(c10::DeviceType::CPU));
    char* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    const std::int32_t account = t_account;
    std::memcpy(base, &n, sizeof n);
    std::memcpy(base + sizeof n, &account, sizeof account);
    raise_peak(g_cpu_peak, g_cpu_current.fetch_add(n) + n);
    if (account > 0) raise_peak(g_accounts[account].peak, g_accounts[account].current.fetch_add(n) + n);
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &meter_free, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &meter_free; }
};

}  // namespace

void install_cpu_meter() {
  static std::once_flag once;
  std::call_once(once, [] {
    static MeterAllocator meter;
    c10::SetCPUAllocator(&meter, /*priority=*/1);
  });
}

CpuMeterStats cpu_meter() { return CpuMeterStats{g_cpu_current.load(), g_cpu_peak.load()}; }
void reset_cpu_meter_peak() { g_cpu_peak.store(g_cpu_current.load()); }

int new_cpu_account() {
  int a = g_next_account.fetch_add(1);
  if (a >= kMaxAccounts) {
    g_next_account.store(kMaxAccounts);
    return 0;
  }
  return a;
}
int set_thread_cpu_account(int account) {
  const int before = t_account;
  t_account = account > 0 && account < kMaxAccounts ? account : 0;
  return before;
}
CpuMeterStats cpu_account(int account) {
  if (account <= 0 || account >= kMaxAccounts) return {};
  return CpuMeterStats{g_accounts[account].current.load(), g_accounts[account].peak.load()};
}
void reset_cpu_account_peak(int account) {
  if (account <= 0 || account >= kMaxAccounts) return;
  g_accounts[account].peak.store(g_accounts[account].current.load());
}

std::uint64_t measure_activation_bytes(const Skeleton& sk, const std::vector<c10::IValue>& inputs) {
  install_cpu_meter();
  reset_cpu_meter_peak();
  const std::uint64_t base = cpu_meter().current;
  std::vector<c10::IValue> copies;
  for (const auto& v : inputs) copies.emplace_back(v.isTensor() ? c10::IValue(v.toTensor().clone()) : v);
  sk.forward(std::move(copies));
  return cpu_meter().peak - base;
}

// ---- planning -------------------------------------------------------------------------------

std::vector<LayerCost> layer_costs(const ImageInfo& info, const ExecutorOptions& o) {
  std::vector<LayerCost> l;
  for (const auto& L : info.layers) {
    l.push_back(LayerCost{L.size, L.num_tensors, o.measured_exec ? L.time_ms : o.gamma_ms_per_flop * L.flops});
  }
  return l;
}

namespace {

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

ExecutionPlan finish_plan(const ImageInfo& info, const Skeleton& sk, Blocks blocks, std::vector<char> resident,
                          const std::vector<LayerCost>& costs, const CostModel& m) {
  ExecutionPlan p;
  Partition part;
  part.blocks = blocks;
  part.resident = resident;
  evaluate(costs, m, &part);
  p.blocks = std::move(blocks);
  p.resident = std::move(resident);
  for (const auto& [first, last] : p.blocks) {
    std::uint64_t bytes = 0;
    for (int k = first; k <= last; ++k) bytes += info.layers[k].size;
    p.block_bytes.push_back(bytes);
  }
  p.arena_bytes = part.arena_bytes;
  p.resident_bytes = part.resident_bytes;
  p.read_bytes = part.read_bytes;
  p.predicted_ms = part.predicted_ms;
  p.activation_bytes = info.activation_bytes;
  p.pinned_bytes = pinned_bytes(info, sk, block_of_layer(info, p.blocks), p.resident, nullptr);
  return p;
}

std::uint64_t min_budget_for(const ImageInfo& info, const Skeleton& sk) {
  const int L = static_cast<int>(info.layers.size());
  if (L == 0) return info.activation_bytes;
  const std::vector<LayerCost> costs = layer_costs(info, ExecutorOptions{});
  Blocks finest;
  for (int k = 0; k < L; ++k) finest.emplace_back(k, k);
  const CostModel m;
  ExecutionPlan p = finish_plan(info, sk, finest, std::vector<char>(L, 0), costs, m);
  // The finest partition minimises the largest adjacent pair; one block may still be smaller
  // (a one- or two-layer model).
  ExecutionPlan one = finish_plan(info, sk, {{0, L - 1}}, {1}, costs, m);
  return std::min(p.total(), one.total());
}

// The partitioner plans the arena and the resident blocks; the rest of the budget holds
// activations and pinned shared weights, reserved at the finest partition's pinned bytes (an
// upper bound: coarser blocks and resident blocks pin fewer).
std::uint64_t planning_reserve(const ImageInfo& info, const Skeleton& sk, const ExecutorOptions& o) {
  Blocks finest;
  for (int k = 0; k < static_cast<int>(info.layers.size()); ++k) finest.emplace_back(k, k);
  std::vector<char> none(finest.size(), 0);
  ExecutionPlan p = finish_plan(info, sk, std::move(finest), std::move(none), layer_costs(info, o), o.cost);
  return p.activation_bytes + p.pinned_bytes;
}

ExecutionPlan plan_for(const ImageInfo& info, const Skeleton& sk, const ExecutorOptions& o, const std::string& origin) {
  const std::uint64_t minimum = min_budget_for(info, sk);
  auto too_small = [&](const std::string& what) {
    return Error(origin + ": budget " + std::to_string(o.budget) + " bytes (" + format_bytes(o.budget) + ") " + what +
                 "; the minimum for this model is " + std::to_string(minimum) + " bytes (" + format_bytes(minimum) +
                 ": the two largest adjacent layers + " + format_bytes(info.activation_bytes) + " of activations)");
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
    ExecutionPlan p = finish_plan(info, sk, std::move(blocks), std::move(flags), costs, o.cost);
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
      PartitionOptions po;
      po.residency = o.residency;
      Partition best = optimal_partition(costs, o.budget - reserve, o.cost, po);
      if (best.feasible) {
        ExecutionPlan p = finish_plan(info, sk, best.blocks, best.resident, costs, o.cost);
        if (p.total() <= o.budget) return done(std::move(p));
      }
    }
    // Near the minimum the reserve is too coarse: fall through to equal bytes, which is exact.
  }
  // The fewest equal-byte blocks whose adjacent pairs fit: fewer blocks, fewer boundaries.
  for (int n = 1; n <= L; ++n) {
    Blocks blocks = equal_bytes_blocks(costs, n);
    std::vector<char> flags = default_flags(blocks);
    ExecutionPlan p = finish_plan(info, sk, std::move(blocks), std::move(flags), costs, o.cost);
    if (p.total() <= o.budget) return done(std::move(p));
  }
  // n = L is the finest partition, which fits any budget >= minimum.
  throw Error(origin + ": internal: no partition fits " + std::to_string(o.budget) + " bytes above the minimum");
}

}  // namespace

std::uint64_t default_grid_step(const ImageInfo& info) {
  return std::max<std::uint64_t>(1u << 20, info.data_size / 64);
}

std::uint64_t min_budget(const ImageInfo& info) {
  return min_budget_for(info, Skeleton::from_image(info, info.source));
}

std::uint64_t planning_reserve(const ImageInfo& info, const ExecutorOptions& o) {
  return planning_reserve(info, Skeleton::from_image(info, info.source), o);
}

ExecutionPlan plan_execution(const ImageInfo& info, const ExecutorOptions& options) {
  return plan_for(info, Skeleton::from_image(info, info.source), options, info.source);
}

// ---- the executor -------------------------------------------------------------------------

void require_cuda(const std::string& origin) {
  if (!at::hasCUDA()) {
    throw Error(origin + ": --device cuda: this libtorch has no CUDA support (a CPU-only build); swapnet must be "
                         "built against a CUDA libtorch (scripts/gpu-check.sh shows how)");
  }
  if (!cuda_device().usable) throw Error(origin + ": --device cuda: no usable CUDA device: " + cuda_device().reason);
}

struct Executor::Impl {
  std::string path;
  ImageInfo info;
  Skeleton sk;
  ExecutorOptions opt;
  ExecutionPlan plan;
  std::unique_ptr<BlockReader> reader;
  std::unique_ptr<Arena> arena;      // swapped blocks, two-ended
  std::unique_ptr<Arena> kept;       // resident blocks, one after another
  std::vector<std::uint64_t> kept_at;  // per block: its offset in `kept` (resident blocks)
  std::vector<int> swapped;          // indices of the swapped blocks, in order
  std::unique_ptr<PartitionTable> grid;  // ExecutorOptions::grid_step
  std::uint64_t grid_reserve = 0;        // budget - capacity the grid was built for
  std::vector<int> pinned;           // slot indices kept resident
  void* pinned_buf = nullptr;
  std::vector<at::Tensor> pinned_views;
  std::vector<bool> verified;  // per layer: its checksum has passed once since open
  double bind_seconds = 0;      // spent in bind_layers (assembly by reference)
  std::uint64_t bound = 0;      // tensors bound by it
  bool resident_loaded = false;
  bool released = false;        // Executor::release(): nothing held until the next set_budget
  std::uint64_t kept_bytes = 0;   // resident blocks' arena
  std::uint64_t pinned_need = 0;  // pinned slots' buffer
  std::uint64_t weight_peak = 0;  // Executor::weight_memory().peak
  // ExecutorOptions::Device::kCUDA (Note [Swapping onto the GPU]).
  bool cuda = false;
  c10::Device device{c10::DeviceType::CPU};
  std::unique_ptr<c10::Event> done[2];  // per arena end: the kernels of the block placed there
  std::unique_ptr<Arena> pinned_gpu;    // pinned slots, where the GPU can read them

  // The address the layers read for `p` in `a` (the GPU's view of registered memory).
  void* dev(const Arena& a, void* p) const { return a.device_base() + (static_cast<char*>(p) - a.base()); }
  c10::Stream stream() const { return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device); }
  // Kernels reading arena end `e` have been queued: remember where they end.
  void record_end(int e) {
    if (!done[e]) done[e] = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
    done[e]->record(stream());
  }
  // Before the reader writes into end `e`: its previous block's kernels must have finished.
  void wait_end(int e) const {
    if (!cuda || !done[e]) return;
    while (!done[e]->query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  // Nothing queued on the GPU reads any block: before arenas are resized, re-read or freed.
  void gpu_idle() const {
    if (!cuda) return;
    wait_end(0);
    wait_end(1);
    c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->synchronizeStream(stream());
  }

  // The checks block b's fetch must make under the verify policy.
  std::vector<BlockReader::Check> checks_for(size_t b) const {
    std::vector<BlockReader::Check> c;
    if (opt.verify == ExecutorOptions::Verify::kNever) return c;
    for (int k = plan.blocks[b].first; k <= plan.blocks[b].second; ++k) {
      const ImageLayer& L = info.layers[k];
      if (L.size == 0 || (opt.verify == ExecutorOptions::Verify::kFirst && verified[k])) continue;
      c.push_back({L.offset, L.size, L.checksum, "layer " + std::to_string(k) + " (" + L.name + ")"});
    }
    return c;
  }
  // Weights in use now: the arena ends placed, resident blocks, pinned slots.
  void note_in_use() {
    if (!arena) return;
    weight_peak = std::max(weight_peak, arena->placed(false) + arena->placed(true) + kept_bytes + pinned_need);
  }
  void mark_verified(size_t b) {
    for (int k = plan.blocks[b].first; k <= plan.blocks[b].second; ++k) verified[k] = true;
  }

  Impl(std::string p, ImageInfo i, Skeleton s) : path(std::move(p)), info(std::move(i)), sk(std::move(s)) {}
  ~Impl() {
    try {
      gpu_idle();
    } catch (...) {  // a failing GPU at teardown: nothing left to protect
    }
    free_aligned(pinned_buf);
  }

  // Frees the pinned slots' buffer (their views are dropped first).
  void drop_pinned() {
    pinned.clear();
    pinned_views.clear();
    free_aligned(pinned_buf);
    pinned_buf = nullptr;
    pinned_gpu.reset();
    pinned_need = 0;
  }
  void rebind_pinned() {
    for (size_t i = 0; i < pinned.size(); ++i) sk.bind_slot(pinned[i], pinned_views[i]);
  }
  void bind_resident() {
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      if (!plan.resident[b]) continue;
      sk.bind_layers(plan.blocks[b].first, plan.blocks[b].second, dev(*kept, kept->base() + kept_at[b]), offset(b), device);
    }
  }
  // Reads every resident block (once per plan) and binds it.
  void load_resident() {
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      if (!plan.resident[b] || plan.block_bytes[b] == 0) continue;
      Status s = reader->read(offset(b), plan.block_bytes[b], kept->base() + kept_at[b], checks_for(b));
      if (!s.ok()) throw Error(s.message() + " (resident block " + std::to_string(b) + ")");
      mark_verified(b);
      if (cuda && kept->kind() == MemoryKind::kManaged) gpu_prefetch(kept->base() + kept_at[b], plan.block_bytes[b]);
    }
    bind_resident();
    rebind_pinned();
    resident_loaded = true;
    note_in_use();
  }

  std::uint64_t offset(size_t b) const { return info.layers[plan.blocks[b].first].offset; }
};

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() = default;

// Makes `p` the plan in force: sizes the arena (within its reservation, or a new one), and
// reads the slots this partition must keep resident. Called between inferences only.
void adopt(Executor::Impl& m, ExecutionPlan p);
// Frees every byte held for weights (Executor::release).
void release_all(Executor::Impl& m);

std::unique_ptr<Executor> Executor::open(const std::string& image, const ExecutorOptions& options) {
  ImageInfo info;
  read_image_info(image, &info).throw_if_error();
  Skeleton sk = Skeleton::from_image(info, image);
  auto impl = std::make_unique<Impl>(image, std::move(info), std::move(sk));
  Impl& m = *impl;
  m.opt = options;
  if (options.device == ExecutorOptions::Device::kCUDA) {
    require_cuda(image);
    if (options.memory == MemoryKind::kHost) {
      throw Error(image + ": --device cuda needs memory the GPU can read in place (managed), not host memory");
    }
    m.cuda = true;
    m.device = c10::Device(c10::DeviceType::CUDA, 0);
    if (!cuda_device().concurrent_managed_access && m.opt.memory == MemoryKind::kManaged) {
      // Integrated GPUs (Jetson): the host may not touch managed memory while any kernel runs,
      // and the reader DMAs and checksums block i+1 while block i computes. Pinned host memory
      // mapped for the GPU is the same DRAM there and has no such rule.
      log_once(LogLevel::kInfo, "cuda_integrated",
               "GPU without concurrent managed access (" + cuda_device().name +
                   "): blocks go to pinned host memory registered with CUDA, so reads can overlap kernels");
      m.opt.memory = MemoryKind::kRegistered;
    }
  }
  ExecutionPlan p = plan_for(m.info, m.sk, options, image);
  BlockReader::open(image, options.reader, &m.reader).throw_if_error();
  // Host memory: reserve address space for the whole model once (MAP_NORESERVE costs nothing
  // until touched), so a larger budget later needs no new arena. Managed memory: the plan's size.
  const bool host = options.memory == MemoryKind::kHost || !cuda_device().usable;
  m.arena = Arena::create(std::max<std::uint64_t>(host ? std::max(p.arena_bytes, m.info.data_size) : p.arena_bytes,
                                                  kImageAlign),
                          m.opt.memory);
  if (m.cuda) {
    // Some kernels refuse O_DIRECT reads into managed memory (get_user_pages: EFAULT or
    // EOPNOTSUPP). Find out with one page before the first inference, and use pinned host
    // memory registered with CUDA instead.
    const std::uint64_t probe = std::min<std::uint64_t>(kImageAlign, m.info.data_size);
    Status st = probe == 0 ? Status() : m.reader->read(m.info.layers.front().offset, probe, m.arena->base());
    if (!st.ok() && m.arena->kind() == MemoryKind::kManaged && (st.code() == EFAULT || st.code() == EOPNOTSUPP)) {
      log_once(LogLevel::kWarn, "cuda_registered",
               image + ": the block reader refused managed memory (" + st.message() +
                   "); blocks go to pinned host memory registered with CUDA (cudaHostRegister) instead");
      m.opt.memory = MemoryKind::kRegistered;
      m.arena.reset();
      m.arena = Arena::create(std::max<std::uint64_t>(p.arena_bytes, kImageAlign), m.opt.memory);
      st = m.reader->read(m.info.layers.front().offset, probe, m.arena->base());
    }
    if (!st.ok()) throw Error(st.message() + " (reading into " + to_string(m.arena->kind()) + " memory for the GPU)");
  }
  m.verified.assign(m.info.layers.size(), false);
  if (options.grid_step > 0 && options.planner == ExecutorOptions::Planner::kOptimal) {
    m.grid_reserve = planning_reserve(m.info, m.sk, options);
    PartitionOptions po;
    po.residency = options.residency;
    m.grid = std::make_unique<PartitionTable>(layer_costs(m.info, options), options.cost, options.grid_step, po);
  }
  adopt(m, std::move(p));
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

void adopt(Executor::Impl& m, ExecutionPlan p) {
  m.gpu_idle();
  if (m.arena) {
    m.arena->release(false);
    m.arena->release(true);
  }
  // Only host arenas drop pages past a smaller budget (Arena::set_budget); registered (pinned
  // whole) and managed memory need a smaller arena to give memory back.
  const std::uint64_t want = (std::max<std::uint64_t>(p.arena_bytes, kImageAlign) + 4095) / 4096 * 4096;
  const bool pinned_whole = m.arena && m.arena->kind() != MemoryKind::kHost && want < m.arena->capacity();
  if (!m.arena || p.arena_bytes > m.arena->capacity() || pinned_whole) {
    m.arena.reset();
    m.arena = Arena::create(std::max<std::uint64_t>(p.arena_bytes, kImageAlign), m.opt.memory);
  }
  m.arena->set_budget(p.arena_bytes);  // shrinking drops pages (all of them: nothing swapped)
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  m.resident_loaded = false;
  // Resident blocks: their own arena, laid out one after another; re-read when the plan changes.
  if (m.kept) m.kept->release(false);
  m.kept.reset();
  m.kept_at.assign(p.blocks.size(), 0);
  m.swapped.clear();
  std::uint64_t kept_bytes = 0;
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    if (p.resident[b]) {
      m.kept_at[b] = kept_bytes;
      kept_bytes += p.block_bytes[b];
    } else {
      m.swapped.push_back(static_cast<int>(b));
    }
  }
  m.kept_bytes = kept_bytes;
  if (kept_bytes > 0) {
    m.kept = Arena::create(kept_bytes, m.opt.memory);
    if (m.kept->place(false, kept_bytes) == nullptr) throw Error(m.path + ": internal: resident blocks do not fit");
  }
  // io_uring fixed buffers pin the pages they cover when registered: register exactly the
  // budget (not the reservation, which would pin the whole model), and again after every
  // change, since pages dropped by a shrink would otherwise stay pinned and stale.
  std::vector<std::pair<void*, std::size_t>> bufs;
  if (m.arena->budget() > 0) bufs.emplace_back(m.arena->base(), m.arena->budget());
  if (m.kept) bufs.emplace_back(m.kept->base(), kept_bytes);
  m.reader->register_buffers(bufs);
  m.plan = std::move(p);
  // Pinned slots: read once, each from its own layer's range, into one resident buffer.
  m.drop_pinned();
  pinned_bytes(m.info, m.sk, block_of_layer(m.info, m.plan.blocks), m.plan.resident, &m.pinned);
  if (!m.pinned.empty()) {
    std::uint64_t need = 0;
    std::vector<std::uint64_t> at;
    for (int s : m.pinned) {
      at.push_back(need);
      need += (m.info.tensors[s].nbytes + 63) / 64 * 64;
    }
    m.pinned_need = need;
    char* pinned_at = nullptr;  // CPU address of the pinned slots
    if (m.cuda) {
      m.pinned_gpu = Arena::create(need, m.opt.memory);
      pinned_at = static_cast<char*>(m.pinned_gpu->place(false, need));
    } else {
      m.pinned_buf = alloc_aligned(need);
      pinned_at = static_cast<char*>(m.pinned_buf);
    }
    std::uint64_t scratch_len = 0;
    for (int s : m.pinned) scratch_len = std::max(scratch_len, m.info.layers[m.info.tensors[s].layer].size);
    void* scratch = alloc_aligned(scratch_len);
    if (pinned_at == nullptr || scratch == nullptr) {
      free_aligned(scratch);
      throw Error(m.path + ": cannot allocate " + format_bytes(need) + " for shared weights");
    }
    for (size_t i = 0; i < m.pinned.size(); ++i) {
      const ImageTensor& t = m.info.tensors[m.pinned[i]];
      const ImageLayer& L = m.info.layers[t.layer];
      Status s = m.reader->read(L.offset, L.size, scratch, {{L.offset, L.size, L.checksum, "layer " +
                                                             std::to_string(t.layer) + " (" + L.name + ")"}});
      if (!s.ok()) {
        free_aligned(scratch);
        throw Error(s.message());
      }
      char* dst = pinned_at + at[i];
      std::memcpy(dst, static_cast<char*>(scratch) + (t.offset - L.offset), t.nbytes);
      const SlotInfo& sl = m.sk.slots()[m.pinned[i]];
      void* view = m.pinned_gpu ? m.dev(*m.pinned_gpu, dst) : dst;
      m.pinned_views.push_back(
          at::for_blob(view, sl.sizes)
              .strides(sl.strides)
              .options(at::TensorOptions().dtype(sl.dtype).device(m.device))
              .target_device(m.device)
              .make_tensor());
    }
    free_aligned(scratch);
    if (m.pinned_gpu && m.pinned_gpu->kind() == MemoryKind::kManaged) gpu_prefetch(pinned_at, need);
    m.rebind_pinned();
  }
  log(LogLevel::kInfo, m.path + ": " + std::to_string(m.plan.blocks.size()) + " blocks (" +
                           std::to_string(m.plan.blocks.size() - m.swapped.size()) + " resident, " +
                           format_bytes(m.plan.resident_bytes) + "), arena " + format_bytes(m.plan.arena_bytes) + " (" +
                           to_string(m.arena->kind()) + "), activations " + format_bytes(m.plan.activation_bytes) +
                           ", pinned " + format_bytes(m.plan.pinned_bytes));
  m.released = false;
}

// adopt() failing part-way (an allocation, a read of pinned slots) leaves the executor released:
// nothing half-built is used, and forward() says so until the next set_budget().
static void adopt_or_release(Executor::Impl& m, ExecutionPlan p) {
  try {
    adopt(m, std::move(p));
  } catch (...) {
    m.released = false;
    release_all(m);
    throw;
  }
}

void Executor::set_budget(std::uint64_t bytes) {
  ExecutorOptions o = impl_->opt;
  o.budget = bytes;
  o.partition.clear();
  o.blocks = 0;
  o.resident.clear();
  Impl& m = *impl_;
  if (m.grid && bytes > m.grid_reserve) {
    const Partition& part = m.grid->lookup(bytes - m.grid_reserve);
    if (part.feasible) {
      ExecutionPlan p = finish_plan(m.info, m.sk, part.blocks, part.resident, layer_costs(m.info, o), o.cost);
      if (p.total() <= bytes) {
        p.min_budget = m.plan.min_budget;
        m.opt = o;
        adopt_or_release(m, std::move(p));
        return;
      }
    }
  }
  ExecutionPlan p = plan_for(m.info, m.sk, o, m.path);  // throws if infeasible: nothing changes
  m.opt = o;
  adopt_or_release(m, std::move(p));
}

c10::IValue Executor::forward(std::vector<c10::IValue> inputs) {
  Impl& m = *impl_;
  if (m.released) throw Error(m.path + ": released (no memory held): set_budget() first");
  const size_t n = m.plan.blocks.size();
  BlockReader::Ticket pending = 0;
  // On any error: wait for the read in flight (it writes into the arena), release the swapped
  // blocks, unbind them, so the next forward starts clean (resident blocks stay loaded).
  auto cleanup = [&] {
    if (pending) m.reader->wait(pending);
    pending = 0;
    try {
      m.gpu_idle();
    } catch (const std::exception& e) {  // keep the first error; the GPU's is logged
      log(LogLevel::kError, m.path + ": waiting for the GPU after an error failed: " + e.what());
    }
    m.arena->release(false);
    m.arena->release(true);
    m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
    if (m.resident_loaded) m.bind_resident();
    m.rebind_pinned();
  };
  if (!m.resident_loaded) {
    try {
      m.load_resident();
    } catch (...) {
      m.resident_loaded = false;
      cleanup();
      throw;
    }
  }
  if (m.cuda) {
    for (auto& v : inputs) {
      if (v.isTensor() && v.toTensor().is_cpu()) v = v.toTensor().to(m.device);
    }
  }
  Skeleton::Run run = m.sk.begin(std::move(inputs));
  // Swapped blocks alternate between the arena's ends (Note [Two-ended arena]): the s-th swapped
  // block goes to end s % 2, so the next one is fetched while this one runs.
  size_t next_s = 0;  // the next swapped block to submit
  auto submit = [&]() -> void* {
    if (next_s >= m.swapped.size()) return nullptr;
    const size_t b = static_cast<size_t>(m.swapped[next_s]);
    // GPU: the kernels of the block there are done. The first block of an inference may also
    // overlap the previous inference's last block at the other end: wait for both then.
    m.wait_end(static_cast<int>(next_s % 2));
    if (next_s == 0) m.wait_end(1);
    void* p = m.arena->place(next_s % 2 == 1, m.plan.block_bytes[b]);
    if (p == nullptr) {
      throw Error(m.path + ": internal: block " + std::to_string(b) + " does not fit the arena next to its neighbour");
    }
    pending = m.reader->submit(m.offset(b), m.plan.block_bytes[b], p, m.checks_for(b));
    m.note_in_use();
    ++next_s;
    return p;
  };
  try {
    void* cur = submit();  // fetched during the resident blocks before it
    size_t s = 0;          // swapped blocks run so far
    for (size_t b = 0; b < n; ++b) {
      const auto [first, last] = m.plan.blocks[b];
      if (m.plan.resident[b]) {
        m.sk.run_layers(run, last + 1);
        continue;
      }
      Status st = m.reader->wait(pending);
      pending = 0;
      if (!st.ok()) throw Error(st.message() + " (block " + std::to_string(b) + " of " + std::to_string(n) + ")");
      m.mark_verified(b);
      if (m.cuda && m.arena->kind() == MemoryKind::kManaged) gpu_prefetch(cur, m.plan.block_bytes[b]);
      auto t0 = std::chrono::steady_clock::now();
      m.sk.bind_layers(first, last, m.dev(*m.arena, cur), m.offset(b), m.device);
      m.bind_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (int k = first; k <= last; ++k) m.bound += m.sk.layers()[k].slots.size();
      m.rebind_pinned();
      void* next = nullptr;
      if (!m.cuda) next = submit();  // CPU: the next block arrives while this one computes
      m.sk.run_layers(run, last + 1);
      if (m.cuda) {
        // GPU: the layers were queued, not run; the next block goes where the previous one was,
        // once the kernels reading it are done (submit waits), while this one's kernels run.
        m.record_end(static_cast<int>(s % 2));
        next = submit();
      }
      m.sk.unbind_layers(first, last);  // swap-out: drop the views, release the arena end
      m.rebind_pinned();
      m.arena->release(s % 2 == 1);
      ++s;
      cur = next;
    }
  } catch (...) {
    cleanup();
    throw;
  }
  return m.sk.finish(run);
}

const ExecutionPlan& Executor::plan() const { return impl_->plan; }
const ImageInfo& Executor::info() const { return impl_->info; }
const Skeleton& Executor::skeleton() const { return impl_->sk; }
std::uint64_t Executor::bytes_read() const { return impl_->reader->bytes_read(); }
double Executor::bind_us_per_tensor() const {
  return impl_->bound ? impl_->bind_seconds * 1e6 / static_cast<double>(impl_->bound) : 0.0;
}
IoBackend Executor::backend() const { return impl_->reader->backend(); }
MemoryKind Executor::memory() const { return impl_->arena ? impl_->arena->kind() : impl_->opt.memory; }

WeightMemory Executor::weight_memory() const {
  const Impl& m = *impl_;
  if (m.released || !m.arena) return WeightMemory{0, m.weight_peak};
  return WeightMemory{m.arena->budget() + m.kept_bytes + m.pinned_need, m.weight_peak};
}
void Executor::reset_weight_peak() {
  Impl& m = *impl_;
  m.weight_peak = 0;
  m.note_in_use();
}
bool Executor::released() const { return impl_->released; }

void Executor::release() { release_all(*impl_); }

void release_all(Executor::Impl& m) {
  if (m.released) return;
  try {
    m.gpu_idle();
  } catch (const std::exception& e) {
    log(LogLevel::kError, m.path + ": waiting for the GPU before releasing failed: " + e.what());
  }
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  m.reader->register_buffers({});  // unpin before freeing
  m.arena.reset();
  m.kept.reset();
  m.kept_bytes = 0;
  m.drop_pinned();
  m.resident_loaded = false;
  m.released = true;
  log(LogLevel::kInfo, m.path + ": released every byte held for weights");
}

std::vector<std::pair<std::uint64_t, double>> Executor::latency_curve() const {
  const Impl& m = *impl_;
  std::unique_ptr<PartitionTable> local;
  const PartitionTable* table = m.grid.get();
  std::uint64_t reserve = m.grid_reserve;
  if (table == nullptr) {
    reserve = planning_reserve(m.info, m.sk, m.opt);
    PartitionOptions po;
    po.residency = m.opt.residency;
    local = std::make_unique<PartitionTable>(layer_costs(m.info, m.opt), m.opt.cost, default_grid_step(m.info), po);
    table = local.get();
  }
  std::vector<std::pair<std::uint64_t, double>> curve;
  const std::uint64_t minimum = min_budget_for(m.info, m.sk);
  ExecutorOptions o = m.opt;
  o.budget = minimum;
  o.partition.clear();
  o.blocks = 0;
  o.resident.clear();
  curve.emplace_back(minimum, plan_for(m.info, m.sk, o, m.path).predicted_ms);
  for (std::size_t i = 0; i < table->size(); ++i) {
    const Partition& p = table->at(i);
    const std::uint64_t budget = table->grid()[i] + reserve;
    if (!p.feasible || budget <= curve.back().first) continue;
    curve.emplace_back(budget, std::min(p.predicted_ms, curve.back().second));
  }
  return curve;
}

}  // namespace swapnet
