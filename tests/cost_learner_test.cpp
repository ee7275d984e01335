// The CostLearner alone (assembly/src/cost_learner.cpp, compiled into this binary: it is internal
// to the assembly module), fed layer times made up here on a clock made up here: what it decides
// from them does not depend on this VM's load, as an executor's inferences do.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "cost_learner.h"

namespace swapnet {
namespace {

using Clock = std::chrono::steady_clock;

// A model of `layers` layers whose plan is predicted as the sum of its layer times (all resident:
// nothing read), and a learner that re-plans, as the executor does, whenever it decides.
struct Learning {
  explicit Learning(CostLearner::Config c, std::size_t layers, double planned_ms)
      : learner(c, layers), planned_ms(layers, planned_ms), costs(layers) {
    for (std::size_t i = 0; i < layers; ++i) costs[i].exec_ms = planned_ms;
    learner.restart(count());
  }
  CostLearner::IoCount count() const { return {{}, {}, now}; }
  // One inference whose layers took `ms` each: the clock moves on by their sum.
  void infer(const std::vector<double>& ms) {
    learner.begin();
    double sum = 0;
    for (std::size_t k = 0; k < ms.size(); ++k) learner.time_layer(static_cast<int>(k), ms[k]), sum += ms[k];
    now += std::chrono::microseconds(static_cast<long long>(sum * 1e3));
    ASSERT_TRUE(learner.timed(true));
    auto predict = [](const std::vector<LayerCost>& c, const CostModel&) {
      double t = 0;
      for (const LayerCost& l : c) t += l.exec_ms;
      return t;
    };
    auto d = learner.observe(count(), planned_ms, costs, CostModel{}, predict);
    if (!d) return;
    ++decisions;
    ASSERT_TRUE(d->take_times) << d->what;
    planned_ms = d->layer_ms;
    for (std::size_t i = 0; i < costs.size(); ++i) costs[i].exec_ms = planned_ms[i];
    learner.restart(count());
  }
  double planned_sum() const {
    double t = 0;
    for (double v : planned_ms) t += v;
    return t;
  }
  CostLearner learner;
  std::vector<double> planned_ms;
  std::vector<LayerCost> costs;
  Clock::time_point now = Clock::now();
  int decisions = 0;
};

CostLearner::Config config(double window_ms) {
  CostLearner::Config c;
  c.every = 3;  // learn_after 3
  c.window_ms = window_ms;
  c.threshold = 0.1;
  return c;
}

// Note [Noise in the window]: inputs of two sizes in turn, the larger's layers 4 ms and the
// smaller's 1 ms (±15 % each, at random), planned with the larger's times (the image's). The
// mixture is learned once, at ~2.5 ms a layer (a window's median of three inferences was one size
// or the other as its count tipped, and learned again and again), and kept over 2,000 inferences
// (100 s of the made-up clock). The executor's own test of this (executor_learn_test.cpp) runs
// on this VM's clock, where another process's load is a change of costs too.
TEST(CostLearner, InputsOfTwoSizesInTurnAreLearnedOnce) {
  constexpr std::size_t kLayers = 20;
  Learning l(config(1000), kLayers, 4.0);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> jitter(0.85, 1.15);
  std::vector<double> ms(kLayers);
  for (int n = 0; n < 2000; ++n) {
    for (double& v : ms) v = (n % 2 == 0 ? 4.0 : 1.0) * jitter(rng);
    l.infer(ms);
  }
  EXPECT_EQ(l.decisions, 1) << "re-plans in 2,000 inferences";
  EXPECT_NEAR(l.planned_sum(), 2.5 * kLayers, 0.1 * 2.5 * kLayers) << "the mixture's mean, learned";
  EXPECT_GE(l.learner.stats().windows, 20u) << "windows measured after it, and none re-planned";
}

// A plan whose costs are right is never re-planned however noisy its inferences (±50 %), and one
// whose costs are off by 30 % is re-planned once: the threshold is 10 %.
TEST(CostLearner, NoiseAloneNeverReplans) {
  constexpr std::size_t kLayers = 20;
  for (double truth : {4.0, 5.2}) {
    Learning l(config(1000), kLayers, 4.0);
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    std::vector<double> ms(kLayers);
    for (int n = 0; n < 2000; ++n) {
      for (double& v : ms) v = truth * jitter(rng);
      l.infer(ms);
    }
    EXPECT_EQ(l.decisions, truth == 4.0 ? 0 : 1) << "layers at " << truth << " ms, planned at 4";
  }
}

}  // namespace
}  // namespace swapnet
