// The executor's state, shared by the files that make it up (internal to the assembly module).
//
//   executor.cpp         open, the one re-plan path, adopting a plan, measuring new input shapes
//   executor_run.cpp     an inference: begin, step (bind, run layers, swap out), finish, abort
//   executor_learn.cpp   costs learned in service put to use (Note [A re-plan must gain])
//   executor_memory.cpp  shed, release, what is held (Note [Shedding], [Giving the C heap back])
//
// Components (planner.h, weights.h, read_ahead.h, zone_lender.h, input_meter.h, cost_learner.h,
// device_backend.h) each hold their own state; Impl holds them and what ties them together:
// the inference in progress and the lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

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
  void pump(BlockCursor::KernelWait wait = BlockCursor::KernelWait::kNone) { cursor->pump(pos(), wait); }
  void drain() {
    if (cursor) cursor->drain();
  }
  void note_in_use() { cursor->note_in_use(); }
};

// ---- what the files share (each defined where its comment says)

// executor.cpp. Makes `p` the plan in force: a ring and resident arena of its sizes (the old
// ones are freed first: nothing may be in flight), and the slots this partition must keep
// resident read. The cursor starts at block 0; resident blocks are read on the way.
void adopt(Executor::Impl& m, ExecutionPlan p);
// executor.cpp (Note [One re-plan path]). Why a plan changes.
enum class Replan { kBudget, kShed, kReserve, kLearned };
// Plans for `bytes` and puts the plan in force. With `must_beat_ms` > 0, only a plan predicted
// under that is put in force (Note [A re-plan must gain]); false when it was not. (While a new
// input's activations are measured it is ignored: learning never re-plans then.)
bool replan(Executor::Impl& m, Replan why, std::uint64_t bytes, double must_beat_ms = 0, double* best_ms = nullptr);
// executor.cpp (Note [Dynamic shapes] in input_meter.cpp). Before an inference whose input no
// profile covers: weights planned at their least, activations allowed the rest of the budget.
void start_measuring(Executor::Impl& m, std::vector<ImageInput> in, const std::vector<c10::IValue>& inputs);
// After the measuring inference: plans with the reserve it measured (`ok`), or the one before.
void end_measuring(Executor::Impl& m, bool ok);

// executor_learn.cpp. After an inference (Note [Learning the costs in service] in
// cost_learner.cpp); `whole`: it was not one measuring a new input.
void learn_costs(Executor::Impl& m, bool whole);
// Whether this executor learns its costs (then its layers are timed: DeviceBackend::layer_began).
bool learns(const Executor::Impl& m);
// The backend's layer times known by now (all of them, waiting for the device, where `wait`) to
// the learner.
void take_layer_times(Executor::Impl& m, bool wait);
// Note [Learned costs kept] (cost_learner.cpp): at open, the costs learned before.
void load_learned(Executor::Impl& m);

// executor_memory.cpp. Frees every byte held for weights (Executor::release).
void release_all(Executor::Impl& m);
// Note [Giving the C heap back].
void give_heap_back(const std::string& path);

}  // namespace swapnet
