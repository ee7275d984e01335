// The multi-model Runtime's state (internal to the scheduler module), shared by its three
// files: runtime_api.cpp (open, and the public API), runtime_worker.cpp (the worker threads
// that serve requests, and the central scheduler's hand-off of workers) and runtime.cpp
// (budget changes: targets, moves, sheds, splitting again with learned costs).
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "compute_threads.h"
#include "estimates.h"
#include "ledger.h"
#include "swapnet/scheduler.h"

namespace swapnet {

// Named, not anonymous: Runtime::Impl, one type in every file, holds these.
namespace runtime_detail {

using Clock = std::chrono::steady_clock;
inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Request {
  std::vector<c10::IValue> inputs;
  std::promise<c10::IValue> done;
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline{};  // epoch: none
};

// A central scheduler's grant holds its worker for the granted block and the next ones while
// they have run less than this (Note [Steps of a grant] in runtime_worker.cpp).
constexpr double kStepMs = 2;

// A central scheduler's answer to a job waiting for a worker.
enum class Grant { kNone, kGo, kDrop };

// How many times an executor took learned costs and its plan followed them: put a new plan in
// force, or kept the one in force (Note [A re-plan must gain] in executor_learn.cpp). Either way its
// latency curve changed, and the split is made again with it (Note [Splitting with learned costs]
// in runtime.cpp).
inline std::uint64_t learned_count(const Executor::Learning& l) { return l.adopted + l.kept_plans; }

struct Worker {
  RuntimeModel spec;
  std::unique_ptr<Executor> exec;
  int account = 0;
  std::deque<Request> queue;
  std::uint64_t budget = 0;  // in force; 0 = paused
  bool moving = false;       // move() is under way (unlocked), towards `moving_to`
  std::uint64_t moving_to = 0;
  // Executor::shed() gave back all but the running layer's weights for a cut to `shed_target`
  // (0: paused); cleared when the worker next moves or goes on.
  bool shed = false;
  std::uint64_t shed_target = 0;
  ModelStatus st;
  std::thread thread;
  // Central scheduling: waiting for a worker (as `cand`), and the answer.
  bool waiting = false;
  Grant grant = Grant::kNone;
  DispatchCandidate cand;
  double read_priority = 0;  // on a shared disk (disk-aware schedulers)
  std::uint64_t learned_seen = 0;                // learned_count() taken into the split
  double met_share = 1;  // EWMA of deadlines met (Note [A floor against starvation] in dispatch.cpp)
  BlockEstimates est;  // its blocks' expected times (Note [Block estimates under contention])
  std::vector<char> blas_layers;  // per layer: calls BLAS (Note [BLAS beside the OpenMP pool])
  // The block holding a worker now: when it was granted, the runtime's busy integral then, and
  // what the scheduler expected of it.
  Clock::time_point granted{};
  double busy_at_grant = 0;
  double expected_next = 0;
  double expected_unread = -1;  // its unread bytes then (-1: not known)
  int next_b = -1;  // while waiting: the plan's block it waits to run (expected())
  // The step holding that worker (Note [Steps of a grant] in runtime_worker.cpp): its blocks'
  // expected and measured ms so far, and whether it keeps the worker for the next block.
  double step_expected = 0, step_ms = 0;
  bool holding = false;
  // Executor::PipelineStats::read_wait_ms after the inference's last step (-1: not read yet), so
  // a block's wait costs one read of the stats, not two.
  double read_wait_ms = -1;
  // Under the runtime's lock, between steps: the expected times of the next block, of the rest
  // (next block included) and of the block after the next (0: none), each run beside `others`
  // other blocks at the machine's pace `pace` (Note [The machine's pace] in estimates.cpp).
  struct Expected {
    double next = 0, rest = 0, then = 0;
  };
  // Also notes the next block (next_b) for its grant.
  Expected expected(double others, double pace) {
    const ExecutionPlan& p = exec->plan();
    const int next = exec->in_inference() ? exec->next_layer() : 0;
    Expected e;
    int seen = 0;
    next_b = -1;
    for (size_t b = 0; b < p.blocks.size(); ++b) {
      if (p.blocks[b].second < next) continue;
      const double ms = expect_block(b, others, pace, seen == 0 ? next_unread() : -1.0);
      if (seen == 0) {
        e.next = ms;
        next_b = static_cast<int>(b);
      }
      if (seen == 1) e.then = ms;
      ++seen;
      e.rest += ms;
    }
    return e;
  }
  // Expected ms of the plan's block `b`; `unread`: its bytes not landed yet (< 0: not known).
  double expect_block(size_t b, double others, double pace, double unread = -1) const {
    const ExecutionPlan& p = exec->plan();
    return est.expect(p.blocks[b].first, p.blocks[b].second, p.resident[b] != 0, others, pace, unread);
  }
  // The next block's bytes not landed yet, without waiting on a lock (-1: busy, not known).
  double next_unread() const {
    std::uint64_t n = 0;
    return exec->try_next_block_unread_bytes(&n) ? static_cast<double>(n) : -1.0;
  }
  // Block `b`'s expected ms (0: none, b < 0) as the step about to run it counts it, with its
  // unread bytes now (kept in expected_unread, for learning the waits they cost).
  double expect_step_block(int b, double others, double pace) {
    expected_unread = b < 0 ? -1 : next_unread();
    return b < 0 ? 0 : expect_block(static_cast<size_t>(b), others, pace, expected_unread);
  }
  double expect_next_block(double others, double pace) { return expect_step_block(next_block(), others, pace); }
  // The plan's block the next step runs (-1: none left).
  int next_block() const {
    const ExecutionPlan& p = exec->plan();
    const int next = exec->in_inference() ? exec->next_layer() : 0;
    for (size_t b = 0; b < p.blocks.size(); ++b) {
      if (p.blocks[b].second >= next) return static_cast<int>(b);
    }
    return -1;
  }
};

// What one request came to: serve()'s steps fill it in (runtime_worker.cpp).
struct Served;

}  // namespace runtime_detail

struct Runtime::Impl {
  using Clock = runtime_detail::Clock;
  using Request = runtime_detail::Request;
  using Worker = runtime_detail::Worker;
  using Served = runtime_detail::Served;
  using Grant = runtime_detail::Grant;

  std::vector<std::unique_ptr<Worker>> w;
  std::vector<ModelDemand> demands;
  std::shared_ptr<const BudgetPolicy> policy;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool stop = false;
  std::uint64_t total = 0;
  std::vector<std::uint64_t> target;  // per model; 0 = paused
  std::vector<std::string> reason;    // per model: why it is paused
  std::vector<Adaptation> adaptations;
  runtime_detail::MemoryLedger ledger{0, 0, Clock::now()};  // made again at open with the models
  runtime_detail::Pace pace;  // every model's blocks' pace (Note [The machine's pace])
  Clock::time_point t0 = Clock::now();
  Clock::time_point notified;
  // Central scheduling (RuntimeOptions::scheduler); null under "threads".
  std::unique_ptr<DispatchPolicy> dispatch;
  bool disk_aware = false;  // the models' reads take turns on their disk by urgency (dispatch.cpp)
  std::map<dev_t, std::shared_ptr<SharedDisk>> disks;  // disk-aware: one per device the images are on
  int workers = 0;  // central: blocks that may run at once
  // Central: the threads the granted steps run on, one per worker (Note [Compute threads]).
  std::unique_ptr<runtime_detail::ComputeThreads> compute;
  int free_workers = 0;
  // Central: blocks running now, and their integral over time (block-ms) up to busy_at; a
  // block's mean company is the integral's growth over its run (Note [Block estimates under
  // contention] in estimates.cpp).
  int running = 0;
  double busy_ms = 0;
  Clock::time_point busy_at = Clock::now();
  void tally(Clock::time_point now) {
    busy_ms += running * runtime_detail::ms_between(busy_at, now);
    busy_at = now;
  }
  double dispatch_us_sum = 0;
  std::uint64_t decisions = 0;

  // Cuts the shedding thread makes (Note [Shedding off the caller's thread] in runtime.cpp).
  struct ShedOrder {
    size_t model = 0;
    std::uint64_t to = 0;     // the model's target when the cut was made
    std::uint64_t moves = 0;  // its budget_changes then (a move since makes the order moot)
  };
  std::deque<ShedOrder> sheds;  // under mu
  std::thread shedder;

  // Each function's comment, where it is defined, says whether it holds `mu` on entry and return.
  // ---- the workers (runtime_worker.cpp) ----
  void loop(size_t i);
  void serve(size_t i, Request r, std::unique_lock<std::mutex>& lk);
  void run_inference(size_t i, Request& r, std::unique_lock<std::mutex>& lk, Served& s);
  bool run_block(size_t i, std::unique_lock<std::mutex>& lk, Served& s);
  bool run_step(size_t i, const Request& r, std::unique_lock<std::mutex>& lk, Served& s);
  bool between_blocks(size_t i, std::unique_lock<std::mutex>& lk, Served& s, bool may_move = true);
  void count_served(size_t i, const Request& r, const Served& s);
  void note_use(size_t i, const Served& s, std::unique_lock<std::mutex>& lk);
  // Central scheduling: a worker for each block.
  bool acquire(size_t i, const Request& r, std::unique_lock<std::mutex>& lk, bool* abandoned);
  void release(size_t i, std::pair<int, int> block, bool resident, double ms, double wait_ms, bool more,
               std::unique_lock<std::mutex>& lk);
  void end_step(size_t i);
  void log_block(size_t i, std::pair<int, int> block, bool resident, double others, double ms, double wait_ms);
  void log_drop(const DispatchCandidate& c, double now_ms);
  void dispatch_locked();
  void set_read_priority(Worker& x, double p);

  // ---- budget changes (runtime.cpp) ----
  std::uint64_t holds(size_t j) const;
  bool shrink_pending() const;
  bool settled() const;
  bool in_effect() const;
  bool can_move(size_t i) const;
  void note_if_settled();
  static void keep_activations(Worker& x, bool running);
  void record_plan(Worker& x);
  void move(size_t i, std::unique_lock<std::mutex>& lk);
  void shed_loop();
  Allocation plan(std::uint64_t bytes) const { return allocate(*policy, demands, bytes); }
  void learned(size_t i, std::unique_lock<std::mutex>& lk);
  void retarget(const Allocation& a, std::uint64_t bytes, Clock::time_point t, double plan_ms, const std::string& note);
  void set_targets(const Allocation& a);
};

}  // namespace swapnet
