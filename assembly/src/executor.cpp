// Swapped execution within a budget: plan blocks, read swapped blocks ahead into a ring while
// earlier ones run, bind by reference, release after use; inference resumable between layers.
// Also the CPU allocation meter used to account activations.
//
// Budget accounting (ExecutionPlan): budget = ring + resident + activations + pinned slots, where
//  - ring: the read-ahead ring of swapped blocks (Note [Read-ahead ring]; at least the largest
//    swapped block, deeper where the budget allows, on the CPU and the GPU; two-ended, at least
//    the largest pair of adjacent swapped blocks, with ReadAhead::kPaper and kTwoEnded);
//  - resident: blocks read once and kept across inferences;
//  - activations: the peak bytes forward allocated at the image's example input (measured by
//    the CPU meter when packing);
//  - pinned: slots read by a layer outside the block that owns them (shared weights); they are
//    read once at open and stay resident, so a released block never leaves a dangling view.
//
// The GPU: Note [Swapping onto the GPU] and Note [Device backends] in device_backend.cpp.
// The files: executor_impl.h says which holds what.
#include <ATen/Context.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "executor_impl.h"

namespace swapnet {

// Note [Read-ahead ring]
// ~~~~~~~~~~~~~~~~~~~~~~
// The reader walks the plan's blocks in order, cyclically, with a cursor: a swapped block is
// submitted as soon as it fits in the ring (BlockRing, Note [Block ring]) next to the blocks not
// yet executed; a resident block not yet read is submitted into its place in the resident arena
// (read once, in disk order, overlapping execution like any other block). After the last block
// the cursor wraps to the first block of the *next* inference and goes on until it reaches the
// block the current inference is executing (so the ring never holds two copies of a block, and
// the reader is never more than one inference ahead): in a closed loop the disk does not wait
// for an inference boundary, and between inferences it fills the ring for the next one. The
// compute side takes the submitted reads in the same order (`fetches`): waits for a block,
// binds it by reference, runs its layers, unbinds it and pops it from the ring, which lets the
// cursor submit more. Every budget is a promise: the ring, resident and pinned bytes are the
// plan's, whatever is in flight.
//
// Note [A ring of one block]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The ring must hold the largest swapped block, not a pair: where the next block does not fit
// next to the one executing, it streams into the bytes the blocks before it free (Note
// [Streaming into the ring] in ring.cpp; only what the executing block holds waits for it to
// end; before streaming the whole read waited). That costs time only at those blocks, and it buys memory: vgg19 at
// its minimum budget (517 MB: fc6 411 MB + fc7 67 MB + 39 MB of activations) could only swap
// everything with a pair-sized ring (575 MB read per inference); with a ring of fc7's size it
// keeps fc6 resident and reads 164 MB. The planner (partitioner's optimal_partition, kRing)
// and simulate_ms() price the serialised reads; the two-ended pipelines still need a pair.
//
// Note [Dynamic shapes] is in input_meter.cpp.
// Resumable inference: `run` holds the activations between layers; `cur` is the block being
// executed and `bound` says whether its weights are bound (a step interrupted inside a block).
// A budget change during an inference (set_budget between steps) cancels the reads in flight
// and waits for the pieces already issued (BlockReader::cancel), drops everything read ahead,
// frees the old ring and resident arena (their pages go back at once), adopts the new plan and
// puts the cursor at the next layer: the block of the new plan containing it is read from that
// layer on (a *trimmed* block; from the first layer owning a weight it reads, so shared weights
// inside the block come along), and the inference goes on. The reads dropped are the price of
// giving memory back within one layer.
//
// GPU: kernels run asynchronously, so a swapped block's ring space is popped (or given back in
// part, layer by layer) only once an event recorded behind its kernels has completed
// (DeviceBackend::reclaim, Note [Ring space behind the kernels]); the cursor waits for the
// oldest such event when the next block does not fit otherwise (Note [Swapping onto the GPU]).

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() = default;

// Note [One re-plan path]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Every change of the plan in force goes through replan(), with `m.mu` held, and says why: a
// budget move (set_budget, also mid-inference), the budget in force again after shed() (step),
// a new activation reserve (InputMeter's measuring, begun or ended), or costs learned (the
// CostLearner's decision, or a budget grid rebuilt with them). Components return what they
// found (a reserve, costs) and never plan themselves; the path from a budget to the ring is
// replan() -> planning (grid or search) -> adopt() -> the cursor.
static const char* replan_reason(Replan why) {
  switch (why) {
    case Replan::kBudget: return "budget";
    case Replan::kShed: return "after shedding";
    case Replan::kReserve: return "activation reserve";
    case Replan::kLearned: return "learned costs";
  }
  return "?";
}

namespace {

// The backend for the device the options name, configured; the options as it resolved them; the
// reader, open (and checked by the backend).
Opened open_device(const std::string& image, const ImageInfo& info, const ExecutorOptions& options) {
  Opened o;
  o.opt = options;
  {
    std::unique_ptr<DeviceBackend> backend = make_backend(image, options);
    backend->configure(image, &o.opt);  // may refuse: then the executor never held it
    o.backend = std::move(backend);
  }
  if (host_blocks(o.opt)) o.opt.memory = MemoryKind::kHost;
  if (o.opt.lend && o.backend->caps().meters_activations && info.version < kImageZoneReserveVersion &&
      info.activation_bytes >= (1u << 20)) {
    // Its activation figures are the bytes live alone; as a zone places them they may need more
    // (Note [Lending the activation reserve]), so the zone could not hold them within the budget.
    log(LogLevel::kWarn, image + ": packed in image format " + std::to_string(info.version) +
                             ", whose activation reserve counts the bytes live, not as a zone places them: it runs "
                             "without lending the reserve to blocks (slower where activations leave it idle); "
                             "re-pack it (swapnet pack) to lend it");
  }
  if (!learn_after_valid(options.learn_after)) {
    throw Error(image + ": learn_after " + std::to_string(options.learn_after) + " is not 0 (never) or 3.." +
                std::to_string(kMaxLearnAfter) + " inferences: a window's median needs 3 to set one disturbed "
                "inference aside");
  }
  ReaderOptions ro = options.reader;
  if (tracing()) {  // Note [Tracing]: a group of its own, shared with its reader
    o.tgroup = trace_group(image.substr(image.find_last_of('/') + 1));
    ro.trace_group = o.tgroup;
  }
  BlockReader::open(image, ro, &o.reader).throw_if_error();
  o.backend->check_reads(image, *o.reader, info, &o.opt);
  return o;
}

// Note [Dynamic shapes]: the input profiles the image holds (a legacy image's one shape).
std::vector<InputProfile> image_input_profiles(const ImageInfo& info) {
  std::vector<InputProfile> profiles = info.input_profiles;
  if (profiles.empty()) {
    std::vector<ImageInput> legacy = legacy_input_profile(info.input_shapes);
    if (!legacy.empty() || info.num_inputs == 0) profiles.push_back(InputProfile{info.activation_bytes, legacy});
  }
  return profiles;
}

}  // namespace

std::unique_ptr<Executor> Executor::open(const std::string& image, const ExecutorOptions& options) {
  ImageInfo info;
  read_image_info(image, &info).throw_if_error();
  Skeleton sk = Skeleton::from_image(info, image);
  Opened opened = open_device(image, info, options);
  auto impl = std::make_unique<Impl>(image, std::move(info), std::move(sk), std::move(opened));
  Impl& m = *impl;
  if (m.tgroup != 0) m.lender.set_trace_group(m.tgroup);
  // Note [Dynamic shapes]: the reserve holds the largest input measured.
  m.meter.set_profiles(image_input_profiles(m.info));
  m.planner.emplace(m.info, m.sk, m.opt, m.meter.largest(m.info.activation_bytes), image);
  m.learner.emplace(CostLearner::Config{options.learn_after, options.learn_window_ms, options.learn_threshold,
                                       options.measured_exec},
                    m.info.layers.size());
  load_learned(m);
  ExecutionPlan p = m.planner->first_plan();
  m.cursor = std::make_unique<BlockCursor>(
      image, m.info,
      // The paper's pipeline (for comparison) runs whole blocks, as the paper does.
      BlockCursor::Config{m.opt.verify, m.opt.stream, m.opt.read_past_streamed,
                          m.opt.layer_by_layer && options.read_ahead != ReadAhead::kPaper,
                          options.read_ahead != ReadAhead::kPaper},
      m.w, *m.reader, *m.backend, m.lender);
  m.cursor->set_trace_group(m.tgroup);
  m.learner->restart(CostLearner::io_count(*m.reader));
  m.planner->build_grid();
  adopt(m, std::move(p));
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

void adopt(Executor::Impl& m, ExecutionPlan p) {
  using Ms = std::chrono::duration<double, std::milli>;
  const auto t0 = std::chrono::steady_clock::now();
  m.drain();
  m.backend->idle(m.w.ring.get());
  const auto t_drained = std::chrono::steady_clock::now();
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  if (!m.reader->register_buffers({})) throw Error(m.path + ": internal: reads in flight after draining");  // unpin
  m.drop_ring();
  if (m.w.kept) m.w.kept->release(false);
  m.w.kept.reset();
  m.drop_pinned();
  const auto t_freed = std::chrono::steady_clock::now();
  // Note [Lending the activation reserve]: the activation reserve becomes the ring's zone.
  const std::uint64_t lend = p.arena_bytes > 0 && m.planner->lend() > 0 && !m.meter.measuring() && !m.lend_off &&
                                     p.read_ahead == ReadAhead::kRing && p.activation_bytes >= (1u << 20) &&
                                     detail::cpu_meter_active()
                                 ? p.activation_bytes
                                 : 0;
  m.w.make(p, m.opt.memory, lend, m.path);
  // io_uring fixed buffers pin (and map, zero-filling) the pages they cover when registered. The
  // ring is registered once the reader is idle (now between inferences; after a move during
  // one, at the next inference boundary the reader is idle at): a move is not made to wait for
  // the whole new ring to be zero-filled. Resident blocks are read once per plan: not registered.
  m.w.registered = false;
  if (!m.run) m.register_ring();
  const auto t_ring = std::chrono::steady_clock::now();
  m.w.plan = std::move(p);
  // Pinned slots: read once, each from its own layer's range, into one resident buffer.
  m.w.read_pinned(m.info, m.sk, *m.reader, *m.backend, m.opt.memory, m.path);
  log(LogLevel::kInfo, m.path + ": " + std::to_string(m.w.plan.blocks.size()) + " blocks (" +
                           std::to_string(std::count(m.w.plan.resident.begin(), m.w.plan.resident.end(), 1)) +
                           " resident, " + format_bytes(m.w.plan.resident_bytes) + "), ring " +
                           format_bytes(m.w.plan.arena_bytes) +
                           (m.w.ring ? std::string(" (") + to_string(m.w.ring->kind()) +
                                         (m.w.ring->deep() ? ", deep)" : ", two-ended)")
                                   : std::string()) +
                           ", activations " + format_bytes(m.w.plan.activation_bytes) + ", pinned " +
                           format_bytes(m.w.plan.pinned_bytes));
  const auto t_end = std::chrono::steady_clock::now();
  log(LogLevel::kDebug, m.path + ": plan adopted in " + std::to_string(Ms(t_end - t0).count()) + " ms (reads drained " +
                            std::to_string(Ms(t_drained - t0).count()) + ", memory freed " +
                            std::to_string(Ms(t_freed - t_drained).count()) + ", ring and resident arena " +
                            std::to_string(Ms(t_ring - t_freed).count()) + ", pinned slots " +
                            std::to_string(Ms(t_end - t_ring).count()) + ")");
  m.released = false;
  m.shed_pending = false;
  m.attach_zone();  // at once: the rest of an inference in progress places its activations there
  m.note_in_use();
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
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  const std::uint64_t before = impl_->released ? 0 : impl_->w.plan.total();
  replan(*impl_, Replan::kBudget, bytes);
  if (impl_->w.plan.total() < before) give_heap_back(impl_->path);
}

bool replan(Executor::Impl& m, Replan why, std::uint64_t bytes, double must_beat_ms, double* best_ms) {
  trace_instant(m.tgroup, TraceLane::kControl, "budget", -1, "bytes", static_cast<std::int64_t>(bytes));
  const auto t_plan = std::chrono::steady_clock::now();
  Planner& planner = *m.planner;
  if (m.meter.measuring()) {
    // Measuring a new input's activations (Note [Dynamic shapes]): weights stay at their least
    // and activations get the rest of the new budget, less than they hold already: refused.
    const std::uint64_t allowance = m.meter.allowance_at(bytes, planner.weights_min());
    const std::uint64_t before = planner.reserve();
    planner.set_reserve(allowance);
    InputMeter::Measurement ms = m.meter.suspend();  // plan as for any reserve
    try {
      (void)replan(m, why, bytes);
    } catch (...) {
      planner.set_reserve(before);
      m.meter.resume(std::move(ms), 0);
      throw;
    }
    m.meter.resume(std::move(ms), allowance);
    return true;
  }
  bool from_grid = false;
  ExecutionPlan next = planner.plan(bytes, &from_grid);  // throws if infeasible: nothing changes
  if (best_ms != nullptr) *best_ms = next.predicted_ms;
  if (must_beat_ms > 0 && !(next.predicted_ms < must_beat_ms)) return false;
  log(LogLevel::kDebug, m.path + ": planned " + format_bytes(bytes) + " in " +
                            std::to_string(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                                     t_plan).count()) +
                            " ms (" + (from_grid ? "budget grid" : "search") + ", " + replan_reason(why) + ")");
  planner.commit(bytes);
  const bool running = m.run != nullptr;
  const int k = running ? m.run->next_layer() : 0;
  m.bound = false;
  adopt_or_release(m, std::move(next));
  if (!running) {
    m.pump();  // the next inference's first blocks, now
    return true;
  }
  // Go on from layer k under the new plan (Note [Read-ahead ring]): the block containing it,
  // read from the first layer it needs.
  const int n = static_cast<int>(m.w.plan.blocks.size());
  m.cur = n;
  for (int b = 0; b < n; ++b) {
    if (m.w.plan.blocks[b].first <= k && k <= m.w.plan.blocks[b].second) {
      m.cur = b;
      break;
    }
  }
  int first = m.cur == n ? -1 : m.first_needed(m.cur, k);
  if (m.cur != n && first == m.w.plan.blocks[m.cur].first) first = -1;
  m.cursor->seek(m.cur == n ? 0 : m.cur, first, m.cur == n);
  m.bind_loaded();
  m.pump();
  return true;
}

// The activation reserve becomes `bytes`; re-plans at the budget in force (throws if it does not
// fit, the reserve restored).
static void set_reserve(Executor::Impl& m, std::uint64_t bytes) {
  const std::uint64_t before = m.planner->reserve();
  m.planner->set_reserve(bytes);
  try {
    replan(m, Replan::kReserve, m.planner->budget());
  } catch (...) {
    m.planner->set_reserve(before);
    throw;
  }
}

// Before an inference whose input no profile covers: weights planned at their least, activations
// allowed the rest of the budget, the allocator refusing past it (Note [Dynamic shapes]).
void start_measuring(Executor::Impl& m, std::vector<ImageInput> in, const std::vector<c10::IValue>& inputs) {
  InputMeter::Measurement ms =
      m.meter.prepare(std::move(in), inputs, !m.caps().meters_activations, m.planner->budget(),
                      m.planner->weights_min(), m.planner->reserve(), [&] { return m.inference_account(); });
  {
    // No zone while measuring: the allowance is all the budget leaves, past it the account refuses.
    m.lender.detach();
    m.lend_off = true;
    struct On {
      bool& b;
      ~On() { b = false; }
    } on{m.lend_off};
    set_reserve(m, ms.allowance);
  }
  m.meter.start(std::move(ms));
}

// After the measuring inference (between inferences): records the input's activations and plans
// with the larger reserve (`ok`), or restores the reserve before.
void end_measuring(Executor::Impl& m, bool ok) {
  if (!m.meter.measuring()) return;
  const std::uint64_t reserve = m.meter.end(ok && !m.released);
  if (m.released) {  // nothing to re-plan: the next set_budget() plans with the reserve before
    m.planner->set_reserve(reserve);
    return;
  }
  try {
    set_reserve(m, reserve);
  } catch (const std::exception& e) {
    // Cannot happen (the measurement stayed within the budget); if it does, keep the measuring
    // plan, which fits.
    log(LogLevel::kError, m.path + ": re-planning after measuring activations failed: " + e.what());
  }
}

std::uint64_t Executor::remeasured() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->meter.remeasured();
}

std::vector<InputProfile> Executor::input_profiles() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->meter.profiles();
}


Executor::Learning Executor::learning() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->learner->stats();
}

CostModel Executor::cost() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->planner->cost();
}

std::vector<std::pair<std::uint64_t, double>> Executor::latency_curve() const {
  return impl_->planner->latency_curve();
}


}  // namespace swapnet
