// The multi-model Runtime's workers (scheduler.h): one thread per model takes its requests in
// turn and runs each block by block, moving to a new budget between blocks (Note [Moving to a
// new budget] in runtime.cpp); under a central scheduler each block waits for a worker, which
// the dispatch policy (dispatch.cpp) hands out.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>

#include "intra_op.h"
#include "runtime_impl.h"

namespace swapnet {

using runtime_detail::learned_count;
using runtime_detail::ms_between;
using runtime_detail::kStepMs;

namespace runtime_detail {

// What one request came to, filled in by serve()'s steps.
struct Served {
  bool ok = false, abandoned = false, dropped = false, met = false;
  c10::IValue result;
  std::exception_ptr error;
  std::uint64_t model_peak = 0, held = 0, act = 0, base = 0, learned_now = 0;
};

}  // namespace runtime_detail

// Worker i's thread: serves its requests in turn, and moves to a new target when it may.
void Runtime::Impl::loop(size_t i) {
  Worker& x = *w[i];
  pthread_setname_np(pthread_self(), "swapnet-model");
  if (!x.spec.cpus.empty()) {
    if (int rc = runtime_detail::pin_this_thread(x.spec.cpus)) {
      log_once(LogLevel::kWarn, "pin_" + x.spec.name,
               x.spec.name + ": cannot pin to its CPUs: " + std::string(std::strerror(rc)) + "; running unpinned");
    }
  }
  // OpenMP: a thread's pool size is its own once initialised; set ours after libtorch's
  // first-use initialisation so it is not overwritten. Under a central scheduler the steps run
  // on the compute threads, and this thread keeps no pool (Note [Compute threads]).
  if (dispatch) {
    release_intra_op_threads(true);
  } else if (x.spec.threads > 0) {
    runtime_detail::set_intra_op_threads_here(x.spec.threads);  // the process's default untouched
  }
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
// Worker i, under `lk`: runs one request block by block, moving to a new target between
// blocks (Note [Moving to a new budget]).
void Runtime::Impl::serve(size_t i, Request r, std::unique_lock<std::mutex>& lk) {
  Worker& x = *w[i];
  lk.unlock();
  Served s;
  s.learned_now = x.learned_seen;
  run_inference(i, r, lk, s);
  lk.lock();
  count_served(i, r, s);
  // Answered once counted: status() read after a result includes it.
  lk.unlock();
  if (s.ok) {
    r.done.set_value(std::move(s.result));
  } else {
    r.done.set_exception(s.error);
  }
  lk.lock();
  if (s.learned_now != x.learned_seen) {  // after the answer: the caller does not wait for it
    try {
      learned(i, lk);
    } catch (const std::exception& e) {
      // Making the curve again (an executor without a grid builds one here) failed: the split
      // stays as it is, and this worker goes on serving.
      if (!lk.owns_lock()) lk.lock();
      x.learned_seen = s.learned_now;
      log(LogLevel::kWarn, x.spec.name + ": its costs were learned, but its latency curve could not be made again (" +
                               e.what() + "): the budget split stays");
    }
  }
}
// Worker i, unlocked on entry and return: the request's inference, block by block, and what
// it measured; its failure is in `s.error`.
void Runtime::Impl::run_inference(size_t i, Request& r, std::unique_lock<std::mutex>& lk, Served& s) {
  Worker& x = *w[i];
  try {
    x.exec->reset_weight_peak();
    reset_cpu_account_peak(x.account);
    s.base = cpu_account(x.account).current;
    x.read_wait_ms = -1;  // read again at the first block (run_block)
    x.exec->begin(std::move(r.inputs));
    if (dispatch) {
      while (!run_step(i, r, lk, s)) between_blocks(i, lk, s);
    } else {
      while (!run_block(i, lk, s)) {
        note_use(i, s, lk);
        between_blocks(i, lk, s);
      }
      note_use(i, s, lk);
    }
    c10::IValue out = x.exec->finish();
    s.learned_now = learned_count(x.exec->learning());  // outside the runtime's lock (the executor takes its own)
    const bool late = r.deadline != Clock::time_point{} && Clock::now() > r.deadline;
    // Activations, and blocks lent their reserve's bytes (Note [Lending the activation
    // reserve] in zone_lender.cpp), at once.
    s.act = cpu_account(x.account).peak_with_lent - s.base;
    const WeightMemory wm = x.exec->weight_memory();
    s.held = wm.held;
    s.model_peak = wm.peak + s.act;
    s.result = std::move(out);
    s.ok = true;
    s.met = !late;
  } catch (...) {
    if (x.exec->in_inference()) x.exec->abort();
    s.error = std::current_exception();
    // Note [Steps of a grant]: a step a failure cut short gives its worker back (`holding` is
    // read under the runtime's lock, as it is written).
    const bool locked = lk.owns_lock();
    if (!locked) lk.lock();
    if (x.holding) {
      end_step(i);
      dispatch_locked();
    }
    if (!locked) lk.unlock();
  }
}
// Worker i's thread, unlocked on entry and return, under a central scheduler: waits for a
// worker, and runs the step it grants on a compute thread (Note [Compute threads]): blocks
// while the step holds its worker. Comes back between two blocks when the step ends or the
// model must move (the caller's between_blocks moves it). true: the inference is finished.
bool Runtime::Impl::run_step(size_t i, const Request& r, std::unique_lock<std::mutex>& lk, Served& s) {
  Worker& x = *w[i];
  if (!x.holding && !acquire(i, r, lk, &s.abandoned)) {
    s.dropped = true;
    throw Error(x.spec.name + ": dropped: its deadline can no longer be met");
  }
  bool finished = false;
  const int first = x.exec->next_layer();  // 0 between inferences
  const bool blas_first = first >= 0 && static_cast<size_t>(first) < x.blas_layers.size() && x.blas_layers[static_cast<size_t>(first)] != 0;
  const runtime_detail::ComputeSettings how{static_cast<int>(i), x.spec.threads, x.account, &x.spec.cpus, blas_first};
  auto step = [&] {
    std::unique_lock<std::mutex> clk(mu, std::defer_lock);  // this thread's hold on the runtime's lock
    while (true) {
      finished = run_block(i, clk, s);
      note_use(i, s, clk);
      if (finished || !x.holding || !between_blocks(i, clk, s, false)) return;
    }
  };
  compute->run(how, step);
  return finished;
}
// Worker i (or the compute thread running its step), unlocked on entry and return: runs the
// inference's next block, on the worker the central scheduler granted when there is one.
// true: the inference is finished.
bool Runtime::Impl::run_block(size_t i, std::unique_lock<std::mutex>& lk, Served& s) {
  Worker& x = *w[i];
  const bool central = dispatch != nullptr;
  std::pair<int, int> block{-1, -1};
  bool resident = false;
  if (central) {
    const int b = x.next_block();
    if (b >= 0) {
      block = x.exec->plan().blocks[static_cast<size_t>(b)];
      resident = x.exec->plan().resident[static_cast<size_t>(b)] != 0;
    }
  }
  const Clock::time_point started = Clock::now();
  // The executor's read wait so far: after this inference's last step, or read now (its first).
  if (central && x.read_wait_ms < 0) x.read_wait_ms = x.exec->pipeline_stats().read_wait_ms;
  bool finished = false;
  try {
    finished = x.exec->step();
  } catch (...) {
    if (central) release(i, {-1, -1}, false, 0, 0, false, lk);
    throw;
  }
  if (central) {
    const double ms = ms_between(started, Clock::now());
    const double waited = x.exec->pipeline_stats().read_wait_ms;
    const double wait_ms = waited - x.read_wait_ms;
    x.read_wait_ms = waited;
    release(i, block, resident, ms, wait_ms, !finished, lk);
  }
  return finished;
}
// Worker i, unlocked on entry and return: between two blocks, moves to a new target (Note
// [Moving to a new budget]); throws when the model was paused meanwhile. false: it must move
// and `may_move` is not set (a compute thread does not move a model: its step ends, and the
// model's thread moves it), nothing done.
bool Runtime::Impl::between_blocks(size_t i, std::unique_lock<std::mutex>& lk, Served& s, bool may_move) {
  Worker& x = *w[i];
  lk.lock();
  if (!may_move && can_move(i)) {
    lk.unlock();
    return false;
  }
  if (can_move(i)) {
    if (x.holding) end_step(i);
    dispatch_locked();  // Note [Handing a worker back]
    ++x.st.mid_inference_moves;
    move(i, lk);  // resets the peaks: what follows is measured against the new budget
  }
  x.shed = false;  // moved, or goes on within the budget in force (re-read at the next step)
  const bool paused = x.budget == 0;
  const bool abandon = paused || !x.exec->in_inference();
  if (abandon && x.holding) {
    end_step(i);
    dispatch_locked();
  }
  const std::string why = reason[i];
  lk.unlock();
  if (abandon) {
    s.abandoned = true;
    throw Error(x.spec.name + ": paused in the middle of an inference, which was abandoned: " + why);
  }
  return true;
}
// Worker i, unlocked on entry and return: its use after a block, for the ledger (Note [The
// memory ledger] in ledger.cpp): weights held, and activations at their peak so far.
void Runtime::Impl::note_use(size_t i, const Served& s, std::unique_lock<std::mutex>& lk) {
  Worker& x = *w[i];
  const std::uint64_t used = x.exec->held_bytes() + (cpu_account(x.account).peak_with_lent - s.base);
  lk.lock();
  ledger.use(i, used, Clock::now());
  lk.unlock();
}
// Worker i, under mu: counts the request served in the model's status.
void Runtime::Impl::count_served(size_t i, const Request& r, const Served& s) {
  Worker& x = *w[i];
  const std::uint64_t budget = x.budget;
  std::uint64_t over = 0;
  if (s.ok && s.held + s.act > budget) over = s.held + s.act;
  // A new input's activations, once measured, may have raised the reserve (Note [Dynamic shapes]).
  if (s.ok && budget > 0 && !x.shed) keep_activations(x, true);
  if (r.deadline != Clock::time_point{}) {
    ++x.st.deadline_requests;
    x.st.deadline_met += s.ok && s.met ? 1 : 0;
    x.met_share += 0.1 * ((s.ok && s.met ? 1.0 : 0.0) - x.met_share);
  }
  if (s.ok) ledger.use(i, s.held, Clock::now());  // its activations are gone
  if (s.ok) {
    ++x.st.requests;
    x.st.peak_model_bytes = std::max(x.st.peak_model_bytes, s.model_peak);
    if (over) {
      ++x.st.over_budget;
      log_once(LogLevel::kWarn, "over_budget_" + x.spec.name,
               x.spec.name + ": held " + std::to_string(over) + " bytes (weights " + std::to_string(s.held) +
                   " + activations " + std::to_string(s.act) + ") over its budget " + std::to_string(budget) +
                   " bytes (plan: " + std::to_string(x.exec->plan().total()) + " bytes, " +
                   std::to_string(x.exec->plan().blocks.size()) + " blocks, activations reserved " +
                   std::to_string(x.exec->plan().activation_bytes) + ")");
    }
  } else if (s.dropped) {
    ++x.st.dropped;
    x.est.forgive();  // Note [Block estimates under contention]
  } else if (s.abandoned) {
    ++x.st.abandoned;
  } else {
    ++x.st.failed;
  }
  // Reading ahead for a request not yet here comes after every request waiting.
  if (disk_aware) set_read_priority(x, std::numeric_limits<double>::infinity());
  dispatch_locked();  // a worker it gave back on a failure (Note [Handing a worker back])
}

// ---- central scheduling: a worker for each block ----

// Worker i, unlocked on entry and return: waits for a worker for its next block, moving to a
// new target meanwhile. false: the scheduler dropped the request.
// *abandoned: the model was paused while waiting (the Error thrown says so).
bool Runtime::Impl::acquire(size_t i, const Request& r, std::unique_lock<std::mutex>& lk, bool* abandoned) {
  Worker& x = *w[i];
  lk.lock();
  while (true) {
    // Beside the blocks running now, up to the other workers' number.
    const Worker::Expected e = x.expected(std::min(running, workers - 1), pace.factor());
    x.cand = DispatchCandidate{static_cast<int>(i), ms_between(t0, r.arrival),
                               r.deadline == Clock::time_point{} ? 0.0 : std::max(1e-3, ms_between(t0, r.deadline)),
                               e.next, e.rest, e.then};
    x.cand.met_share = x.met_share;
    x.cand.started = x.exec->in_inference() && x.exec->next_layer() > 0;
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
// Worker i, unlocked: block [a, b] ran in `ms` (`wait_ms` of them waiting for its bytes) on the
// worker its step holds; `more`: its inference goes on. Ends the step and gives the worker back,
// or keeps it for the next block (Note [Steps of a grant]).
//
// Note [Handing a worker back]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A job that gives its worker back between two blocks is not waiting yet: it asks again once
// it has looked for a budget move (between_blocks). Handing the worker out at once gave it to
// whoever else waited, so with one worker two models' blocks strictly alternated whatever the
// policy said: least slack could not finish the urgent request first, and on two_rates.json
// (2026-11-27) resnet101's requests ran at half speed, missed, and 0 of 157 were met. So the
// worker is handed out when the job asks again (acquire), among all who wait then, itself
// included; at once when its inference is done or failed, and before it moves (a move may take
// a while, and others should not wait on it).
//
// Note [Steps of a grant]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A grant holds its worker for a step: the block it was granted for, and the blocks after it
// while the step has run less than kStepMs. Plans cut big layers into many small blocks
// (vgg19's first classifier layer: 64 blocks of about 0.5 ms), and each block asked for its
// worker again: a decision, a wake-up and the lock, per half millisecond of work, and each
// block's time was half noise (0.4-1.3 ms for the same 0.5 ms block; self_driving_slo.json at
// load 0.9, 2026-11-28, vgg19's blocks of that layer were mis-estimated by a mean 0.13-0.39
// each). Replayed on two runs' block logs, steps of at least 2 ms made the estimates the
// scheduler ranks on off by a median over the models of 0.110 and 0.124 per step, against
// 0.144 and 0.162 per block (1 ms: 0.113/0.134; 5 ms: 0.110/0.126); in six runs after the
// change, 0.37-0.48 steps per block: fewer than half the decisions. A more urgent request waits at most that much longer for a worker. A step ends
// early when its model must move to a new budget (between_blocks), and each block is still
// estimated and learned alone (BlockEstimates::observe; estimate_block_error).
void Runtime::Impl::release(size_t i, std::pair<int, int> block, bool resident, double ms, double wait_ms, bool more,
                            std::unique_lock<std::mutex>& lk) {
  Worker& x = *w[i];
  lk.lock();
  const Clock::time_point now = Clock::now();
  tally(now);
  const double held_ms = ms_between(x.granted, now);
  // The mean number of other blocks beside this one while it held its worker.
  const double others = held_ms > 0 ? std::max(0.0, (busy_ms - x.busy_at_grant) / held_ms - 1) : 0;
  if (block.first >= 0 && ms > 0) {
    if (log_level() >= LogLevel::kDebug) log_block(i, block, resident, others, ms, wait_ms);
    pace.observe(x.est.observe(block.first, block.second, resident, others, ms, wait_ms, x.expected_next,
                               x.expected_unread));
    x.step_expected += x.expected_next;
    x.step_ms += ms;
  }
  if (more && x.step_ms < kStepMs && !stop && !can_move(i)) {
    x.holding = true;
    x.granted = busy_at;  // the next block's company is counted from here
    x.busy_at_grant = busy_ms;
    x.expected_next = x.expect_next_block(std::min(running - 1, workers - 1), pace.factor());
  } else {
    end_step(i);
    // Note [Handing a worker back]: a job with more blocks competes for the worker it gives back.
    if (!more) dispatch_locked();
  }
  lk.unlock();
}
// Under mu: worker i's step ends and its worker is free (handed out by the caller).
void Runtime::Impl::end_step(size_t i) {
  Worker& x = *w[i];
  x.est.observe_step(x.step_expected, x.step_ms);
  x.step_expected = x.step_ms = 0;
  x.holding = false;
  --running;
  ++free_workers;
  x.st.estimate_error = x.est.error();
  x.st.estimate_time_error = x.est.time_error();
  x.st.estimated_steps = x.est.steps();
  x.st.estimated_ms = x.est.measured_ms();
  x.st.estimate_block_error = x.est.block_error();
  x.st.estimated_blocks = x.est.observed();
  x.st.contention = x.est.contention();
}
// Under mu, at debug level: one line per block the central scheduler timed, for replaying its
// estimates (bench/estimates_replay.py): when it ended (ms on the monotonic clock, to set beside
// `perf record -k CLOCK_MONOTONIC`'s samples, and ms since the runtime started), the
// model, the block, what it took and what was expected of it, the machine's pace, and the
// process's CPU time so far (CPU over wall time between two lines: how many cores it had), the
// bytes all models' readers have landed so far (what the disk did between two lines), and the
// block's bytes unread when it was expected (-0.000001: not known; Note [Waits for the disk]).
void Runtime::Impl::log_block(size_t i, std::pair<int, int> block, bool resident, double others, double ms,
                              double wait_ms) {
  Worker& x = *w[i];
  timespec cpu{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  const double cpu_ms = static_cast<double>(cpu.tv_sec) * 1e3 + static_cast<double>(cpu.tv_nsec) / 1e6;
  std::uint64_t read = 0;
  for (const auto& y : w) read += y->exec->bytes_read();
  const auto now = Clock::now();
  char line[384];
  std::snprintf(line, sizeof line,
                "block: mono=%.3f t=%.3f model=%s first=%d last=%d resident=%d others=%.3f ms=%.4f wait=%.4f expected=%.4f "
                "pace=%.4f running=%d cpu_ms=%.3f read_mb=%.3f unread_mb=%.3f",
                ms_between(Clock::time_point{}, now), ms_between(t0, now), x.spec.name.c_str(), block.first, block.second,
                resident ? 1 : 0, others, ms,
                wait_ms, x.expected_next, pace.factor(), running, cpu_ms, static_cast<double>(read) / 1e6,
                x.expected_unread / 1e6);
  log(LogLevel::kDebug, line);
}
// At debug level, one line per request the policy dropped: when, the model, whether it had
// started, what remained of it against the time left, and its share of deadlines met lately.
void Runtime::Impl::log_drop(const DispatchCandidate& c, double now_ms) {
  char line[224];
  std::snprintf(line, sizeof line, "drop: t=%.3f model=%s started=%d remaining=%.3f left=%.3f waited=%.3f met_share=%.3f",
                now_ms, w[static_cast<size_t>(c.model)]->spec.name.c_str(), c.started ? 1 : 0, c.remaining_ms,
                c.deadline_ms - now_ms, now_ms - c.arrival_ms, c.met_share);
  log(LogLevel::kDebug, line);
}
// Under mu: hands free workers to waiting jobs, as the policy picks.
void Runtime::Impl::dispatch_locked() {
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
          const double unread = x.next_unread();
          if (unread >= 0) x.cand.unread_ms = unread * std::max(x.est.ms_per_byte(), 1e-9);
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
      if (log_level() >= LogLevel::kDebug) log_drop(c[static_cast<size_t>(k)], ms_between(t0, t));
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
    tally(Clock::now());
    ++running;
    x.granted = busy_at;
    x.busy_at_grant = busy_ms;
    // Its next block as it runs now: the bytes still unread have changed while it waited (and
    // no lock is waited on: the executor's is only tried).
    x.expected_next = x.expect_step_block(x.next_b, std::min(running - 1, workers - 1), pace.factor());
    // The block now holding a core reads first: behind a more urgent job still waiting for a
    // core, its core would idle until that job's reads were done (priority inversion).
    if (disk_aware) set_read_priority(x, -std::numeric_limits<double>::infinity());
    --free_workers;
    changed = true;
  }
  if (changed) cv.notify_all();
}
// Under mu: a job's read priority on its shared disk, told to the disk only when it moved.
void Runtime::Impl::set_read_priority(Worker& x, double p) {
  if (p == x.read_priority) return;
  x.read_priority = p;
  x.exec->set_read_priority(p);
}

}  // namespace swapnet
