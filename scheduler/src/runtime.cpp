// The multi-model Runtime (scheduler.h): one worker thread per model, budgets from the
// budgeter, budget changes applied at inference boundaries.
//
// Note [Moving to a new budget]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// set_budget() only computes targets; each worker moves its own executor (an Executor is used
// by one thread): an idle worker at once; a busy one between two steps of its inference (the
// executor's inference is resumable, Note [Read-ahead ring]): the rest of the inference runs
// on the new plan, so a move waits for at most one block. A model that must shrink is also
// interrupted, so it moves at its next *layer* boundary (Executor::interrupt). A model whose
// target is below its budget in force may move at any time; one whose target is above may move
// only once no model has a shrink pending. So while a change is under way memory stays within
// the larger of the old and the new totals, and once every model has moved it is within the new
// one. The change has "taken effect" when every model runs at its target:
// Adaptation::took_ms is that moment, measured from set_budget(). A later change may supersede
// one still under way (its took_ms stays -1). A model whose target is 0 (paused: the minimums
// do not all fit) releases every byte it holds at once, failing the inference it was running
// (it cannot finish within the new total), and refuses requests until a later change gives it
// a budget again.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "swapnet/scheduler.h"

#include <nlohmann/json.hpp>

namespace swapnet {

namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Request {
  std::vector<c10::IValue> inputs;
  std::promise<c10::IValue> done;
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline{};  // epoch: none
};

// A central scheduler's answer to a job waiting for a worker.
enum class Grant { kNone, kGo, kDrop };

// How many times an executor took learned costs and its plan followed them: put a new plan in
// force, or kept the one in force (Note [A re-plan must gain] in executor.cpp). Either way its
// latency curve changed, and the split is made again with it (Note [Splitting with learned costs]).
std::uint64_t learned_count(const Executor::Learning& l) { return l.adopted + l.kept_plans; }

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
  std::vector<LayerCost> costs;                  // the cost model's layer table (seeds)
  double ms_per_byte = 0;                        // the cost model's read time
  std::map<std::pair<int, int>, Ewma> estimate;  // per block [first, last]: its time, ms
  double error_sum = 0;                          // sum of |estimate - measured| / measured
  std::uint64_t error_n = 0;
  // Expected time of block [a, b]: its EWMA, seeded with the cost model's (the read when it is
  // longer than the execution and the block is swapped).
  Ewma& block_estimate(int a, int b, bool resident) {
    Ewma& e = estimate[{a, b}];
    if (e.samples == 0 && e.value == 0) {
      double exec = 0, bytes = 0;
      for (int k = a; k <= b && k < static_cast<int>(costs.size()); ++k) {
        exec += costs[k].exec_ms;
        bytes += static_cast<double>(costs[k].bytes);
      }
      e.value = std::max(resident ? 0.0 : bytes * ms_per_byte, exec);
      if (e.value <= 0) e.value = 0.01;
    }
    return e;
  }
  // Under the runtime's lock, between steps: the expected times of the next block, of the rest
  // (next block included) and of the block after the next (0: none).
  struct Expected {
    double next = 0, rest = 0, then = 0;
  };
  Expected expected() {
    const ExecutionPlan& p = exec->plan();
    const int next = exec->in_inference() ? exec->next_layer() : 0;
    Expected e;
    int seen = 0;
    for (size_t b = 0; b < p.blocks.size(); ++b) {
      if (p.blocks[b].second < next) continue;
      const double ms = block_estimate(p.blocks[b].first, p.blocks[b].second, p.resident[b] != 0).value;
      if (seen == 0) e.next = ms;
      if (seen == 1) e.then = ms;
      ++seen;
      e.rest += ms;
    }
    return e;
  }
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

}  // namespace

struct Runtime::Impl {
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
  Clock::time_point t0 = Clock::now();
  Clock::time_point notified;
  // Central scheduling (RuntimeOptions::scheduler); null under "threads".
  std::unique_ptr<DispatchPolicy> dispatch;
  bool disk_aware = false;  // the models' reads take turns on their disk by urgency (dispatch.cpp)
  std::map<dev_t, std::shared_ptr<SharedDisk>> disks;  // disk-aware: one per device the images are on
  int free_workers = 0;
  double dispatch_us_sum = 0;
  std::uint64_t decisions = 0;

  // Note [Shedding off the caller's thread]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A cut makes each shrinking model give back at once what its running layer does not read
  // (Executor::shed). shed() takes the executor's lock, which the model's own thread holds while
  // it waits for its next block to land: vgg19's 411 MB block, read beside three other models,
  // held it for seconds, and set_budget() (so the control socket's answer to `swapnet ctl budget`,
  // and every other client behind it) waited as long (bench/storm.sh: 2,026 ms). set_budget()
  // now queues the sheds and returns; this thread does them in order, a later cut of the same
  // model superseding an earlier one. The change's took_ms still ends when the sheds are done.
  struct ShedOrder {
    size_t model = 0;
    std::uint64_t to = 0;     // the model's target when the cut was made
    std::uint64_t moves = 0;  // its budget_changes then (a move since makes the order moot)
  };
  std::deque<ShedOrder> sheds;  // under mu
  std::thread shedder;

  void shed_loop() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stop || !sheds.empty(); });
      if (stop) return;
      const ShedOrder o = sheds.front();
      sheds.pop_front();
      const bool superseded = std::any_of(sheds.begin(), sheds.end(), [&](const ShedOrder& l) { return l.model == o.model; });
      Worker& x = *w[o.model];
      if (superseded || target[o.model] != o.to || x.st.budget_changes != o.moves) continue;
      lk.unlock();
      const bool shed = x.exec->shed(o.to);
      lk.lock();
      if (!shed || x.st.budget_changes != o.moves || x.moving || target[o.model] != o.to) continue;  // moved meanwhile
      x.shed = true;
      x.shed_target = o.to;
      if (o.to == 0) keep_activations(x, false);
      note_if_settled();
      cv.notify_all();
    }
  }

  // Under mu: a job's read priority on its shared disk, told to the disk only when it moved.
  void set_read_priority(Worker& x, double p) {
    if (p == x.read_priority) return;
    x.read_priority = p;
    x.exec->set_read_priority(p);
  }
  // Under mu: hands free workers to waiting jobs, as the policy picks.
  void dispatch_locked() {
    bool changed = false;
    while (dispatch && free_workers > 0) {
      const Clock::time_point t = Clock::now();  // a decision: the candidates' refresh and the pick
      std::vector<DispatchCandidate> c;
      std::vector<size_t> who;
      for (size_t j = 0; j < w.size(); ++j) {
        if (w[j]->waiting) {
          if (dispatch->reads_unread()) {  // Note [The disk as a scheduled resource]
            // Never waits on a lock: when the executor or its reader is busy, the last value
            // stands (0 for a new candidate, as a blind policy sees it; a read never un-lands,
            // and a stale "unread" only defers the job one decision).
            Worker& x = *w[j];
            std::uint64_t unread = 0;
            if (x.exec->try_next_block_unread_bytes(&unread)) {
              x.cand.unread_ms = static_cast<double>(unread) * std::max(x.ms_per_byte, 1e-9);
            }
          }
          if (disk_aware) set_read_priority(*w[j], dispatch->urgency(w[j]->cand));
          c.push_back(w[j]->cand);
          who.push_back(j);
        }
      }
      if (c.empty()) break;
      const DispatchDecision d = dispatch->pick(c, ms_between(t0, t));
      dispatch_us_sum += ms_between(t, Clock::now()) * 1000;
      ++decisions;
      for (int k : d.drop) {
        w[who[static_cast<size_t>(k)]]->waiting = false;
        w[who[static_cast<size_t>(k)]]->grant = Grant::kDrop;
        changed = true;
      }
      if (d.pick < 0) {
        if (d.drop.empty()) break;
        continue;
      }
      Worker& x = *w[who[static_cast<size_t>(d.pick)]];
      x.waiting = false;
      x.grant = Grant::kGo;
      // The block now holding a core reads first: behind a more urgent job still waiting for a
      // core, its core would idle until that job's reads were done (priority inversion).
      if (disk_aware) set_read_priority(x, -std::numeric_limits<double>::infinity());
      --free_workers;
      changed = true;
    }
    if (changed) cv.notify_all();
  }
  // Worker i, unlocked on entry and return: waits for a worker for its next block, moving to a
  // new target meanwhile. false: the scheduler dropped the request.
  // *abandoned: the model was paused while waiting (the Error thrown says so).
  bool acquire(size_t i, const Request& r, std::unique_lock<std::mutex>& lk, bool* abandoned) {
    Worker& x = *w[i];
    lk.lock();
    while (true) {
      const Worker::Expected e = x.expected();
      x.cand = DispatchCandidate{static_cast<int>(i), ms_between(t0, r.arrival),
                                 r.deadline == Clock::time_point{} ? 0.0 : std::max(1e-3, ms_between(t0, r.deadline)),
                                 e.next, e.rest, e.then};
      x.grant = Grant::kNone;
      x.waiting = true;
      dispatch_locked();
      cv.wait(lk, [&] { return x.grant != Grant::kNone || stop || can_move(i); });
      if (x.grant != Grant::kNone) break;
      x.waiting = false;
      if (stop) {
        lk.unlock();
        throw Error(x.spec.name + ": runtime stopped");
      }
      ++x.st.mid_inference_moves;
      move(i, lk);
      if (x.budget == 0 || !x.exec->in_inference()) {
        const std::string why = reason[i];
        *abandoned = true;
        lk.unlock();
        throw Error(x.spec.name + ": paused in the middle of an inference, which was abandoned: " + why);
      }
    }
    const bool go = x.grant == Grant::kGo;
    x.grant = Grant::kNone;
    lk.unlock();
    return go;
  }
  // Worker i, unlocked: block [a, b] ran in `ms` on the worker it is giving back.
  void release(size_t i, std::pair<int, int> block, bool resident, double ms, std::unique_lock<std::mutex>& lk) {
    Worker& x = *w[i];
    lk.lock();
    ++free_workers;
    if (block.first >= 0 && ms > 0) {
      Ewma& e = x.block_estimate(block.first, block.second, resident);
      x.error_sum += std::abs(e.value - ms) / ms;
      ++x.error_n;
      x.st.estimate_error = x.error_sum / static_cast<double>(x.error_n);
      e.add(ms);
    }
    dispatch_locked();
    lk.unlock();
  }

  // What model j may hold now: its budget in force, or more while it moves to a larger one; once
  // shed, at most its minimum (the running layer's weights, activations), within its new budget.
  std::uint64_t holds(size_t j) const {
    const Worker& x = *w[j];
    if (x.moving) return std::max(x.budget, x.moving_to);
    if (x.shed) return std::min(x.budget, x.shed_target > 0 ? x.shed_target : demands[j].min_bytes);
    return x.budget;
  }
  bool shrink_pending() const {
    for (size_t j = 0; j < w.size(); ++j) {
      if (target[j] < holds(j)) return true;
    }
    return false;
  }
  // Every model runs at its target.
  bool settled() const {
    for (size_t j = 0; j < w.size(); ++j) {
      if (w[j]->moving || target[j] != w[j]->budget) return false;
    }
    return true;
  }
  // The change is in effect: every model runs at its target, or has shed down to within it and
  // moves when its running layer ends.
  bool in_effect() const {
    for (size_t j = 0; j < w.size(); ++j) {
      const Worker& x = *w[j];
      const bool at_target = !x.moving && target[j] == x.budget;
      if (!at_target && !(x.shed && target[j] > 0 && holds(j) <= target[j])) return false;
    }
    return true;
  }
  // Under mu: model i may move to its target now (Note [Moving to a new budget]).
  bool can_move(size_t i) const {
    if (target[i] == w[i]->budget) return false;
    return target[i] < w[i]->budget || !shrink_pending();
  }
  // Under mu: records when the latest change took effect, and when every model ran its new plan.
  void note_if_settled() {
    if (adaptations.empty()) return;
    Adaptation& a = adaptations.back();
    if (a.took_ms < 0 && in_effect()) {
      a.took_ms = ms_between(notified, Clock::now());
      log(LogLevel::kInfo, "runtime: budget " + format_bytes(a.budget_bytes) + " in effect after " +
                               std::to_string(a.took_ms) + " ms");
    }
    if (a.plans_ms < 0 && settled()) a.plans_ms = ms_between(notified, Clock::now());
  }
  // The model's activation cache (Note [Activation cache]): its reserve while it runs, none
  // while paused.
  static void keep_activations(Worker& x, bool running) {
    set_cpu_account_cache(x.account, running ? x.exec->plan().activation_bytes : 0);
  }
  void record_plan(Worker& x) {
    const ExecutionPlan& p = x.exec->plan();
    x.st.blocks = static_cast<int>(p.blocks.size());
    x.st.resident_blocks = static_cast<int>(std::count(p.resident.begin(), p.resident.end(), 1));
    x.st.predicted_ms = p.predicted_ms;
  }
  // Worker i, under `lk`: moves its executor to target[i] (unlocked while planning and reading).
  void move(size_t i, std::unique_lock<std::mutex>& lk) {
    Worker& x = *w[i];
    const std::uint64_t b = target[i];
    x.moving = true;
    x.moving_to = b;
    lk.unlock();
    const Clock::time_point started = Clock::now();
    std::string failure;
    try {
      if (b == 0) {
        x.exec->release();
      } else {
        x.exec->set_budget(b);
      }
    } catch (const std::exception& e) {
      failure = e.what();
      try {
        x.exec->release();
      } catch (...) {
      }
    }
    x.exec->reset_weight_peak();
    reset_cpu_account_peak(x.account);
    keep_activations(x, failure.empty() && b > 0);
    lk.lock();
    x.moving = false;
    x.shed = false;
    // What was applied is `b`: a later set_budget() may have changed target[i] meanwhile, and
    // then the worker moves again.
    x.budget = failure.empty() ? b : 0;
    if (!failure.empty()) {
      log(LogLevel::kError, x.spec.name + ": cannot move to " + format_bytes(b) + ": " + failure + "; paused");
      if (target[i] == b) target[i] = 0;
      reason[i] = failure;
    }
    if (!adaptations.empty() && adaptations.back().plans_ms < 0) {
      Adaptation& a = adaptations.back();
      a.moved_ms.resize(w.size(), -1);
      a.move_ms.resize(w.size(), -1);
      a.moved_ms[i] = ms_between(notified, Clock::now());
      a.move_ms[i] = ms_between(started, Clock::now());
    }
    x.st.paused = x.budget == 0;
    x.st.paused_reason = x.st.paused ? reason[i] : "";
    x.st.budget = x.budget;
    ++x.st.budget_changes;
    if (!x.st.paused) record_plan(x);
    note_if_settled();
    cv.notify_all();
  }
  // Worker i, under `lk`: runs one request block by block, moving to a new target between
  // blocks (Note [Moving to a new budget]).
  void serve(size_t i, Request r, std::unique_lock<std::mutex>& lk) {
    Worker& x = *w[i];
    lk.unlock();
    bool ok = false, abandoned = false, dropped = false, met = false;
    c10::IValue result;
    std::exception_ptr error;
    std::uint64_t over = 0, model_peak = 0, held = 0, act = 0, budget = 0, base = 0, learned_now = x.learned_seen;
    const bool central = dispatch != nullptr;
    try {
      x.exec->reset_weight_peak();
      reset_cpu_account_peak(x.account);
      base = cpu_account(x.account).current;
      x.exec->begin(std::move(r.inputs));
      while (true) {
        std::pair<int, int> block{-1, -1};
        bool resident = false;
        if (central) {
          if (!acquire(i, r, lk, &abandoned)) {
            dropped = true;
            throw Error(x.spec.name + ": dropped: its deadline can no longer be met");
          }
          const int b = x.next_block();
          if (b >= 0) {
            block = x.exec->plan().blocks[static_cast<size_t>(b)];
            resident = x.exec->plan().resident[static_cast<size_t>(b)] != 0;
          }
        }
        const Clock::time_point started = Clock::now();
        bool finished = false;
        try {
          finished = x.exec->step();
        } catch (...) {
          if (central) release(i, {-1, -1}, false, 0, lk);
          throw;
        }
        if (central) release(i, block, resident, ms_between(started, Clock::now()), lk);
        if (finished) break;
        lk.lock();
        if (can_move(i)) {
          ++x.st.mid_inference_moves;
          move(i, lk);  // resets the peaks: what follows is measured against the new budget
        }
        x.shed = false;  // moved, or goes on within the budget in force (re-read at the next step)
        const bool paused = x.budget == 0;
        const std::string why = reason[i];
        lk.unlock();
        if (paused || !x.exec->in_inference()) {
          abandoned = true;
          throw Error(x.spec.name + ": paused in the middle of an inference, which was abandoned: " + why);
        }
      }
      c10::IValue out = x.exec->finish();
      learned_now = learned_count(x.exec->learning());  // outside the runtime's lock (the executor takes its own)
      const bool late = r.deadline != Clock::time_point{} && Clock::now() > r.deadline;
      // Activations, and blocks lent their reserve's bytes (Note [Lending the activation
      // reserve] in executor.cpp), at once.
      act = cpu_account(x.account).peak_with_lent - base;
      const WeightMemory wm = x.exec->weight_memory();
      held = wm.held;
      model_peak = wm.peak + act;
      result = std::move(out);
      ok = true;
      met = !late;
    } catch (...) {
      if (x.exec->in_inference()) x.exec->abort();
      error = std::current_exception();
    }
    lk.lock();
    budget = x.budget;
    if (ok && held + act > budget) over = held + act;
    // A new input's activations, once measured, may have raised the reserve (Note [Dynamic shapes]).
    if (ok && budget > 0 && !x.shed) keep_activations(x, true);
    if (r.deadline != Clock::time_point{}) {
      ++x.st.deadline_requests;
      x.st.deadline_met += ok && met ? 1 : 0;
    }
    if (ok) {
      ++x.st.requests;
      x.st.peak_model_bytes = std::max(x.st.peak_model_bytes, model_peak);
      if (over) {
        ++x.st.over_budget;
        log_once(LogLevel::kWarn, "over_budget_" + x.spec.name,
                 x.spec.name + ": held " + std::to_string(over) + " bytes (weights " + std::to_string(held) +
                     " + activations " + std::to_string(act) + ") over its budget " + std::to_string(budget) +
                     " bytes (plan: " + std::to_string(x.exec->plan().total()) + " bytes, " +
                     std::to_string(x.exec->plan().blocks.size()) + " blocks, activations reserved " +
                     std::to_string(x.exec->plan().activation_bytes) + ")");
      }
    } else if (dropped) {
      ++x.st.dropped;
    } else if (abandoned) {
      ++x.st.abandoned;
    } else {
      ++x.st.failed;
    }
    // Reading ahead for a request not yet here comes after every request waiting.
    if (disk_aware) set_read_priority(x, std::numeric_limits<double>::infinity());
    // Answered once counted: status() read after a result includes it.
    lk.unlock();
    if (ok) {
      r.done.set_value(std::move(result));
    } else {
      r.done.set_exception(error);
    }
    lk.lock();
    if (learned_now != x.learned_seen) {  // after the answer: the caller does not wait for it
      try {
        learned(i, lk);
      } catch (const std::exception& e) {
        // Making the curve again (an executor without a grid builds one here) failed: the split
        // stays as it is, and this worker goes on serving.
        if (!lk.owns_lock()) lk.lock();
        x.learned_seen = learned_now;
        log(LogLevel::kWarn, x.spec.name + ": its costs were learned, but its latency curve could not be made again (" +
                                 e.what() + "): the budget split stays");
      }
    }
  }
  void loop(size_t i) {
    Worker& x = *w[i];
    if (!x.spec.cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : x.spec.cpus) CPU_SET(c, &set);
      if (int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set)) {
        log_once(LogLevel::kWarn, "pin_" + x.spec.name,
                 x.spec.name + ": cannot pin to its CPUs: " + std::string(std::strerror(rc)) + "; running unpinned");
      }
    }
    // OpenMP: a thread's pool size is its own once initialised; set ours after libtorch's
    // first-use initialisation so it is not overwritten.
    at::internal::lazy_init_num_threads();
    if (x.spec.threads > 0) at::set_num_threads(x.spec.threads);
    set_thread_cpu_account(x.account);
    c10::InferenceMode guard;
    std::unique_lock<std::mutex> lk(mu);
    while (true) {
      // A model that is paused but about to run again (waiting for others to shrink) keeps
      // its requests until it has moved.
      cv.wait(lk, [&] { return stop || can_move(i) || (!x.queue.empty() && (x.budget > 0 || target[i] == 0)); });
      if (stop) break;
      if (can_move(i)) {
        move(i, lk);
        continue;
      }
      Request r = std::move(x.queue.front());
      x.queue.pop_front();
      if (x.budget == 0) {
        ++x.st.rejected;
        r.done.set_exception(std::make_exception_ptr(Error(x.spec.name + ": paused: " + reason[i])));
        continue;
      }
      serve(i, std::move(r), lk);
    }
    for (auto& r : x.queue) r.done.set_exception(std::make_exception_ptr(Error(x.spec.name + ": runtime stopped")));
    x.queue.clear();
  }
  Allocation plan(std::uint64_t bytes) const { return allocate(*policy, demands, bytes); }
  // Note [Splitting with learned costs]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A model that learns its costs (ExecutorOptions::learn_after, Note [Learning the costs in
  // service] in executor.cpp) re-plans its own blocks within its budget; but the split between
  // models was made with the latency curves of its costs at open. Worker i, under `lk`, after an
  // inference in which its executor took learned costs (a plan put in force with them, or the
  // plan in force kept: Note [A re-plan must gain] in executor.cpp): its demand (curve, full bytes,
  // latency at full), the dispatcher's seeds (layer table, read time) are made again from the
  // learned costs, and the total is split again as a budget change would split it (an
  // adaptation noted "costs learned"; models move at block boundaries, shrinking ones shed). A
  // change under way is left alone: the next split (this one's, once settled, or the next
  // learned plan's) uses the new curve.
  void learned(size_t i, std::unique_lock<std::mutex>& lk) {
    Worker& x = *w[i];
    lk.unlock();
    // The executor is this thread's between inferences (shed() touches neither its grid nor costs).
    const Executor::Learning l = x.exec->learning();
    std::vector<std::pair<std::uint64_t, double>> curve = x.exec->latency_curve();
    std::vector<LayerCost> costs = layer_costs(x.exec->info(), x.spec.options);
    const double ms_per_byte = x.exec->cost().alpha_ms_per_byte;
    lk.lock();
    x.learned_seen = learned_count(l);
    x.costs = std::move(costs);
    x.ms_per_byte = ms_per_byte;
    x.estimate.clear();  // seeds of the old costs; measured blocks are measured again
    record_plan(x);
    ModelDemand& d = demands[i];
    d.curve = std::move(curve);
    d.full_bytes = std::max(d.curve.back().first, d.min_bytes);
    d.latency_ms = d.curve.back().second;
    log(LogLevel::kInfo, x.spec.name + ": costs learned (plan error " + std::to_string(l.plan_error) +
                             "): its latency curve now ends at " + std::to_string(d.latency_ms) + " ms");
    if (!settled() || total == 0) return;
    const Clock::time_point t = Clock::now();
    const Allocation a = plan(total);
    if (a.budgets == target) return;
    retarget(a, total, t, ms_between(t, Clock::now()), x.spec.name + "'s costs learned: " + a.note);
    cv.notify_all();
  }
  // Under the lock: `a` (for `bytes` in all) in force from `t` on, noted as an adaptation;
  // models that must shrink are interrupted and shed.
  void retarget(const Allocation& a, std::uint64_t bytes, Clock::time_point t, double plan_ms, const std::string& note) {
    total = bytes;
    set_targets(a);
    notified = t;
    Adaptation ad;
    ad.at_s = ms_between(t0, t) / 1000;
    ad.budget_bytes = bytes;
    ad.budgets = a.budgets;
    ad.plan_ms = plan_ms;
    ad.note = note;
    adaptations.push_back(std::move(ad));
    note_if_settled();
    // Models that must shrink stop at their next layer boundary to move, and give back at once
    // what their running layer does not read (Note [Shedding] in executor.cpp), on the
    // runtime's shedding thread (Note [Shedding off the caller's thread]).
    for (size_t i = 0; i < w.size(); ++i) {
      if (target[i] < holds(i)) {
        w[i]->exec->interrupt();
        sheds.push_back(ShedOrder{i, target[i], w[i]->st.budget_changes});
      }
    }
  }
  void set_targets(const Allocation& a) {
    target = a.budgets;
    reason.assign(w.size(), "");
    for (size_t i = 0; i < w.size(); ++i) {
      if (a.paused[i]) {
        reason[i] = "the total budget " + format_bytes(total) + " cannot hold every model's minimum, and " +
                    w[i]->spec.name + " (urgency " + std::to_string(w[i]->spec.urgency).substr(0, 4) +
                    ", minimum " + format_bytes(demands[i].min_bytes) + ") yields";
      }
    }
  }
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Runtime::~Runtime() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->shedder.joinable()) impl_->shedder.join();
  for (auto& x : impl_->w) {
    if (x->thread.joinable()) x->thread.join();
    Impl::keep_activations(*x, false);
  }
}

std::unique_ptr<Runtime> Runtime::open(std::vector<RuntimeModel> models, std::uint64_t total_budget,
                                       const RuntimeOptions& options) {
  if (models.empty()) throw Error("runtime: no models");
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.policy = options.custom ? options.custom : std::shared_ptr<const BudgetPolicy>(make_policy(options.policy));
  if (options.scheduler != "threads") {
    m.dispatch = make_dispatch_policy(options.scheduler, options.workers);
    if (options.workers < 1) throw Error("runtime: workers " + std::to_string(options.workers) + " must be >= 1");
    m.free_workers = options.workers;
    m.disk_aware = m.dispatch->reads_unread();
  }
  install_cpu_meter();
  const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
  for (auto& spec : models) {
    if (spec.name.empty()) throw Error(spec.image + ": a model needs a name");
    for (const auto& x : m.w) {
      if (x->spec.name == spec.name) throw Error("runtime: two models are named '" + spec.name + "'");
    }
    if (!(spec.urgency > 0)) throw Error(spec.name + ": urgency " + std::to_string(spec.urgency) + " must be > 0");
    for (int c : spec.cpus) {
      if (c < 0 || c >= cpus || c >= CPU_SETSIZE) {
        throw Error(spec.name + ": CPU " + std::to_string(c) + " does not exist (this machine has 0.." +
                    std::to_string(cpus - 1) + ")");
      }
    }
    ImageInfo info;
    read_image_info(spec.image, &info).throw_if_error();
    ExecutorOptions o = spec.options;
    o.budget = min_budget(info, o);  // opened small; the budgeter's share follows
    o.partition.clear();
    o.blocks = 0;
    o.resident.clear();
    if (o.grid_step == 0) o.grid_step = default_grid_step(info);
    struct stat st {};
    if (m.disk_aware && ::stat(spec.image.c_str(), &st) == 0) {
      auto& d = m.disks[st.st_dev];
      if (!d) d = std::make_shared<SharedDisk>(0);  // order only: a cap of one queue depth lost 46 % (docs/scheduler.md)
      o.reader.disk = d;
    }
    auto x = std::make_unique<Worker>();
    x->exec = Executor::open(spec.image, o);
    x->costs = layer_costs(x->exec->info(), o);
    x->ms_per_byte = o.cost.alpha_ms_per_byte;
    x->account = new_cpu_account();
    if (x->account == 0) {
      log_once(LogLevel::kWarn, "cpu_accounts", "runtime: all 255 CPU meter accounts are taken: activations of " +
                                                    spec.name + " and later models are not checked against their budgets");
    }
    x->spec = std::move(spec);
    ModelDemand d;
    d.name = x->spec.name;
    d.urgency = x->spec.urgency;
    d.min_bytes = x->exec->plan().min_budget;
    d.curve = x->exec->latency_curve();
    d.full_bytes = std::max(d.curve.back().first, d.min_bytes);
    d.latency_ms = d.curve.back().second;
    x->st.name = d.name;
    x->st.min_bytes = d.min_bytes;
    x->st.full_bytes = d.full_bytes;
    m.demands.push_back(std::move(d));
    m.w.push_back(std::move(x));
  }
  std::uint64_t sum_min = 0;
  std::string mins;
  for (const auto& d : m.demands) {
    sum_min += d.min_bytes;
    mins += (mins.empty() ? "" : ", ") + d.name + " " + format_bytes(d.min_bytes);
  }
  if (sum_min > total_budget) {
    throw Error("the scenario cannot fit: the models' minimum budgets sum to " + std::to_string(sum_min) + " bytes (" +
                format_bytes(sum_min) + ": " + mins + ") > the total budget " + std::to_string(total_budget) +
                " bytes (" + format_bytes(total_budget) + ")");
  }
  m.total = total_budget;
  const Allocation a = m.plan(total_budget);
  m.set_targets(a);
  for (size_t i = 0; i < m.w.size(); ++i) {
    Worker& x = *m.w[i];
    x.exec->set_budget(m.target[i]);
    x.exec->reset_weight_peak();
    x.budget = x.st.budget = m.target[i];
    Impl::keep_activations(x, x.budget > 0);
    m.record_plan(x);
  }
  log(LogLevel::kInfo, "runtime: " + a.note);
  m.t0 = Clock::now();
  // Owned at once, so that the threads already started are joined if starting one fails.
  std::unique_ptr<Runtime> rt(new Runtime(std::move(impl)));
  for (size_t i = 0; i < m.w.size(); ++i) m.w[i]->thread = std::thread([&m, i] { m.loop(i); });
  m.shedder = std::thread([&m] {
    pthread_setname_np(pthread_self(), "swapnet-shed");
    m.shed_loop();
  });
  return rt;
}

int Runtime::size() const { return static_cast<int>(impl_->w.size()); }
int Runtime::index(const std::string& name) const {
  for (size_t i = 0; i < impl_->w.size(); ++i) {
    if (impl_->w[i]->spec.name == name) return static_cast<int>(i);
  }
  return -1;
}
std::vector<ModelDemand> Runtime::demands() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->demands;
}
const Executor& Runtime::executor(int model) const { return *impl_->w.at(static_cast<size_t>(model))->exec; }
double Runtime::seconds() const { return ms_between(impl_->t0, Clock::now()) / 1000; }

std::future<c10::IValue> Runtime::submit(int model, std::vector<c10::IValue> inputs) {
  return submit(model, std::move(inputs), Clock::time_point{});
}

SharedDisk::Stats Runtime::disk_stats() const {
  SharedDisk::Stats sum;
  for (const auto& [dev, d] : impl_->disks) {
    const SharedDisk::Stats s = d->stats();
    sum.granted += s.granted;
    sum.deferred += s.deferred;
  }
  return sum;
}

double Runtime::dispatch_us() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->decisions ? impl_->dispatch_us_sum / static_cast<double>(impl_->decisions) : 0.0;
}

std::future<c10::IValue> Runtime::submit(int model, std::vector<c10::IValue> inputs, Clock::time_point deadline) {
  Impl& m = *impl_;
  if (model < 0 || model >= size()) throw Error("runtime: no model " + std::to_string(model));
  Request r;
  r.inputs = std::move(inputs);
  r.deadline = deadline;
  std::future<c10::IValue> f = r.done.get_future();
  {
    std::lock_guard<std::mutex> lk(m.mu);
    Worker& x = *m.w[static_cast<size_t>(model)];
    if (x.budget == 0 && m.target[static_cast<size_t>(model)] == 0) {
      ++x.st.rejected;
      r.done.set_exception(std::make_exception_ptr(Error(x.spec.name + ": paused: " + m.reason[static_cast<size_t>(model)])));
      return f;
    }
    x.queue.push_back(std::move(r));
  }
  m.cv.notify_all();
  return f;
}

void Runtime::set_budget(std::uint64_t total) {
  trace_instant(0, TraceLane::kControl, "total budget", -1, "bytes", static_cast<std::int64_t>(total));
  Impl& m = *impl_;
  const Clock::time_point t = Clock::now();
  std::vector<ModelDemand> demands;  // a worker may update one meanwhile (Note [Splitting with learned costs])
  {
    std::lock_guard<std::mutex> lk(m.mu);
    demands = m.demands;
  }
  const Allocation a = allocate(*m.policy, demands, total);
  const double plan_ms = ms_between(t, Clock::now());
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.retarget(a, total, t, plan_ms, a.note);
  }
  m.cv.notify_all();
  log(LogLevel::kInfo, "runtime: budget " + format_bytes(total) + ": " + a.note);
}

bool Runtime::wait_adapted(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(impl_->mu);
  return impl_->cv.wait_for(lk, timeout, [&] { return impl_->settled(); });
}

std::uint64_t Runtime::total_budget() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->total;
}
std::vector<Adaptation> Runtime::adaptations() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->adaptations;
}
std::uint64_t Runtime::held_bytes() const {
  std::uint64_t held = 0;
  for (const auto& m : status()) held += m.budget;
  return held;
}

std::string Runtime::status_json() const {
  nlohmann::json j;
  j["total_budget_bytes"] = total_budget();
  j["models"] = nlohmann::json::array();
  for (const auto& s : status()) {
    j["models"].push_back({{"name", s.name}, {"budget_bytes", s.budget}, {"paused", s.paused},
                           {"blocks", s.blocks}, {"requests", s.requests}});
  }
  // Where the process's memory is (bench/soak.sh samples it, to tell a leak from an allocator
  // keeping freed memory): tensors through libtorch's CPU allocator, swapnet's arenas, the
  // models' activation regions (Note [Activation cache]: mapped, in use, allocations placed and
  // not placed), and the C heap as glibc counts it (in use, free but kept, and mmapped chunks).
  const ActivationCacheStats cache = cpu_account_cache(0);
  nlohmann::json mem = {{"tensor_bytes", cpu_meter().current},
                        {"arena_bytes", memory_stats().current},
                        {"activation_cache_bytes", cache.mapped_bytes},
                        {"activation_cache_live_bytes", cache.live_bytes},
                        {"activation_cache_hits", cache.hits},
                        {"activation_cache_misses", cache.misses}};
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  const struct mallinfo2 mi = mallinfo2();
  mem["heap_in_use_bytes"] = mi.uordblks;
  mem["heap_free_bytes"] = mi.fordblks;
  mem["heap_mmap_bytes"] = mi.hblkhd;
#endif
  j["memory"] = mem;
  return j.dump();
}

std::vector<ModelStatus> Runtime::status() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<ModelStatus> out;
  for (const auto& x : impl_->w) out.push_back(x->st);
  return out;
}

}  // namespace swapnet
