// The multi-model Runtime's budget changes (scheduler.h): set_budget() splits the new total
// and sets targets; each worker moves its executor at an inference boundary or between two
// blocks; models that must shrink shed at once, on the runtime's shedding thread. A model that
// learns its costs has the total split again with them. Open and the rest of the API are in
// runtime_api.cpp, the workers in runtime_worker.cpp.
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
#include <algorithm>
#include <string>
#include <vector>

#include "runtime_impl.h"

namespace swapnet {

using runtime_detail::Clock;
using runtime_detail::learned_count;
using runtime_detail::ms_between;

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

// ---- where the models stand ----

// What model j may hold now: its budget in force, or more while it moves to a larger one; once
// shed, at most its minimum (the running layer's weights, activations), within its new budget.
std::uint64_t Runtime::Impl::holds(size_t j) const {
  const Worker& x = *w[j];
  if (x.moving) return std::max(x.budget, x.moving_to);
  if (x.shed) return std::min(x.budget, x.shed_target > 0 ? x.shed_target : demands[j].min_bytes);
  return x.budget;
}
bool Runtime::Impl::shrink_pending() const {
  for (size_t j = 0; j < w.size(); ++j) {
    if (target[j] < holds(j)) return true;
  }
  return false;
}
// Every model runs at its target.
bool Runtime::Impl::settled() const {
  for (size_t j = 0; j < w.size(); ++j) {
    if (w[j]->moving || target[j] != w[j]->budget) return false;
  }
  return true;
}
// The change is in effect: every model runs at its target, or has shed down to within it and
// moves when its running layer ends.
bool Runtime::Impl::in_effect() const {
  for (size_t j = 0; j < w.size(); ++j) {
    const Worker& x = *w[j];
    const bool at_target = !x.moving && target[j] == x.budget;
    if (!at_target && !(x.shed && target[j] > 0 && holds(j) <= target[j])) return false;
  }
  return true;
}
// Under mu: model i may move to its target now (Note [Moving to a new budget]).
bool Runtime::Impl::can_move(size_t i) const {
  if (target[i] == w[i]->budget) return false;
  return target[i] < w[i]->budget || !shrink_pending();
}
// Under mu: records when the latest change took effect, and when every model ran its new plan.
void Runtime::Impl::note_if_settled() {
  if (adaptations.empty()) return;
  Adaptation& a = adaptations.back();
  if (in_effect()) ledger.in_effect(Clock::now());
  if (a.took_ms < 0 && in_effect()) {
    a.took_ms = ms_between(notified, Clock::now());
    log(LogLevel::kInfo, "runtime: budget " + format_bytes(a.budget_bytes) + " in effect after " +
                             std::to_string(a.took_ms) + " ms");
  }
  if (a.plans_ms < 0 && settled()) a.plans_ms = ms_between(notified, Clock::now());
}
// The model's activation cache (Note [Activation cache]): its reserve while it runs, none
// while paused.
void Runtime::Impl::keep_activations(Worker& x, bool running) {
  set_cpu_account_cache(x.account, running ? x.exec->plan().activation_bytes : 0);
}
void Runtime::Impl::record_plan(Worker& x) {
  const ExecutionPlan& p = x.exec->plan();
  x.st.blocks = static_cast<int>(p.blocks.size());
  x.st.resident_blocks = static_cast<int>(std::count(p.resident.begin(), p.resident.end(), 1));
  x.st.predicted_ms = p.predicted_ms;
}

// ---- moving, shedding, splitting again ----

// Worker i, under `lk`: moves its executor to target[i] (unlocked while planning and reading).
void Runtime::Impl::move(size_t i, std::unique_lock<std::mutex>& lk) {
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
  const std::uint64_t used = x.exec->held_bytes() + cpu_account(x.account).current;
  lk.lock();
  ledger.use(i, used, Clock::now());
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

// Note [Shedding off the caller's thread]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A cut makes each shrinking model give back at once what its running layer does not read
// (Executor::shed). shed() takes the executor's lock, which the model's own thread holds while
// it waits for its next block to land: vgg19's 411 MB block, read beside three other models,
// held it for seconds, and set_budget() (so the control socket's answer to `swapnet ctl budget`,
// and every other client behind it) waited as long (bench/storm.sh: 2,026 ms). set_budget()
// now queues the sheds and returns; the shedding thread (shed_loop) does them in order, a later
// cut of the same model superseding an earlier one. The change's took_ms still ends when the
// sheds are done.
void Runtime::Impl::shed_loop() {
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
    const std::uint64_t used = x.exec->held_bytes() + cpu_account(x.account).current;
    lk.lock();
    if (shed) ledger.use(o.model, used, Clock::now());
    if (!shed || x.st.budget_changes != o.moves || x.moving || target[o.model] != o.to) continue;  // moved meanwhile
    x.shed = true;
    x.shed_target = o.to;
    if (o.to == 0) keep_activations(x, false);
    note_if_settled();
    cv.notify_all();
  }
}

// Note [Splitting with learned costs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model that learns its costs (ExecutorOptions::learn_after, Note [Learning the costs in
// service] in cost_learner.cpp) re-plans its own blocks within its budget; but the split between
// models was made with the latency curves of its costs at open. Worker i, under `lk`, after an
// inference in which its executor took learned costs (a plan put in force with them, or the
// plan in force kept: Note [A re-plan must gain] in executor_learn.cpp): its demand (curve, full bytes,
// latency at full), the dispatcher's seeds (layer table, read time) are made again from the
// learned costs, and the total is split again as a budget change would split it (an
// adaptation noted "costs learned"; models move at block boundaries, shrinking ones shed). A
// change under way is left alone: the next split (this one's, once settled, or the next
// learned plan's) uses the new curve.
void Runtime::Impl::learned(size_t i, std::unique_lock<std::mutex>& lk) {
  Worker& x = *w[i];
  lk.unlock();
  // The executor is this thread's between inferences (shed() touches neither its grid nor costs).
  const Executor::Learning l = x.exec->learning();
  std::vector<std::pair<std::uint64_t, double>> curve = x.exec->latency_curve();
  std::vector<LayerCost> costs = layer_costs(x.exec->info(), x.spec.options);
  const double ms_per_byte = x.exec->cost().alpha_ms_per_byte;
  lk.lock();
  x.learned_seen = learned_count(l);
  x.est.set_costs(std::move(costs), ms_per_byte);  // measured blocks are measured again
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
void Runtime::Impl::retarget(const Allocation& a, std::uint64_t bytes, Clock::time_point t, double plan_ms, const std::string& note) {
  total = bytes;
  ledger.announce(bytes, t);
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
  // what their running layer does not read (Note [Shedding] in executor_memory.cpp), on the
  // runtime's shedding thread (Note [Shedding off the caller's thread]).
  for (size_t i = 0; i < w.size(); ++i) {
    if (target[i] < holds(i)) {
      w[i]->exec->interrupt();
      sheds.push_back(ShedOrder{i, target[i], w[i]->st.budget_changes});
    }
  }
}
void Runtime::Impl::set_targets(const Allocation& a) {
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

}  // namespace swapnet
