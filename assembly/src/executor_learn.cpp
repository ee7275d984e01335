// Costs learned in service put to use (Note [Learning the costs in service] in cost_learner.cpp):
// the CostLearner decides which costs to take; here they are taken, and a plan made with them is
// put in force only where it gains (Note [A re-plan must gain]).
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "executor_impl.h"

namespace swapnet {

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
// Which device learned costs are for (Note [Learned costs kept]): "cpu", or "cuda:0 (GPU NAME)".
std::string learned_device(const Executor::Impl& m) {
  const c10::Device d = m.backend->device();
  return d.is_cuda() ? d.str() + " (" + cuda_device().name + ")" : d.str();
}
}  // namespace

bool learns(const Executor::Impl& m) {
  // A partition or block count given at open (Impl::opt keeps them) is the user's: not learned.
  const bool fixed_plan = !m.opt.partition.empty() || m.opt.blocks > 0;
  return m.opt.learn_after > 0 && m.caps().learns && !fixed_plan && m.opt.planner == ExecutorOptions::Planner::kOptimal;
}

void take_layer_times(Executor::Impl& m, bool wait) {
  m.backend->take_layer_times(wait, [&](int layer, double ms) { m.learner->time_layer(layer, ms); });
}

void load_learned(Executor::Impl& m) {
  if (!learns(m)) return;
  std::optional<LearnedCosts> got = load_learned_costs(m.opt.learn_store, m.path, m.info, learned_device(m), m.opt.measured_exec);
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
static void store_learned(Executor::Impl& m) {
  const std::string& path = m.opt.learn_store;
  if (path.empty()) return;
  CostLearner& l = *m.learner;
  const std::vector<double> t = m.planner->layer_ms();
  const double alpha = m.planner->cost().alpha_ms_per_byte;
  const double mb_s = l.rate_learned && alpha > 0 ? 1e-3 / alpha : 0.0;
  if (store_learned_costs(path, m.path, m.info, learned_device(m), l.times_learned ? &t : nullptr, mb_s)) ++l.stats().stored;
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


}  // namespace swapnet
