// swapnet/scheduler.h — several DNNs sharing one memory budget: the budgeter that splits it, a
// Runtime that serves every model concurrently within its share, and the sources that tell the
// Runtime when the budget moves (the API, a control socket, a watched file, /proc/meminfo, a
// cgroup v1 limit). docs/scheduler.md has the rules and the measurements.
//
// Budgeter. Each model states its demand (ModelDemand): the smallest budget it runs in, the
// budget at which nothing is swapped, and its predicted latency by budget (from its partition
// table). allocate() then:
//  1. gives every model its full demand when the total allows (no swapping at all);
//  2. else pauses models while the minimums do not fit (lowest urgency first, then the largest
//     minimum), saying which and why;
//  3. asks the policy for a split of the total among the rest, and brings it within each
//     model's [minimum, full] (fit_budgets: raised to minimums, the others reduced in proportion;
//     capped at full, the excess shared by the others).
// Policies (make_policy): "paper" (the paper's Eq. 1), "equal" (the paper's ablation), "minmax"
// (the split minimising the largest predicted latency, which the paper states as its objective
// but does not solve). BudgetPolicy is the extension point for others.
#pragma once

#include <ATen/core/ivalue.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "swapnet/assembly.h"

namespace swapnet {

// ---- budgeter (pure arithmetic) ------------------------------------------------------------

struct SWAPNET_API ModelDemand {
  std::string name;
  double urgency = 1;              // the user's u_i (> 0)
  std::uint64_t min_bytes = 0;     // smallest budget it can run in
  std::uint64_t full_bytes = 0;    // budget at which nothing is swapped (the paper's M_i)
  double latency_ms = 0;           // predicted latency with everything in memory
  // Predicted latency by budget: (budget, ms), budgets increasing, ms non-increasing
  // (Executor::latency_curve). Used by "minmax"; empty: latency_ms from min_bytes on.
  std::vector<std::pair<std::uint64_t, double>> curve;
  double predict_ms(std::uint64_t budget) const;  // +inf below min_bytes
  // The smallest budget predicted to run within `ms` (full_bytes if none is).
  std::uint64_t budget_for(double ms) const;
};

class SWAPNET_API BudgetPolicy {
 public:
  virtual ~BudgetPolicy() = default;
  virtual std::string name() const = 0;
  // A split of `total` among models that can all run (sum of minimums <= total < sum of full
  // demands). Need not respect the bounds: fit_budgets() is applied to it.
  virtual std::vector<double> split(const std::vector<ModelDemand>& models, std::uint64_t total) const = 0;
};
// "paper" | "equal" | "minmax"; throws Error naming the choices.
SWAPNET_API std::unique_ptr<BudgetPolicy> make_policy(const std::string& name);

// `want` brought within each model's [min_bytes, full_bytes], summing to at most `total`
// (water-filling in proportion to `want`). Needs sum(min_bytes) <= total.
SWAPNET_API std::vector<std::uint64_t> fit_budgets(const std::vector<double>& want,
                                                   const std::vector<ModelDemand>& models, std::uint64_t total);

struct Allocation {
  std::vector<std::uint64_t> budgets;  // per model; 0 for a paused one
  std::vector<char> paused;            // per model: 1 = cannot run within this total
  bool swapping = false;               // false: every running model got its full demand
  std::string note;                    // what was raised, reduced or paused, with the numbers
};
SWAPNET_API Allocation allocate(const BudgetPolicy& policy, const std::vector<ModelDemand>& models,
                                std::uint64_t total);

// ---- dispatch (which waiting job runs its next block) -----------------------------------------
//
// With a central scheduler (RuntimeOptions::scheduler other than "threads"), a model's inference
// asks for a worker before each block, and a DispatchPolicy picks among the jobs waiting: the
// unit of scheduling (and of pre-emption) is a block, so an urgent request runs between two
// blocks of a long one. docs/scheduler.md compares the policies with Band's.

struct DispatchCandidate {
  int model = 0;
  double arrival_ms = 0;    // when its request arrived (any common clock)
  double deadline_ms = 0;   // absolute, same clock; 0: none
  double next_ms = 0;       // expected time of its next block
  double remaining_ms = 0;  // expected time of the rest of its inference, next block included
  double then_ms = 0;       // expected time of the block after the next one (0: none)
  // Expected wait for the next block's weights still on their way from the disk, at the cost
  // model's read rate (0: in memory, the block can run at once). Refreshed at every decision.
  double unread_ms = 0;
  // The model's share of deadlines met lately (an EWMA over its requests with a deadline, 1
  // before any): "lst" serves a model below its floor first (Note [A floor against starvation]).
  double met_share = 1;
  bool started = false;  // it has run a block (admission is before the first one)
};

struct DispatchDecision {
  int pick = -1;          // index into the candidates; -1: none
  std::vector<int> drop;  // indices of requests that cannot meet their deadline any more
};

class SWAPNET_API DispatchPolicy {
 public:
  virtual ~DispatchPolicy() = default;
  virtual std::string name() const = 0;
  // Called with at least one candidate; `now_ms` on the candidates' clock.
  virtual DispatchDecision pick(const std::vector<DispatchCandidate>& waiting, double now_ms) = 0;
  // Whether pick() reads DispatchCandidate::unread_ms (the runtime refreshes it only then). Such
  // a policy is disk-aware: the runtime also has the models' reads take turns on their disk in
  // the order urgency() gives (Note [One disk, read by urgency] in swapcore's reader.cpp).
  virtual bool reads_unread() const { return false; }
  // How urgent a job's reads are, lower first, on a scale that does not move with time (a job
  // keeps the key it had when granted while its block runs): the policy's order. Default: first
  // come, first served.
  virtual double urgency(const DispatchCandidate& c) const { return c.arrival_ms; }
};
// "fifo" (earliest arrival), "rr" (round robin over models, a block each), "sel" (shortest
// expected remaining latency), "lst" (least slack: deadline - now - remaining; a request whose
// slack is negative is dropped, Band's early drop; requests without a deadline come after those
// with one, first come first served), "heft" (Band's heterogeneous earliest finish time with
// reservation, on `workers` identical workers: the job expected to finish last goes first, each
// job granted a block reserving its next one; Note [HEFT on identical workers]). Throws Error
// naming the choices ("threads" is not a policy: it is the Runtime without a central scheduler).
// Any name + "+io" (e.g. "lst+io"): the disk-aware variant (Note [The disk as a scheduled
// resource]): when the policy's choice is a block still being read, its choice among the blocks
// in memory runs first if it is expected to end before those bytes land.
SWAPNET_API std::unique_ptr<DispatchPolicy> make_dispatch_policy(const std::string& name, int workers = 1);

// The CPUs this process may run on (its affinity mask; at least 1): the intra-op threads serve
// gives a central scheduler's one worker.
SWAPNET_API int usable_cores();

// Frees the calling thread's idle intra-op (OpenMP) helper threads; `serial`: its torch ops run
// on it alone from now on (the process's default is unchanged). For threads that only prepare
// inputs beside a Runtime: helpers of more pools than cores make libgomp stop spinning, and the
// runtime's inferences slow down (Note [One OpenMP pool per core] in scheduler/src/intra_op.cpp;
// 1.3-1.5x on 2 cores). Runtime::open frees its caller's.
SWAPNET_API void release_intra_op_threads(bool serial);
struct RuntimeOptions;
// The intra-op threads a model whose RuntimeModel::threads is 0 gets among `models` models: the
// cores this process may run on (usable_cores()) over the blocks that run at once, the workers
// of a central scheduler or, under "threads", the models (each model's thread on its own); at
// least 1. Not libtorch's own default, which is the physical cores cpuinfo finds (1 of this
// project's 2-vCPU VM) in every process, and in Python whatever the program set: models of
// several programs' settings then ran at half speed or oversubscribed the cores (Note [A
// model's threads from the machine] in scheduler/src/runtime_api.cpp).
SWAPNET_API int default_intra_op_threads(const RuntimeOptions& options, std::size_t models);

// The OpenBLAS threads a runtime with these options runs with while it is open, and how many
// OpenBLAS has now; {0, 0} where it leaves them (RuntimeOptions::blas_threads).
SWAPNET_API std::pair<int, int> runtime_blas_threads(const RuntimeOptions& options);

// An exponentially weighted moving average (Band's alpha = 0.1), seeded with a prediction.
struct Ewma {
  double alpha = 0.1;
  double value = 0;
  std::uint64_t samples = 0;
  void add(double x) {
    value = samples == 0 && value == 0 ? x : alpha * x + (1 - alpha) * value;
    ++samples;
  }
};

// ---- runtime ---------------------------------------------------------------------------------

struct RuntimeModel {
  std::string name;            // unique among the runtime's models
  std::string image;           // swap image (.swapnet)
  double urgency = 1;
  ExecutorOptions options;     // budget: set by the budgeter; grid_step 0: 1/64 of the model, >= 1 MiB
  // Intra-op threads of this model's inferences; 0: chosen from the machine by
  // default_intra_op_threads() (said in the log; ModelStatus::threads).
  int threads = 0;
  // Pin the model's thread (and the pool it starts) to these CPUs; under a central scheduler,
  // the compute thread running a step of the model, for that step (its helpers are not moved).
  std::vector<int> cpus;
};

struct RuntimeOptions {
  std::string policy = "paper";                    // make_policy(); ignored when `custom` is set
  std::shared_ptr<const BudgetPolicy> custom;      // a policy of the caller's own
  // "threads": every model's thread runs its blocks whenever it likes (the baseline); else a
  // make_dispatch_policy() name: at most `workers` blocks run at once, the policy picks which.
  std::string scheduler = "threads";
  // At most this many blocks run at once under a central scheduler, each on one of as many
  // compute threads (Note [Compute threads] in scheduler/src/compute_threads.cpp). 1: a block at a time, on
  // every core as its model's intra-op threads (RuntimeModel::threads 0: cores / workers),
  // the default (Note [Serve's defaults] in cli/cmd_serve.cpp says why); 0: one per core this
  // process may run on (usable_cores()), each model's intra-op threads to match (cores / workers).
  int workers = 1;
  // OpenBLAS's own threads while a central scheduler runs (ignored under "threads"): -1, the
  // default, one (the compute thread that calls it) where the process's OpenBLAS is its pthread
  // build with threads of its own, unless OPENBLAS_NUM_THREADS or GOTO_NUM_THREADS is set; 0:
  // left as they are; n: n. Process-wide (OpenBLAS has one setting): set at open, put back at
  // close by the last runtime open. Its threads spin beside the OpenMP pool and made the blocks
  // after a model switch several times slower on a 2-vCPU machine (Note [BLAS on the compute
  // thread] in scheduler/src/intra_op.cpp, which says what is not measured yet).
  int blas_threads = -1;
};

struct ModelStatus {
  std::string name;
  std::uint64_t budget = 0;          // in force (0: paused)
  bool paused = false;
  std::string paused_reason;
  int blocks = 0;                    // of the plan in force
  int threads = 0;                   // intra-op threads its inferences run on (chosen or given)
  int resident_blocks = 0;
  double predicted_ms = 0;
  std::uint64_t min_bytes = 0, full_bytes = 0;
  // Weights in use at their peak + the model's own activations at their peak, over its
  // inferences since open (as `swapnet run` reports peak_model_bytes).
  std::uint64_t peak_model_bytes = 0;
  // Inferences where weights held (arena budget, resident, pinned) + activations exceeded the
  // budget in force: the promise broken. Tests require 0.
  std::uint64_t over_budget = 0;
  std::uint64_t requests = 0;        // inferences served
  std::uint64_t rejected = 0;        // requests refused while paused
  std::uint64_t failed = 0;          // inferences that threw (but for `abandoned`)
  std::uint64_t abandoned = 0;       // inferences failed because the model was paused during them
  // Requests submitted with a deadline, those finished by it, and those the scheduler dropped
  // because they could not meet it any more (failed with an Error saying so).
  std::uint64_t deadline_requests = 0;
  std::uint64_t deadline_met = 0;
  std::uint64_t dropped = 0;
  // Expected time against measured, over the steps the central scheduler granted (a worker's
  // grant: one block, or consecutive blocks up to a quantum of work; Note [Steps of a grant] in
  // runtime_worker.cpp): mean |error| / measured.
  double estimate_error = 0;
  // The same error per millisecond of work: sum |error| / sum measured (Note [Block estimates
  // under contention] in estimates.cpp); and the contention learned (a block's slow-down per
  // other block running beside it).
  double estimate_time_error = 0;
  double contention = 0;
  // Mean |error| / measured per block, each block timed alone (a step of several blocks counts
  // each of them).
  double estimate_block_error = 0;
  // The steps and blocks those errors are over and the steps' measured ms, summed: two statuses
  // give the errors between them (serve's after its warm-up).
  std::uint64_t estimated_steps = 0;
  std::uint64_t estimated_blocks = 0;
  double estimated_ms = 0;
  std::uint64_t budget_changes = 0;  // plans adopted after open
  std::uint64_t mid_inference_moves = 0;  // of those, in the middle of an inference (between blocks)
};

// What the models used over time against the budget (Note [The memory ledger] in ledger.cpp).
struct MemoryUse {
  std::uint64_t peak_bytes = 0;  // the most used at once
  // Bytes x seconds above what may be used: the total in force, or during a change not yet in
  // effect the larger of the totals. The promise broken: 0 in every test.
  double over_byte_s = 0;
  double over_s = 0;
  // Bytes x seconds above a new, lower total while it took effect (models shedding).
  double complying_byte_s = 0;
};

struct Adaptation {
  double at_s = 0;                   // since the runtime opened
  std::uint64_t budget_bytes = 0;    // the new total
  std::vector<std::uint64_t> budgets;  // per model (0: paused)
  double plan_ms = 0;                // budgeter (allocate) time
  // From set_budget() to the change in effect: every model runs its new plan, or (a shrinking
  // one in the middle of a layer) has given back all but that layer's weights and moves when it
  // ends (Executor::shed); -1 while pending, or when a later change superseded this one first.
  double took_ms = -1;
  // From set_budget() to every model running its new plan (-1 likewise).
  double plans_ms = -1;
  // Per model: from set_budget() to its move done (-1: it did not move for this change), and how
  // long the move itself took (re-planning, cancelling reads, giving memory back, the new ring).
  std::vector<double> moved_ms, move_ms;
  std::string note;                  // the Allocation's note
};

// What a budget source (BudgetWatcher) or the control socket (ControlServer) drives: a Runtime,
// or the models an unmodified program loaded through the preload (transparent swapping).
class SWAPNET_API BudgetTarget {
 public:
  virtual ~BudgetTarget() = default;
  virtual void set_budget(std::uint64_t total) = 0;  // throws Error when it cannot be met at all
  virtual std::uint64_t total_budget() const = 0;
  // Memory its models may use now (meminfo sources add it back to what is "available").
  virtual std::uint64_t held_bytes() const { return total_budget(); }
  // One JSON object: total_budget_bytes, models: [{name, budget_bytes, paused, blocks, requests}].
  virtual std::string status_json() const = 0;
};

// Several models served concurrently, one worker thread each, within one total budget that
// counts every model's arena, resident blocks, pinned weights and activations.
class SWAPNET_API Runtime : public BudgetTarget {
 public:
  // Opens every image, measures demands, splits `total_budget` and plans each model. Throws
  // Error when the scenario cannot fit at all (the sum of minimums above the total, with the
  // numbers) or an image cannot be opened.
  static std::unique_ptr<Runtime> open(std::vector<RuntimeModel> models, std::uint64_t total_budget,
                                       const RuntimeOptions& options = {});
  ~Runtime();  // stops the workers; requests still queued fail

  int size() const;
  int index(const std::string& name) const;  // -1 if none
  // The models' demands now (a model that learns its costs updates its own: Note [Splitting
  // with learned costs] in runtime.cpp).
  std::vector<ModelDemand> demands() const;
  const Executor& executor(int model) const;  // for tests: plans, bytes read (not thread-safe)

  // Queues an inference on `model`'s worker. The future throws if the model is paused (Error
  // naming it and its minimum) or the inference fails.
  std::future<c10::IValue> submit(int model, std::vector<c10::IValue> inputs);
  // With a deadline (0: none). Under "lst", a request that cannot meet it any more is dropped:
  // its future throws an Error saying so.
  std::future<c10::IValue> submit(int model, std::vector<c10::IValue> inputs,
                                  std::chrono::steady_clock::time_point deadline);
  // Microseconds the dispatch policy took per decision (mean, since open); 0 under "threads".
  double dispatch_us() const;
  // A disk-aware scheduler ("+io"): the reads its models' readers took turns for on their disks
  // (SharedDisk::Stats summed over the disks); zeros otherwise.
  SharedDisk::Stats disk_stats() const;

  // A new total: re-runs the budgeter and returns (microseconds). Each model moves to its new
  // plan between two blocks of the inference it is running (an idle one at once; a shrinking
  // one at its next layer boundary): shrinking models first, growing ones after every shrink is
  // done, so memory never exceeds the larger of the two totals during the change and stays
  // within the new total once it has taken effect. A total below the sum of minimums pauses
  // models (said in the note; an inference a paused model was running fails) and keeps the
  // rest running.
  void set_budget(std::uint64_t total) override;
  // Waits until the latest set_budget() has taken effect in every model; false on timeout.
  bool wait_adapted(std::chrono::milliseconds timeout) const;
  std::uint64_t total_budget() const override;
  std::uint64_t held_bytes() const override;  // the models' budgets in force
  std::string status_json() const override;
  std::vector<Adaptation> adaptations() const;
  MemoryUse memory_use() const;  // since open
  std::vector<ModelStatus> status() const;
  double seconds() const;  // since open

  struct Impl;

 private:
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- budget sources ---------------------------------------------------------------------------

// Where a total budget can be read from:
//   file:PATH             the file holds a size ("600MiB", "629145600")
//   meminfo:RESERVE       /proc/meminfo MemAvailable minus RESERVE (a size); the watcher adds
//                         back the runtime's own budgets (memory it holds is not "available")
//   cgroup:PATH           a cgroup v1 memory.limit_in_bytes file (or its directory)
// Throws Error naming the spec; read() throws naming the file and the text.
class SWAPNET_API BudgetSource {
 public:
  explicit BudgetSource(const std::string& spec);
  std::uint64_t read() const;
  const std::string& spec() const { return spec_; }

 private:
  std::string spec_, kind_, path_;
  std::uint64_t reserve_ = 0;
};

// Polls a BudgetSource every `period` and calls set_budget on its target when the value changes by
// more than `hysteresis` bytes. Errors reading it are logged once per distinct message.
class SWAPNET_API BudgetWatcher {
 public:
  BudgetWatcher(BudgetTarget* target, BudgetSource source, std::chrono::milliseconds period,
                std::uint64_t hysteresis = 1u << 20);
  ~BudgetWatcher();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A UNIX socket (created owner-only, 0600, in a 0700 directory if it makes one) accepting one
// line per connection: "budget SIZE" (answers "ok TOTAL" once planned, or "error ..."),
// "status" (one JSON line). `swapnet ctl` is its client.
class SWAPNET_API ControlServer {
 public:
  ControlServer(BudgetTarget* target, const std::string& path);  // throws Error naming the path
  ~ControlServer();
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// Sends one command line to a ControlServer and returns its answer; throws Error naming the
// socket when nobody listens there.
SWAPNET_API std::string control_request(const std::string& path, const std::string& line);
// $XDG_RUNTIME_DIR/swapnet/serve.sock, else /tmp/swapnet-UID/serve.sock.
SWAPNET_API std::string default_control_path();

}  // namespace swapnet
