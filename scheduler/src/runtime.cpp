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

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
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
};

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
    bool ok = false, abandoned = false;
    std::uint64_t over = 0, model_peak = 0, held = 0, act = 0, budget = 0, base = 0;
    try {
      x.exec->reset_weight_peak();
      reset_cpu_account_peak(x.account);
      base = cpu_account(x.account).current;
      x.exec->begin(std::move(r.inputs));
      while (!x.exec->step()) {
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
      act = cpu_account(x.account).peak - base;
      const WeightMemory wm = x.exec->weight_memory();
      held = wm.held;
      model_peak = wm.peak + act;
      r.done.set_value(std::move(out));
      ok = true;
    } catch (...) {
      if (x.exec->in_inference()) x.exec->abort();
      r.done.set_exception(std::current_exception());
    }
    lk.lock();
    budget = x.budget;
    if (ok && held + act > budget) over = held + act;
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
    } else if (abandoned) {
      ++x.st.abandoned;
    } else {
      ++x.st.failed;
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
  for (auto& x : impl_->w) {
    if (x->thread.joinable()) x->thread.join();
  }
}

std::unique_ptr<Runtime> Runtime::open(std::vector<RuntimeModel> models, std::uint64_t total_budget,
                                       const RuntimeOptions& options) {
  if (models.empty()) throw Error("runtime: no models");
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.policy = options.custom ? options.custom : std::shared_ptr<const BudgetPolicy>(make_policy(options.policy));
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
    o.budget = min_budget(info);  // opened small; the budgeter's share follows
    o.partition.clear();
    o.blocks = 0;
    o.resident.clear();
    if (o.grid_step == 0) o.grid_step = default_grid_step(info);
    auto x = std::make_unique<Worker>();
    x->exec = Executor::open(spec.image, o);
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
    m.record_plan(x);
  }
  log(LogLevel::kInfo, "runtime: " + a.note);
  m.t0 = Clock::now();
  // Owned at once, so that the threads already started are joined if starting one fails.
  std::unique_ptr<Runtime> rt(new Runtime(std::move(impl)));
  for (size_t i = 0; i < m.w.size(); ++i) m.w[i]->thread = std::thread([&m, i] { m.loop(i); });
  return rt;
}

int Runtime::size() const { return static_cast<int>(impl_->w.size()); }
int Runtime::index(const std::string& name) const {
  for (size_t i = 0; i < impl_->w.size(); ++i) {
    if (impl_->w[i]->spec.name == name) return static_cast<int>(i);
  }
  return -1;
}
const std::vector<ModelDemand>& Runtime::demands() const { return impl_->demands; }
const Executor& Runtime::executor(int model) const { return *impl_->w.at(static_cast<size_t>(model))->exec; }
double Runtime::seconds() const { return ms_between(impl_->t0, Clock::now()) / 1000; }

std::future<c10::IValue> Runtime::submit(int model, std::vector<c10::IValue> inputs) {
  Impl& m = *impl_;
  if (model < 0 || model >= size()) throw Error("runtime: no model " + std::to_string(model));
  Request r;
  r.inputs = std::move(inputs);
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
  Impl& m = *impl_;
  std::vector<std::tuple<size_t, std::uint64_t, std::uint64_t>> shrink;  // model, target, its moves so far
  const Clock::time_point t = Clock::now();
  const Allocation a = m.plan(total);
  const double plan_ms = ms_between(t, Clock::now());
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.total = total;
    m.set_targets(a);
    m.notified = t;
    Adaptation ad;
    ad.at_s = ms_between(m.t0, t) / 1000;
    ad.budget_bytes = total;
    ad.budgets = a.budgets;
    ad.plan_ms = plan_ms;
    ad.note = a.note;
    m.adaptations.push_back(std::move(ad));
    m.note_if_settled();
    // Models that must shrink stop at their next layer boundary to move, and give back at once
    // what their running layer does not read (Note [Shedding] in executor.cpp).
    for (size_t i = 0; i < m.w.size(); ++i) {
      if (m.target[i] < m.holds(i)) {
        m.w[i]->exec->interrupt();
        shrink.emplace_back(i, m.target[i], m.w[i]->st.budget_changes);
      }
    }
  }
  m.cv.notify_all();
  for (const auto& [i, to, moves] : shrink) {
    Worker& x = *m.w[i];
    if (!x.exec->shed(to)) continue;
    std::lock_guard<std::mutex> lk(m.mu);
    if (x.st.budget_changes != moves || x.moving || m.target[i] != to) continue;  // it has moved meanwhile
    x.shed = true;
    x.shed_target = to;
    m.note_if_settled();
  }
  log(LogLevel::kInfo, "runtime: budget " + format_bytes(total) + ": " + a.note);
  m.cv.notify_all();
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
  return j.dump();
}

std::vector<ModelStatus> Runtime::status() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<ModelStatus> out;
  for (const auto& x : impl_->w) out.push_back(x->st);
  return out;
}

}  // namespace swapnet
