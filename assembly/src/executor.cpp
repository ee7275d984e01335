// Swapped execution within a budget: plan blocks, read swapped blocks ahead into a ring while
// earlier ones run, bind by reference, release after use; inference resumable between layers.
// Also the CPU allocation meter used to account activations.
//
// Budget accounting (ExecutionPlan): budget = ring + resident + activations + pinned slots, where
//  - ring: the read-ahead ring of swapped blocks (Note [Read-ahead ring]; at least the largest
//    swapped block, deeper where the budget allows; two-ended, at least the largest pair of
//    adjacent swapped blocks, on the GPU and with ReadAhead::kPaper);
//  - resident: blocks read once and kept across inferences;
//  - activations: the peak bytes forward allocated at the image's example input (measured by
//    the CPU meter when packing);
//  - pinned: slots read by a layer outside the block that owns them (shared weights); they are
//    read once at open and stay resident, so a released block never leaves a dangling view.
//
// The GPU: Note [Swapping onto the GPU] and Note [Device backends] in device_backend.cpp.
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>

#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <initializer_list>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cmath>
#include <deque>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "cost_learner.h"
#include "cpu_meter.h"
#include "device_backend.h"
#include "input_meter.h"
#include "planner.h"
#include "planning.h"
#include "read_ahead.h"
#include "weights.h"
#include "zone_lender.h"
#include "swapnet/assembly.h"

namespace swapnet {
using detail::AccountScope;
using detail::cpu_account_refused;
using detail::set_cpu_account_limit;

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
// GPU: kernels run asynchronously, so a swapped block's ring space is popped only once an event
// recorded behind its kernels has completed (`gpu_pending`); the cursor waits for the oldest such
// event when the next block does not fit otherwise. The ring there is two-ended (two blocks).
// What open() settles before the executor exists (open_device): the backend, configured (it may
// refuse, and then the executor never held it), the options as it resolved them, the reader.
struct Opened {
  std::unique_ptr<DeviceBackend> backend;
  ExecutorOptions opt;
  std::unique_ptr<BlockReader> reader;
  std::uint32_t tgroup = 0;  // Note [Tracing]
};

struct Executor::Impl {
  const std::string path;
  const ImageInfo info;     // the image's table as read (planning's view of it: planner->view())
  Skeleton sk;
  const ExecutorOptions opt;  // resolved once, at open; the budget and costs in force are the planner's
  std::unique_ptr<BlockReader> reader;
  Weights w;  // the weights in memory for the plan in force (w.plan)
  // The budget, activation reserve and costs plans are made with, the budget grid, the plans.
  std::optional<Planner> planner;
  // What the pipeline counted (Executor::pipeline_stats, bind_us_per_tensor).
  struct Counters {
    double bind_seconds = 0;               // spent in bind_layers (assembly by reference)
    std::uint64_t bound_tensors = 0;       // tensors bound by it
    std::uint64_t layers_started_early = 0;  // layers run before the rest of their block landed
    std::uint64_t released_early = 0;      // ring bytes given back before their block ended
    std::uint64_t read_at_layer_end = 0;   // fetches pushed by the pump after a layer (lending)
    std::int64_t inferences = 0;           // finished
  } counters;
  bool released = false;        // Executor::release(): nothing held until the next set_budget
  // Held by the thread using the executor except while a layer runs, so that shed() (any
  // thread) finds the state between two changes (Note [Shedding]).
  mutable std::recursive_mutex mu;
  int running_layer = -1;         // the layer running now, unlocked (-1: none)
  bool shed_pending = false;      // shed() gave memory back: re-plan before the next layer
  std::uint64_t shed_held = 0;    // what is held since (the running layer's weights, pinned slots)

  // Note [Dynamic shapes] (input_meter.cpp): the inputs the activation reserve
  // (info.activation_bytes) was measured for, and the inference measuring a new one.
  InputMeter meter;
  int own_account = 0;            // CPU meter account when the thread has none (measuring, lending)
  // The account an inference's activations are charged to: the thread's (a Runtime model's), else
  // the executor's own.
  int inference_account() {
    int account = detail::thread_cpu_account();
    if (account == 0) {
      if (own_account == 0) own_account = new_cpu_account();
      account = own_account;
    }
    return account;
  }

  // Note [Tracing] (swapcore's trace.cpp): this executor's group in a trace, and when the
  // inference in progress began.
  std::uint32_t tgroup = 0;
  TraceClock::time_point inference_t0;

  // The inference in progress.
  std::unique_ptr<Skeleton::Run> run;
  int cur = 0;         // block executing (or next to execute)
  bool bound = false;  // cur's weights are bound (a step stopped inside it)
  // Note [Lending the activation reserve] (zone_lender.cpp).
  ZoneLender lender;
  bool lend_off = false;  // planning the measuring inference (Note [Dynamic shapes])
  // Note [Learning the costs in service] (cost_learner.cpp): what each inference cost.
  std::optional<CostLearner> learner;
  bool fixed_plan = false;  // ExecutorOptions::partition / blocks at open: not learned
  std::atomic<bool> yield{false};

  // Where layers run (Note [Device backends]): the host until open() says otherwise.
  std::unique_ptr<DeviceBackend> backend;
  const DeviceBackend::Caps& caps() const { return backend->caps(); }
  // Reads the weights ahead (Note [Read-ahead ring]); declared after what it refers to (the
  // weights, the reader, the backend, the lender), so it goes first.
  std::unique_ptr<BlockCursor> cursor;

  std::uint64_t offset(int layer) const { return info.layers[layer].offset; }
  std::uint64_t span(int first, int last) const { return layers_span(info, first, last); }
  // Makes the ring's zone the region of the lender's account (Note [Lending the activation
  // reserve] in zone_lender.cpp).
  void attach_zone() { lender.attach(w.ring.get(), meter.measuring(), run ? run->next_layer() : 0); }
  // The ring goes (a new plan, or release): the zone's holes and the ring's pages go back now;
  // activations of the inference in progress may live in the zone, and its live chunks keep
  // their pages until the last is freed.
  void drop_ring() {
    lender.drop(w.ring.get());
    w.ring.reset();
  }
  // The first layer a read of block b from layer k must start at: the lowest layer in the block
  // that owns a weight read by layers k.. of it (weights shared within a block are not pinned).
  int first_needed(int b, int k) const {
    const auto [first, last] = w.plan.blocks[b];
    int f = k;
    for (int l = k; l <= last; ++l) {
      for (int s : sk.layers()[l].used_slots) {
        const int owner = sk.slots()[s].layer;
        if (owner >= first && owner < f) f = owner;
      }
    }
    return f;
  }

  // Registers the ring with the reader (Note above adopt) if it is not, and the reader is idle.
  void register_ring() {
    if (w.registered || !w.ring || shed_pending) return;  // registering maps (zero-fills) every page
    if (w.ring->kind() == MemoryKind::kManaged) {
      w.registered = true;  // io_uring cannot pin CUDA managed memory (EFAULT on the H100): unregistered reads
      return;
    }
    w.registered = reader->register_buffers({{w.ring->kept_begin(), w.ring->kept() + w.ring->capacity()}});
  }

  Impl(std::string p, ImageInfo i, Skeleton s, Opened o)
      : path(std::move(p)),
        info(std::move(i)),
        sk(std::move(s)),
        opt(std::move(o.opt)),
        reader(std::move(o.reader)),
        meter(path),
        tgroup(o.tgroup),
        lender(path, info.layers.size()),
        backend(std::move(o.backend)) {}
  ~Impl() {
    try {
      drain();
      backend->idle(w.ring.get());
    } catch (...) {  // a failing GPU at teardown: nothing left to protect
    }
    run.reset();  // its activations go back to their account first
    lender.detach();
    w.ring.reset();
    if (own_account != 0) detail::release_cpu_account(own_account);  // when nothing is charged to it
    free_aligned(w.pinned_buf);
  }

  void drop_pinned() { w.drop_pinned(); }
  void rebind_pinned() { w.rebind_pinned(sk); }
  void bind_range(int first, int last, char* at) {
    auto t0 = std::chrono::steady_clock::now();
    sk.bind_layers(first, last, at, offset(first), backend->device());
    counters.bind_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int k = first; k <= last; ++k) counters.bound_tensors += sk.layers()[k].slots.size();
  }
  // Binds every resident block read whole.
  void bind_loaded() {
    for (size_t b = 0; b < w.plan.blocks.size(); ++b) {
      if (w.plan.resident[b] && w.kept_state[b] == Weights::Kept::kLoaded) {
        char* at = w.plan.block_bytes[b] > 0 ? backend->address(*w.kept, w.kept->base() + w.kept_at[b]) : zero_page();
        sk.bind_layers(w.plan.blocks[b].first, w.plan.blocks[b].second, at, offset(w.plan.blocks[b].first), backend->device());
      }
    }
    rebind_pinned();
  }

  // The cursor's view of where the inference is.
  BlockCursor::Position pos() const { return {cur, run ? run->next_layer() : -1, released || shed_pending}; }
  // Submits every read the ring (and the cursor's limits) allow now (Note [Read-ahead ring]).
  void pump(bool may_wait = false) { cursor->pump(pos(), may_wait); }
  void drain() {
    if (cursor) cursor->drain();
  }
  void note_in_use() { cursor->note_in_use(); }
};

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() = default;

// Makes `p` the plan in force: a ring and resident arena of its sizes (the old ones are freed
// first: nothing may be in flight), and the slots this partition must keep resident read. The
// cursor starts at block 0; resident blocks are read on the way.
void adopt(Executor::Impl& m, ExecutionPlan p);
// Frees every byte held for weights (Executor::release).
void release_all(Executor::Impl& m);
void give_heap_back(const std::string& path);

namespace {
// `v` with every tensor whose storage lies in [lo, hi) replaced by a copy (`copied` counts the
// bytes); containers are rebuilt only where something was copied.
c10::IValue evict_from(const c10::IValue& v, const char* lo, const char* hi, std::uint64_t* copied) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.has_storage()) return v;
    const char* p = static_cast<const char*>(t.storage().data());
    if (p == nullptr || p < lo || p >= hi) return v;
    *copied += t.nbytes();
    return t.clone();
  }
  if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    std::vector<c10::IValue> out;
    bool changed = false;
    for (const auto& e : elems) {
      out.push_back(evict_from(e, lo, hi, copied));
      changed = changed || !out.back().isSameIdentity(e);
    }
    if (!changed) return v;
    return c10::ivalue::Tuple::createNamed(std::move(out), c10::TypePtr(v.toTupleRef().type()));  // named stays named
  }
  if (v.isList()) {
    c10::List<c10::IValue> l = v.toList();
    c10::impl::GenericList out(l.elementType());
    bool changed = false;
    for (size_t i = 0; i < l.size(); ++i) {
      const c10::IValue e = l.get(i);
      out.push_back(evict_from(e, lo, hi, copied));
      changed = changed || !out.get(i).isSameIdentity(e);
    }
    return changed ? c10::IValue(out) : v;
  }
  if (v.isGenericDict()) {
    c10::impl::GenericDict d = v.toGenericDict();
    c10::impl::GenericDict out(d.keyType(), d.valueType());
    bool changed = false;
    for (const auto& e : d) {
      c10::IValue nv = evict_from(e.value(), lo, hi, copied);
      changed = changed || !nv.isSameIdentity(e.value());
      out.insert(e.key(), std::move(nv));
    }
    return changed ? c10::IValue(out) : v;
  }
  return v;
}
}  // namespace
// Note [One re-plan path]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Every change of the plan in force goes through replan(), with `m.mu` held, and says why: a
// budget move (set_budget, also mid-inference), the budget in force again after shed() (step),
// a new activation reserve (InputMeter's measuring, begun or ended), or costs learned (the
// CostLearner's decision, or a budget grid rebuilt with them). Components return what they
// found (a reserve, costs) and never plan themselves; the path from a budget to the ring is
// replan() -> planning (grid or search) -> adopt() -> the cursor.
enum class Replan { kBudget, kShed, kReserve, kLearned };
const char* replan_reason(Replan why) {
  switch (why) {
    case Replan::kBudget: return "budget";
    case Replan::kShed: return "after shedding";
    case Replan::kReserve: return "activation reserve";
    case Replan::kLearned: return "learned costs";
  }
  return "?";
}
// Plans for `bytes` and puts the plan in force. With `must_beat_ms` > 0, only a plan predicted
// under that is put in force (Note [A re-plan must gain]); false when it was not. (While a new
// input's activations are measured it is ignored: learning never re-plans then.)
bool replan(Executor::Impl& m, Replan why, std::uint64_t bytes, double must_beat_ms = 0, double* best_ms = nullptr);
void learn_costs(Executor::Impl& m, bool whole);
void load_learned(Executor::Impl& m);
void store_learned(Executor::Impl& m);

namespace {

// The backend for the device the options name, configured; the options as it resolved them; the
// reader, open (and checked by the backend).
Opened open_device(const std::string& image, const ImageInfo& info, const ExecutorOptions& options) {
  Opened o;
  o.opt = options;
  {
    std::unique_ptr<DeviceBackend> backend =
        options.device == ExecutorOptions::Device::kCUDA ? make_cuda_backend(image) : make_host_backend();
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
  m.fixed_plan = !options.partition.empty() || options.blocks > 0;
  m.learner.emplace(CostLearner::Config{options.learn_after, options.learn_window_ms, options.learn_threshold,
                                       options.measured_exec},
                    m.info.layers.size());
  load_learned(m);
  ExecutionPlan p = m.planner->first_plan();
  m.cursor = std::make_unique<BlockCursor>(
      image, m.info,
      BlockCursor::Config{m.opt.verify, m.opt.stream, m.opt.read_past_streamed, m.opt.layer_by_layer,
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

// Note [Giving the C heap back]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// libtorch mallocs and frees activations at every layer, and glibc keeps freed memory for reuse
// (once a large chunk has been freed it also raises its mmap threshold, so later large chunks
// come from the heap and stay there). In bench/soak.sh that was 300-400 MB of RSS the process
// did not use (mallinfo2's free bytes; live heap flat at ~100 MB), growing as the budget cycled:
// RSS the budget does not have. After a change that shrinks the budget, and on release, the
// executor asks glibc to give the free pages of every arena back (malloc_trim(0); what it keeps
// is reused as before, and the settings of the host process are not touched).
void give_heap_back(const std::string& path) {
#if defined(__GLIBC__)
  const auto t0 = std::chrono::steady_clock::now();
  malloc_trim(0);
  log(LogLevel::kDebug, path + ": C heap trimmed in " +
                            std::to_string(std::chrono::duration<double, std::milli>(
                                               std::chrono::steady_clock::now() - t0).count()) + " ms");
#else
  (void)path;
#endif
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

namespace {

// The activation reserve becomes `bytes`; re-plans at the budget in force (throws if it does not
// fit, the reserve restored).
void set_reserve(Executor::Impl& m, std::uint64_t bytes) {
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

}  // namespace

std::uint64_t Executor::remeasured() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->meter.remeasured();
}

std::vector<InputProfile> Executor::input_profiles() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->meter.profiles();
}

// Note [A re-plan must gain]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A window whose costs are off re-planned with them, and put in force whatever plan was best
// with them, however close the plan in force came. Another plan is not free: its resident
// blocks are read again, its ring laid out again, and its prediction rests on costs one window
// measured. Under the 400 MB/s throttle, fcn_resnet101 at 73 MB with the profile measured there
// learned the disk at 336 MB/s in its first window (the plan's 451 ms became 568 ms with that
// rate) and re-planned to 45 blocks from 39 for a plan predicted 565 ms: 0.5 % faster, and
// measured 1-2 % slower than the plan it replaced in three interleaved rounds. So the costs are
// taken (the next plan and the learned-costs store use them) but the plan in force stays unless
// the best plan with them is predicted faster by more than kReplanGain; Learning::kept_plans
// counts the windows where it stayed. Not by the window's noise as well: both plans are
// predicted with the same costs, so their difference is not that noise, and it is usually the
// model's underestimate. resnet101 at 60 MB with a host-speed profile under the same throttle
// learned 402 MB/s with 11 % noise, and its best plan was predicted 6.2 % faster than the plan in
// force; it measured 20 % faster (392 -> 314 ms). With a budget grid (a Runtime's executors) the
// same rule decides once the grid rebuilt with the costs is ready: its plan at the budget in force
// against the plan in force. Either way the Runtime splits its budget again with the new curve
// (Note [Splitting with learned costs] in runtime.cpp); a model whose budget that split leaves
// as it was keeps its plan. In serve --learn 3 with resnet18 and mobilenet_v2 (70 % of their
// bytes, 8 s, 7 interleaved rounds), mobilenet_v2 put 19 learned plans in force before and 0
// after (17 kept); requests served moved within the VM's noise (medians of same-round ratios
// 1.047 and 1.038; bench/results/learn_serve_grid_margin.jsonl).
constexpr double kReplanGain = 0.02;

namespace {

bool learns(const Executor::Impl& m) {
  return m.opt.learn_after > 0 && m.caps().learns && !m.fixed_plan && m.opt.planner == ExecutorOptions::Planner::kOptimal;
}

}  // namespace

// Note [Learned costs kept] (cost_learner.cpp): at open, the costs learned before.
void load_learned(Executor::Impl& m) {
  if (!learns(m)) return;
  std::optional<LearnedCosts> got = load_learned_costs(m.opt.learn_store, m.path, m.info, m.opt.measured_exec);
  if (!got) return;
  CostLearner& l = *m.learner;
  if (got->layer_ms) {
    m.planner->set_layer_ms(*got->layer_ms);
    l.stats().loaded_times = l.times_learned = true;
  }
  if (got->read_mb_s > 0) {
    CostModel k = m.planner->cost();
    k.alpha_ms_per_byte = 1e3 / (got->read_mb_s * 1e6);
    m.planner->set_cost(k);
    l.stats().loaded_rate = l.rate_learned = true;
  }
}

// The costs in force, where ExecutorOptions::learn_store says.
void store_learned(Executor::Impl& m) {
  const std::string& path = m.opt.learn_store;
  if (path.empty()) return;
  CostLearner& l = *m.learner;
  const std::vector<double> t = m.planner->layer_ms();
  const double alpha = m.planner->cost().alpha_ms_per_byte;
  const double mb_s = l.rate_learned && alpha > 0 ? 1e-3 / alpha : 0.0;
  if (store_learned_costs(path, m.path, m.info, l.times_learned ? &t : nullptr, mb_s)) ++l.stats().stored;
}

namespace {

std::string percent_gain() { return std::to_string(static_cast<long long>(std::lround(100 * kReplanGain))); }

// Note [A re-plan must gain]: the plan in force, predicted with the costs in force, against the
// best plan with them at the budget in force; the best is put in force only where it is faster
// by more than kReplanGain.
struct Gain {
  bool adopted = false;
  double in_force = 0;  // the plan in force, predicted with the costs in force
  double best = 0;      // the best plan with them
  std::string failed;   // a re-plan that failed (the plan stays)
};
Gain replan_if_it_gains(Executor::Impl& m) {
  Gain g;
  g.in_force = m.w.plan.predicted_ms;
  try {
    g.in_force = m.planner->predict(m.w.plan);
    g.adopted = replan(m, Replan::kLearned, m.planner->budget(), g.in_force * (1 - kReplanGain), &g.best);
  } catch (const std::exception& e) {
    g.failed = e.what();
  }
  return g;
}

// A budget grid rebuilt for learned costs that is ready now is taken, and its plan at the budget in
// force put in force where it gains (Note [A re-plan must gain]); whether one was taken.
bool take_rebuilt_grid(Executor::Impl& m) {
  std::string error;
  if (!m.planner->take_rebuilt_grid(&error)) return false;
  if (!error.empty()) {
    log(LogLevel::kWarn, m.path + ": rebuilding the budget grid for learned costs failed (" + error +
                             "): plans search instead");
  }
  if (m.released) return true;
  // Note [A re-plan must gain], with the grid as without: the grid's plan at this budget is put
  // in force only if predicted faster than the plan in force, with the same (learned) costs, by
  // more than kReplanGain. Either way the Runtime sees the costs were taken (adopted or
  // kept_plans) and splits its budget again with the new grid's curve. A re-plan that fails
  // keeps the plan too, and counts as kept: the costs are taken and the grid is new, so the
  // Runtime's curve must follow them all the same.
  const Gain g = replan_if_it_gains(m);
  Executor::Learning& l = m.learner->stats();
  if (g.adopted) {
    l.predicted_before_ms = m.planner->rebuilt_from_ms();
    l.predicted_after_ms = m.w.plan.predicted_ms;
    ++l.adopted;
    return true;
  }
  m.w.plan.predicted_ms = g.in_force;
  ++l.kept_plans;
  if (!g.failed.empty()) {
    log(LogLevel::kWarn, m.path + ": re-planning with learned costs failed, the plan stays: " + g.failed);
  } else {
    log(LogLevel::kInfo, m.path + ": the budget grid rebuilt with learned costs is in use; the plan stays, predicted " +
                             std::to_string(g.in_force) + " ms with them; the grid's plan at this budget " +
                             std::to_string(g.best) + " ms is not more than " + percent_gain() + " % faster");
  }
  return true;
}

// With a budget grid, learned costs are planned with once the grid is rebuilt with them, off this
// thread; the plan in force runs until then. False where no thread could start (the grid is
// dropped: budget changes search from now on).
bool rebuild_grid_for_learned(Executor::Impl& m, double before, const std::string& what) {
  try {
    m.planner->rebuild_grid(before);
  } catch (const std::exception& e) {
    log(LogLevel::kWarn, m.path + ": no thread to rebuild the budget grid (" + e.what() +
                             "): budget changes search for their plan from now on");
    m.planner->drop_grid();
    return false;
  }
  log(LogLevel::kInfo, m.path + ": over " + std::to_string(m.learner->stats().window) + " inferences, " + what +
                           ": the budget grid is rebuilt with them, and the plan follows once it is");
  return true;
}

// Takes the costs the CostLearner decided on: planning uses them from now on (the grid rebuilt
// with them, or a re-plan at the budget in force that must gain, Note [A re-plan must gain]).
void take_learned(Executor::Impl& m, CostLearner::Decision d) {
  using Ms = std::chrono::duration<double, std::milli>;
  Planner& planner = *m.planner;
  CostLearner& learner = *m.learner;
  Executor::Learning& l = learner.stats();
  const double before = m.w.plan.predicted_ms;
  const std::vector<double> times_before = planner.layer_ms();
  const CostModel cost_before = planner.cost();
  if (d.take_times) planner.set_layer_ms(d.layer_ms);
  if (d.take_reads) planner.set_cost(d.cost);
  // The costs stay taken (Note [Learned costs kept]): written where they are kept only then, not
  // when the re-plan below fails and puts the old ones back.
  auto keep = [&] {
    learner.times_learned = learner.times_learned || d.take_times;
    learner.rate_learned = learner.rate_learned || d.take_reads;
    store_learned(m);
  };
  const auto t0 = std::chrono::steady_clock::now();
  if ((planner.has_grid() && rebuild_grid_for_learned(m, before, d.what)) || m.released) {
    keep();  // released: the next set_budget() plans with them
    return;
  }
  // Note [A re-plan must gain] (also for an executor whose grid could not be rebuilt above: its
  // Runtime splits again on a kept plan too).
  const Gain g = replan_if_it_gains(m);
  if (!g.failed.empty()) {
    // Cannot happen (the minimum budget does not depend on times); if it does, keep the plan
    // and the costs it was made with.
    planner.set_layer_ms(times_before);
    planner.set_cost(cost_before);
    log(LogLevel::kError, m.path + ": re-planning with learned costs failed, the plan stays: " + g.failed);
    return;
  }
  keep();
  const std::string over = m.path + ": over " + std::to_string(l.window) + " inferences, " + d.what;
  if (!g.adopted) {
    m.w.plan.predicted_ms = g.in_force;
    ++l.kept_plans;
    log(LogLevel::kInfo, over + ": the plan stays, predicted " + std::to_string(g.in_force) +
                             " ms with them; the best plan with them " + std::to_string(g.best) +
                             " ms is not more than " + percent_gain() + " % faster");
    return;
  }
  l.predicted_before_ms = before;
  l.predicted_after_ms = m.w.plan.predicted_ms;
  ++l.adopted;
  log(LogLevel::kInfo, over + ": re-planned in " + std::to_string(Ms(std::chrono::steady_clock::now() - t0).count()) +
                           " ms, predicted " + std::to_string(before) + " -> " + std::to_string(m.w.plan.predicted_ms) +
                           " ms, " + std::to_string(m.w.plan.blocks.size()) + " blocks");
}

}  // namespace

// After an inference: a rebuilt grid taken, the inference shown to the CostLearner, and the
// costs it decides on taken (Note [Learning the costs in service] in cost_learner.cpp).
void learn_costs(Executor::Impl& m, bool whole) {
  const bool adopted_now = take_rebuilt_grid(m);
  if (!learns(m)) return;
  CostLearner& learner = *m.learner;
  if (!learner.timed(whole)) return;
  const CostLearner::IoCount now = CostLearner::io_count(*m.reader);
  if (m.planner->rebuilding() || adopted_now) {  // a new window begins with the new plan
    learner.restart(now);
    return;
  }
  const Planner& planner = *m.planner;
  auto predict = [&](const std::vector<LayerCost>& c, const CostModel& k) { return planner.predict(m.w.plan, c, k); };
  std::optional<CostLearner::Decision> d =
      learner.observe(now, planner.layer_ms(), planner.layer_costs(), planner.cost(), predict);
  if (d) take_learned(m, std::move(*d));
}

Executor::Learning Executor::learning() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->learner->stats();
}

CostModel Executor::cost() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->planner->cost();
}

void Executor::begin(std::vector<c10::IValue> inputs) {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  // Shed (shed_pending): the first step() re-plans, or returns at once for the move a cut's
  // interrupt asks for; re-planning here would read back at the old budget first.
  if (m.released) throw Error(m.path + ": released (no memory held): set_budget() first");
  if (m.run) throw Error(m.path + ": an inference is already in progress (finish() or abort() it first)");
  m.reader->check_file().throw_if_error();  // Note [The image changing on disk] (reader.cpp)
  {
    std::vector<ImageInput> in = describe_inputs(inputs);
    if (!m.meter.covers(in)) start_measuring(m, std::move(in), inputs);
  }
  m.backend->place_inputs(&inputs);
  std::uint64_t inputs_outside = 0;
  for (const auto& v : inputs) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu()) inputs_outside += v.toTensor().nbytes();
  }
  m.lender.set_inputs_outside(inputs_outside);
  try {
    m.run = std::make_unique<Skeleton::Run>(m.sk.begin(std::move(inputs)));
  } catch (...) {
    end_measuring(m, false);
    throw;
  }
  m.cur = 0;
  m.bound = false;
  m.cursor->done_executing();
  m.learner->begin();
  m.inference_t0 = TraceClock::now();
  m.cursor->new_inference();  // Note [Tracing]: the first stop of every inference is traced
  if (m.w.ring && m.w.ring->lend() > 0 && !m.meter.measuring()) {
    // Note [Lending the activation reserve]: this thread's account (a Runtime model's), else the
    // executor's own, places the inference's activations in the ring's zone.
    m.lender.begin(m.inference_account(), m.w.ring.get());
  }
  m.pump();
}

namespace {

std::string block_of(int b, int n) { return " (block " + std::to_string(b) + " of " + std::to_string(n) + ")"; }

// Binds block b where its bytes landed: waits for its fetch (whole, or its first layer's pieces:
// Note [Layer by layer]) unless it is resident and loaded, then reads on while it computes.
void bind_block(Executor::Impl& m, int b) {
  const auto [first, last] = m.w.plan.blocks[b];
  m.cursor->done_executing();
  if (m.w.plan.resident[b] && m.w.kept_state[b] == Weights::Kept::kLoaded) return;
  const Fetch& f = m.cursor->take(b, m.pos());
  char* at = f.bytes == 0 ? f.at
             : f.resident ? m.backend->address(*m.w.kept, f.at)
                          : m.backend->address(*m.w.ring, f.at);
  m.bind_range(f.first, last, at);
  if (f.resident && f.first == first) m.w.kept_state[b] = Weights::Kept::kLoaded;
  m.rebind_pinned();
  if (!m.caps().async) m.pump();  // the CPU computes now: queue what fits before it does
}

// Runs the next layer of block b, read as `cf` (its layers run as its pieces land where
// `pieces`), with `lk` released while it runs: shed() may give back what it does not read
// meanwhile. Then gives the ring back what the rest of the block no longer reads and reads on.
// False where the rest of the block was shed: no further layer before a re-plan.
bool run_next_layer(Executor::Impl& m, std::unique_lock<std::recursive_mutex>& lk, int b, const Fetch* cf,
                    bool pieces) {
  const int last = m.w.plan.blocks[b].second;
  if (pieces && m.cursor->pieces_left()) {
    // Note [Layer by layer]: this layer's bytes (and those before it in the block).
    Status st = m.cursor->wait_layer(m.run->next_layer());
    if (!st.ok()) throw Error(st.message() + block_of(b, static_cast<int>(m.w.plan.blocks.size())));
    if (m.cursor->pieces_left()) ++m.counters.layers_started_early;
  }
  m.running_layer = m.run->next_layer();
  m.lender.sync(m.running_layer);  // its activations go where they went before
  lk.unlock();
  const auto layer_t0 = TraceClock::now();
  try {
    m.sk.run_layer(*m.run);
  } catch (...) {
    lk.lock();
    m.running_layer = -1;
    throw;
  }
  const auto layer_t1 = TraceClock::now();
  if (tracing()) trace_span(m.tgroup, TraceLane::kCompute, "layer", m.running_layer, layer_t0, layer_t1, "block", b);
  lk.lock();
  m.learner->time_layer(m.running_layer, std::chrono::duration<double, std::milli>(layer_t1 - layer_t0).count());
  m.meter.note_reach();
  m.lender.measure(m.running_layer);
  m.running_layer = -1;
  if (m.shed_pending && m.run->next_layer() <= last) return false;
  std::uint64_t n_back = 0;
  if (pieces && m.run->next_layer() <= last) {
    // Note [Layer by layer]: the bytes before the lowest layer the rest still reads are dead.
    const int need = m.first_needed(b, m.run->next_layer());
    if (need > cf->first) {
      n_back = m.w.ring->release_front_until(cf->at + (m.offset(need) - m.offset(cf->first)));
      m.counters.released_early += n_back;
    }
  }
  // Reads on: a block streaming over the bytes given back; and, lending, a block whose limit
  // the layer that ended was the last in the way of (the zone its activations needed is free
  // now), also inside a resident block or one read whole (Note [Lending the activation
  // reserve]).
  const bool lending = m.lender.lends() && m.caps().meters_activations && m.run->next_layer() <= last;
  if (n_back > 0 || lending) {
    const std::uint64_t pushed = m.cursor->fetches_pushed();
    m.pump();
    if (lending) m.counters.read_at_layer_end += m.cursor->fetches_pushed() - pushed;
  }
  return true;
}

// Swap-out after block b ran: its views dropped, its ring space released (GPU: once its kernels
// are done); a resident block read trimmed is unbound, to be read whole next time.
void swap_out(Executor::Impl& m, int b, const Fetch* cf) {
  const int last = m.w.plan.blocks[b].second;
  if (cf != nullptr && !cf->resident && cf->bytes > 0) {
    m.sk.unbind_layers(cf->first, last);
    m.rebind_pinned();
    m.backend->block_done(*m.w.ring);
    if (m.caps().async) {
      m.pump(true);  // this block's kernels are queued: wait for the previous block's to read on
    } else {
      m.w.trace(m.tgroup);
    }
  } else if (cf != nullptr && cf->resident && m.w.kept_state[b] != Weights::Kept::kLoaded) {
    m.sk.unbind_layers(cf->first, last);
    m.rebind_pinned();
  }
}

}  // namespace

bool Executor::step(int stop_before) {
  Impl& m = *impl_;
  std::unique_lock<std::recursive_mutex> lk(m.mu);
  if (!m.run) throw Error(m.path + ": no inference in progress (begin() first)");
  if (m.cur >= static_cast<int>(m.w.plan.blocks.size())) return true;
  AccountScope charge(m.meter.measuring() ? m.meter.account() : m.lender.lends() ? m.lender.account() : 0);
  try {
    if (m.shed_pending) {
      // Shed between two steps for a cut whose set_budget() comes next (Runtime: the caller
      // checks for a move when step() returns): do not read back at the old budget first.
      if (m.yield.exchange(false)) return false;
      replan(m, Replan::kShed, m.planner->budget());  // no cut follows: read again what was shed
    }
    const int n = static_cast<int>(m.w.plan.blocks.size());
    if (m.cur >= n) return true;
    const int b = m.cur;
    const int last = m.w.plan.blocks[b].second;
    if (!m.bound) {
      bind_block(m, b);
      m.bound = true;
    }
    const Fetch* cf = m.cursor->executing();  // what block b was read as (none: resident, loaded)
    const bool pieces = cf != nullptr && m.cursor->runs_by_layer(*cf);
    // An interrupt is taken after at least one layer, so that a storm of them cannot stall
    // the inference.
    bool ran = false;
    while (m.run->next_layer() <= last) {
      if (m.run->next_layer() == stop_before) return false;
      if (ran && m.yield.exchange(false)) return false;  // interrupted at a layer boundary
      if (!run_next_layer(m, lk, b, cf, pieces)) return false;
      ran = true;
    }
    if (pieces) {
      Status st = m.cursor->wait_layer(last);  // all landed by now; weightless tails
      if (!st.ok()) throw Error(st.message() + block_of(b, n));
    }
    swap_out(m, b, cf);
    m.bound = false;
    m.cursor->done_executing();
    ++m.cur;
    m.pump();
    return m.cur >= n;
  } catch (...) {
    if (m.meter.refused()) {
      const int k = m.run->next_layer();
      Error why(m.meter.refusal(m.planner->budget(), m.planner->weights_min(), k, m.info.layers[k].name));
      abort();
      throw why;
    }
    abort();
    throw;
  }
}

c10::IValue Executor::finish() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  if (!m.run || m.cur < static_cast<int>(m.w.plan.blocks.size())) {
    throw Error(m.path + ": finish() before every block has run");
  }
  c10::IValue out;
  try {
    AccountScope charge(m.meter.measuring() ? m.meter.account() : m.lender.lends() ? m.lender.account() : 0);
    out = m.sk.finish(*m.run);
    // Outputs copied out of [lo, hi) (outside any account); the bytes copied.
    auto evict = [&](const char* lo, std::uint64_t bytes) {
      const int before = set_thread_cpu_account(0);
      struct Restore {
        int a;
        ~Restore() { set_thread_cpu_account(a); }
      } restore{before};
      std::uint64_t copied = 0;
      out = evict_from(out, lo, lo + bytes, &copied);
      return copied;
    };
    if (const auto [base, bytes] = m.meter.scratch(); bytes != 0) {
      // Note [Dynamic shapes]: outputs leave the scratch zone, which goes after this inference.
      m.meter.note_reach();
      (void)evict(base, bytes);
    }
    if (m.lender.lends()) {
      // Note [Lending the activation reserve]: outputs the caller keeps would hold zone bytes
      // the next inference's activations (or blocks) are planned to use: copied out, the zone's
      // chunks freed with the inference.
      const std::uint64_t copied = evict(m.w.ring->zone_begin(), m.w.ring->lend());
      m.lender.outputs_copied(copied);
    }
    // Blocks read after a write into the file would be mixed with those read before it.
    m.reader->check_file().throw_if_error();
  } catch (...) {
    abort();
    throw;
  }
  m.run.reset();
  trace_span(m.tgroup, TraceLane::kInference, "inference", m.counters.inferences++, m.inference_t0, TraceClock::now());
  // Note [Lending the activation reserve]: one whole inference in this zone measured every
  // layer's reach.
  m.lender.end_inference();
  // Reads ahead of this inference belong to the next one now.
  m.cursor->inference_done();
  m.cur = 0;
  m.register_ring();
  m.pump();
  const bool measured_input = m.meter.measuring();
  end_measuring(m, true);  // re-plans with the reserve this input needs
  try {
    learn_costs(m, !measured_input);
  } catch (const std::exception& e) {  // never this inference's failure: the plan in force stays
    log(LogLevel::kWarn, m.path + ": learning the costs failed, the plan stays: " + e.what());
  }
  return out;
}

void Executor::abort() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  m.cursor->cancel_executing();  // before it is forgotten: its pieces may be in flight
  m.run.reset();
  m.bound = false;
  m.cursor->done_executing();
  m.cur = 0;
  m.yield.store(false);
  if (m.released) {
    end_measuring(m, false);
    return;
  }
  // Nothing half-read stays: reads cancelled and waited for, the ring emptied, swapped views
  // dropped; resident blocks read whole and pinned slots stay bound.
  try {
    m.drain();
    m.backend->idle(m.w.ring.get());
  } catch (const std::exception& e) {  // keep the first error; the GPU's is logged
    log(LogLevel::kError, m.path + ": waiting for the GPU after an error failed: " + e.what());
  }
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  m.bind_loaded();
  end_measuring(m, false);
}

bool Executor::in_inference() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->run != nullptr;
}
int Executor::next_layer() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->run ? impl_->run->next_layer() : 0;
}
void Executor::interrupt() { impl_->yield.store(true); }
namespace {
// Executor::next_block_unread_bytes with the executor's lock held; `wait`: block on the reader's.
bool next_unread_locked(const Executor::Impl& m, bool wait, std::uint64_t* out);
}  // namespace
std::uint64_t Executor::next_block_unread_bytes() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  std::uint64_t n = 0;
  next_unread_locked(*impl_, true, &n);
  return n;
}
bool Executor::try_next_block_unread_bytes(std::uint64_t* out) const {
  std::unique_lock<std::recursive_mutex> lk(impl_->mu, std::try_to_lock);
  return lk.owns_lock() && next_unread_locked(*impl_, false, out);
}
namespace {
bool next_unread_locked(const Executor::Impl& m, bool wait, std::uint64_t* out) {
  const int b = m.run ? m.cur : 0;
  if (m.released || b >= static_cast<int>(m.w.plan.blocks.size())) {
    *out = 0;
    return true;
  }
  // After shed() the block's bytes are gone: the next step re-plans and reads them again.
  if (m.shed_pending) {
    *out = m.w.plan.block_bytes[b];
    return true;
  }
  if (m.bound || (m.w.plan.resident[b] && m.w.kept_state[b] == Weights::Kept::kLoaded)) {
    *out = 0;
    return true;
  }
  return m.cursor->unlanded_of(b, wait, out);
}
}  // namespace

// Note [Shedding]
// ~~~~~~~~~~~~~~~
// A layer cannot be stopped, and one layer of a big model on a busy CPU can take hundreds of
// milliseconds; a budget cut should not wait for it. shed() (from any thread) takes the executor
// while the layer runs (the thread using it releases `mu` only around run_layer) and gives back
// at once everything that layer does not read: reads in flight are cancelled and waited for,
// the ring's pages are punched out but for the running layer's bytes (and the layers owning
// weights it reads), resident blocks are dropped (read again later). The layer's own weights and
// the pinned slots stay: at most the minimum budget. When the layer ends the thread sees
// `shed_pending` and stops before the next layer; the next set_budget() (or the next step(), at the
// budget in force) re-plans from there and reads what it needs again. Not on the GPU (kernels
// run ahead of this thread: there is no one running layer to keep).
bool Executor::shed(std::uint64_t budget) {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  if (!m.caps().sheds || m.released || m.shed_pending || m.w.plan.total() <= budget) return false;
  const auto t0 = std::chrono::steady_clock::now();
  // What the running layer reads: its own bytes and those of the layers in its block owning
  // weights it uses (weights owned outside its block are pinned).
  std::vector<std::pair<int, int>> keep_layers;  // [first, last] of byte ranges to keep, as layers
  int block = -1;
  const int k = m.running_layer;
  if (k >= 0) {
    for (size_t b = 0; b < m.w.plan.blocks.size(); ++b) {
      if (m.w.plan.blocks[b].first <= k && k <= m.w.plan.blocks[b].second) block = static_cast<int>(b);
    }
    keep_layers.emplace_back(k, k);
    for (int s : m.sk.layers()[k].used_slots) {
      const int owner = m.sk.slots()[s].layer;
      if (block >= 0 && owner >= m.w.plan.blocks[block].first && owner < k) keep_layers.emplace_back(owner, owner);
    }
  }
  // Reads: cancelled, and waited for (their pages are about to go), the running block's
  // pieces after the running layer too (Note [Layer by layer]).
  m.cursor->drop_fetches();
  // Registered (io_uring fixed buffer) pages are pinned by the kernel: dropping them from the
  // mapping would not free them. The reader is idle now: unregister first.
  if (m.w.registered) {
    m.w.registered = !m.reader->register_buffers({});
    if (m.w.registered) log(LogLevel::kError, m.path + ": internal: reads in flight after cancelling them; the ring stays pinned");
  }
  std::uint64_t kept = 0;
  // The ring: only the running layer's bytes, when it runs from a swapped block.
  if (m.w.ring) {
    std::vector<std::pair<const char*, std::uint64_t>> keep;
    const Fetch* cf = m.cursor->executing();
    if (block >= 0 && !m.w.plan.resident[block] && cf != nullptr && cf->block == block) {
      for (const auto& [a, b] : keep_layers) {
        if (a < cf->first) continue;
        keep.emplace_back(cf->at + (m.offset(a) - m.offset(cf->first)), m.span(a, b));
        kept += m.span(a, b);
      }
    }
    // The zone is the activation reserve (Note [Lending the activation reserve]): activations of
    // the running layer live there; blocks lent its bytes are within it.
    if (m.w.ring->lend() > 0) keep.emplace_back(m.w.ring->zone_begin(), m.w.ring->lend());
    m.w.ring->discard_except(keep);
    m.w.retained_valid = false;  // the kept bytes went too, but for the running layer's
  }
  // Resident blocks: dropped (but the running layer's bytes, when it runs from one).
  if (m.w.kept) {
    for (size_t b = 0; b < m.w.plan.blocks.size(); ++b) {
      if (!m.w.plan.resident[b] || m.w.plan.block_bytes[b] == 0) continue;
      const std::uint64_t base = m.w.kept_at[b];
      std::uint64_t at = base;
      if (static_cast<int>(b) == block) {
        std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
        for (const auto& [a, e] : keep_layers) {
          ranges.emplace_back(base + (m.offset(a) - m.offset(m.w.plan.blocks[b].first)), m.span(a, e));
        }
        std::sort(ranges.begin(), ranges.end());
        for (const auto& [off, len] : ranges) {
          if (off > at) m.w.kept->discard(at, off - at);
          at = std::max(at, off + len);
          kept += len;
        }
      }
      m.w.kept->discard(at, base + m.w.plan.block_bytes[b] - at);
      m.w.kept_state[b] = Weights::Kept::kNone;
    }
  }
  m.shed_pending = true;
  m.shed_held = kept + m.w.pinned_need;
  log(LogLevel::kDebug, m.path + ": shed down to " + format_bytes(m.shed_held) + " (layer " + std::to_string(k) +
                            " running) in " +
                            std::to_string(std::chrono::duration<double, std::milli>(
                                               std::chrono::steady_clock::now() - t0).count()) +
                            " ms");
  return true;
}

c10::IValue Executor::forward(std::vector<c10::IValue> inputs) {
  begin(std::move(inputs));
  while (!step()) {
  }
  return finish();
}

const ExecutionPlan& Executor::plan() const { return impl_->w.plan; }
const ImageInfo& Executor::info() const { return impl_->planner->view(); }
const Skeleton& Executor::skeleton() const { return impl_->sk; }
std::uint64_t Executor::bytes_read() const { return impl_->reader->bytes_read(); }
void Executor::set_read_priority(double priority) { impl_->reader->set_priority(priority); }
std::uint64_t Executor::bytes_used() const { return impl_->cursor->stats().used_bytes; }
Executor::PipelineStats Executor::pipeline_stats() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  PipelineStats p;
  p.read_wait_ms = impl_->cursor->stats().read_wait_seconds * 1e3;
  p.layers_started_early = impl_->counters.layers_started_early;
  p.released_early_bytes = impl_->counters.released_early;
  p.read_past_streamed = impl_->cursor->stats().read_past_streamed;
  p.read_at_layer_end = impl_->counters.read_at_layer_end;
  const ZoneLender::Stats z = impl_->lender.stats();
  p.zone_bytes = z.zone_bytes;
  p.lent_peak_bytes = z.lent_peak;
  p.zone_peak_bytes = z.zone_peak;
  p.zone_misses = z.zone_misses;
  p.disk_busy_ms = impl_->reader->busy_seconds() * 1e3;
  return p;
}
std::uint64_t Executor::streamed_blocks() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->cursor->stats().streamed;
}
double Executor::bind_us_per_tensor() const {
  const Impl::Counters& c = impl_->counters;
  return c.bound_tensors ? c.bind_seconds * 1e6 / static_cast<double>(c.bound_tensors) : 0.0;
}
IoBackend Executor::backend() const { return impl_->reader->backend(); }
MemoryKind Executor::memory() const { return impl_->w.ring ? impl_->w.ring->kind() : impl_->opt.memory; }

namespace {
// Bytes of [p, p + bytes) whose pages are resident now.
std::uint64_t resident_bytes_of(const void* p, std::uint64_t bytes) {
  if (p == nullptr || bytes == 0) return 0;
  const std::uintptr_t page = 4096, a = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const std::uintptr_t e = reinterpret_cast<std::uintptr_t>(p) + bytes;
  std::vector<unsigned char> v((e - a + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(a), e - a, v.data()) != 0) return 0;
  std::uint64_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n * page;
}
}  // namespace

WeightMemory Executor::weight_memory() const {
  const Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  WeightMemory w;
  w.peak = m.w.peak;
  if (m.released) return w;
  w.held = m.shed_pending ? m.shed_held : (m.w.ring ? m.w.ring->kept() + m.w.ring->capacity() : 0) + m.w.kept_bytes + m.w.pinned_need;
  if (m.caps().host_pages) {
    if (m.w.ring) w.resident_pages += resident_bytes_of(m.w.ring->kept_begin(), m.w.ring->kept() + m.w.ring->capacity());
    if (m.w.kept) w.resident_pages += resident_bytes_of(m.w.kept->base(), m.w.kept->capacity());
    w.resident_pages += resident_bytes_of(m.w.pinned_buf, m.w.pinned_need);
  }
  return w;
}
void Executor::reset_weight_peak() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  m.w.peak = 0;
  if (!m.shed_pending) m.note_in_use();
}
bool Executor::released() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->released;
}

void Executor::release() {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  if (impl_->run) abort();
  release_all(*impl_);
}

void release_all(Executor::Impl& m) {
  if (m.released) return;
  if (m.meter.measuring()) {  // an inference measuring activations ends here: its limit and reserve go
    m.planner->set_reserve(m.meter.end(false));
  }
  m.run.reset();
  m.bound = false;
  try {
    m.drain();
    m.backend->idle(m.w.ring.get());
  } catch (const std::exception& e) {
    log(LogLevel::kError, m.path + ": waiting for the GPU before releasing failed: " + e.what());
  }
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  if (!m.reader->register_buffers({})) {  // unpin before freeing; drained, so never refused
    log(LogLevel::kError, m.path + ": internal: reads in flight after draining; the ring is kept");
    return;
  }
  m.drop_ring();
  m.w.kept.reset();
  m.w.kept_bytes = 0;
  m.w.kept_state.assign(m.w.kept_state.size(), Weights::Kept::kNone);
  m.drop_pinned();
  m.released = true;
  m.shed_pending = false;
  log(LogLevel::kInfo, m.path + ": released every byte held for weights");
  give_heap_back(m.path);
}

std::vector<std::pair<std::uint64_t, double>> Executor::latency_curve() const {
  return impl_->planner->latency_curve();
}

}  // namespace swapnet
