// Tests of swapnet::Executor learning its costs in service (Note [Learning the costs in service]):
// the layer times and read rate taken, re-plans only where they gain (Note [A re-plan must gain]),
// the budget grid rebuilt, the learned costs kept for the next executor.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <torch/script.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <chrono>
#include <thread>
#include <vector>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "swapnet/assembly.h"
#include "packed.h"
#include "test_util.h"
#include "executor_test.h"

namespace swapnet {
namespace {

using namespace executor_test;  // the helpers and test_util's names (executor_test.h)

// Note [Learning the costs in service]: an image whose last layer says it takes 10 s and a cost
// model that says the disk reads 10 GB/s, on a disk that reads 100 MB/s (emulated): after
// learn_after inferences the executor plans with the layer times it measured (the 10 s layer
// hid any read rate), after learn_after more with the rate too, within the same budget and
// bit-identical; without learn_after it never does. The rate is the sustained one also where the
// disk credits its idle time as a burst, as the blkio throttle does (Note [A sustained read rate]).
TEST(Executor, LearnsTheLayerTimesAndTheReadRateItRunsAt) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const int last = static_cast<int>(pk.info.layers.size()) - 1;
  const std::string img = test_util::with_slow_last_layer(pk, "resnet18-slow-last");
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  install_cpu_meter();
  for (auto [learn, credit] : {std::pair{0, 0.0}, std::pair{3, 0.0}, std::pair{3, 0.1}}) {
    const std::string what = "learn_after " + std::to_string(learn) + (credit > 0 ? ", idle credited" : "");
    ExecutorOptions o;
    o.budget = std::max(pk.info.data_size / 3, min_budget(pk.info));
    o.cost.alpha_ms_per_byte = 1.0 / 1e7;  // 10 GB/s
    o.reader.emulate_bytes_per_s = 100e6;
    o.reader.emulate_idle_credit_s = credit;
    o.learn_after = learn;
    auto ex = Executor::open(img, o);
    ASSERT_GT(ex->plan().read_bytes, 4u << 20) << "the plan reads enough for a rate";
    for (int bad : {-1, 1, 2, 1001}) {
      ExecutorOptions b = o;
      b.learn_after = bad;
      const std::string e = error_of([&] { Executor::open(img, b); });
      EXPECT_NE(e.find("learn_after " + std::to_string(bad) + " is not 0 (never) or 3..1000 inferences"), std::string::npos) << e;
    }
    const double at_open = ex->plan().predicted_ms;
    EXPECT_GT(at_open, 1e4) << what;
    for (int i = 0; i < 7; ++i) {
      reset_cpu_meter_peak();
      const std::uint64_t base = cpu_meter().current;
      EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal) << what << " inference " << i;
      EXPECT_LE(ex->plan().total(), o.budget) << what << " inference " << i;
      EXPECT_LE(ex->weight_memory().peak + (cpu_meter().peak_with_lent - base), o.budget) << what << " inference " << i;
      ex->reset_weight_peak();
      // A pause between inferences: the disk idles once the ring is full, and one that credits
      // idle time serves a burst at the next inference.
      if (credit > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    const Executor::Learning l = ex->learning();
    if (learn == 0) {
      EXPECT_EQ(l.windows, 0u);
      EXPECT_EQ(ex->info().layers[last].time_ms, 1e4);
      EXPECT_EQ(ex->cost().alpha_ms_per_byte, 1.0 / 1e7);
      EXPECT_EQ(ex->plan().predicted_ms, at_open);
      continue;
    }
    EXPECT_EQ(l.windows, 2u);
    EXPECT_EQ(l.replans, 2u) << "two windows, each took costs: plan error " << l.plan_error;
    // Each put a plan in force or kept the one in force, predicted no more than 2 % slower
    // (Note [A re-plan must gain]): which, depends on how this run's layers timed.
    EXPECT_EQ(l.adopted + l.kept_plans, l.replans);
    EXPECT_LT(ex->info().layers[last].time_ms, 100) << "the last layer's time measured";
    const double mb_s = 1e-3 / ex->cost().alpha_ms_per_byte;
    EXPECT_GT(mb_s, 70) << what << ": the emulated disk reads 100 MB/s";
    // Bytes / busy time learned 126 MB/s here with idle credited.
    EXPECT_LT(mb_s, 115) << what << ": the emulated disk reads 100 MB/s";
    if (l.adopted == 2) {
      EXPECT_LT(l.predicted_before_ms, 1e3) << "the layer times learned first";
      EXPECT_GT(l.predicted_after_ms, l.predicted_before_ms) << "then the read rate";
      EXPECT_EQ(ex->plan().predicted_ms, l.predicted_after_ms);
    }
    // The plan in force, put in force or kept, is predicted with the costs learned: the 10 s
    // layer is gone, and the reads of 100 MB/s take their time.
    EXPECT_LT(ex->plan().predicted_ms, 5e3);
    EXPECT_GT(ex->plan().predicted_ms, static_cast<double>(ex->plan().read_bytes) / 100e6 * 1e3 * 0.7);
  }
}

// Note [A re-plan must gain]: with every block resident, costs learned far from the planned ones
// (a last layer said to take 10 s) are taken, but the best plan with them is the plan in force:
// it stays, with its prediction redone, and is not put in force again.
TEST(Executor, AReplanThatGainsNothingKeepsThePlan) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const int last = static_cast<int>(pk.info.layers.size()) - 1;
  const std::string img = test_util::with_slow_last_layer(pk, "resnet18-slow-last-kept");
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  ExecutorOptions o;
  o.budget = 2 * pk.info.data_size;  // all resident: no plan is faster than the one in force
  o.learn_after = 3;
  auto ex = Executor::open(img, o);
  const ExecutionPlan before = ex->plan();
  ASSERT_GT(before.predicted_ms, 1e4);
  // A window spans a second at least (Note [Noise in the window]); 30 s at most under sanitizers.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int i = 0; std::chrono::steady_clock::now() < until && ex->learning().replans == 0; ++i) {
    EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal) << "inference " << i;
  }
  const Executor::Learning l = ex->learning();
  ASSERT_GE(l.replans, 1u) << "the 10 s layer is off by far more than the threshold";
  EXPECT_EQ(l.kept_plans, l.replans);
  EXPECT_EQ(l.adopted, 0u) << "no plan put in force again";
  EXPECT_LT(ex->info().layers[last].time_ms, 100) << "the costs are taken all the same";
  EXPECT_EQ(ex->plan().blocks, before.blocks);
  EXPECT_EQ(ex->plan().resident, before.resident);
  EXPECT_LT(ex->plan().predicted_ms, 1e3) << "the plan in force predicted with the costs taken";
  EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);
}

// Note [A re-plan must gain], the other way: a cost model that says the disk reads 10 GB/s on a
// disk that reads 20 MB/s (emulated) plans for reads that cost nothing; with the rate learned,
// the best plan reads less and is predicted far faster, and it is put in force.
TEST(Executor, AReplanThatGainsPutsTheNewPlanInForce) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  install_cpu_meter();
  ExecutorOptions o;
  o.budget = std::max(pk.info.data_size / 2, min_budget(pk.info));
  o.cost.alpha_ms_per_byte = 1.0 / 1e7;  // 10 GB/s
  o.reader.emulate_bytes_per_s = 20e6;
  o.learn_after = 3;
  // Three tries of 40 s at most, each a new executor: on this 2-core VM beside the other tests the
  // first window once learned layer times that carried the reads' stalls, so that reading less
  // predicted no gain and the plan was kept (re-plans 1, kept 1, plan error 0.4 %, the costs
  // right from then on: no second re-plan in 60 s), once in ~15 full runs. Beside a process
  // spinning on one core the first try kept its plan in 3 of 6 runs (2026-11-29, and as often in
  // a build of a week before), and both of two tries failed in two loaded runs that day. A
  // learner that never puts a faster plan in force fails all three.
  std::unique_ptr<Executor> ex;
  std::uint64_t read_before = 0;
  for (int attempt = 0; attempt < 3 && (!ex || ex->learning().adopted == 0); ++attempt) {
    if (ex) std::cerr << "try " << attempt << ": re-plans " << ex->learning().replans << ", kept "
                      << ex->learning().kept_plans << ", plan error " << ex->learning().plan_error << "\n";
    ex = Executor::open(pk.img, o);
    read_before = ex->plan().read_bytes;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(40);
    for (int i = 0; std::chrono::steady_clock::now() < until && ex->learning().adopted == 0; ++i) {
      EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal) << "inference " << i;
    }
  }
  const Executor::Learning l = ex->learning();
  EXPECT_GE(l.adopted, 1u) << "re-plans " << l.replans << ", kept " << l.kept_plans << ", plan error " << l.plan_error;
  EXPECT_LT(ex->plan().read_bytes, read_before) << "the plan put in force reads less";
  EXPECT_LT(l.predicted_after_ms, 0.98 * l.predicted_before_ms * (1 + l.plan_error))
      << "predicted faster than the plan it replaced, with the same costs";
  EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);
  EXPECT_LE(ex->plan().total(), o.budget);
}

// Note [Noise in the window]: inputs of two sizes in turn (a detector's crops of 128 and 64
// pixels) make every other inference several times as long. A window of three inferences drew
// its medians from one size or the other in turn, and every window or two was "off" by more than
// the threshold; a window of a second, that must stand out of its own noise, learns the mixture
// once (from the image's times, which are the larger input's) and keeps it.
TEST(Executor, InputsOfTwoSizesInTurnAreLearnedOnce) {
  Packed pk = packed("resnet18", {1, 3, 128, 128});
  const std::string img = test_util::with_layer_times(pk, "resnet18-two-sizes", [](int, double t) { return t; });
  const std::vector<at::Tensor> x = {torch::randn({1, 3, 128, 128}), torch::randn({1, 3, 64, 64})};
  const std::vector<c10::IValue> expected = {reference(pk.m, x[0]), reference(pk.m, x[1])};
  ExecutorOptions o;
  o.budget = 2 * pk.info.data_size;  // all resident: the layer times alone are learned
  o.learn_after = 3;
  auto ex = Executor::open(img, o);
  // 5 s of inferences, and on until a window has been measured (at most 30 s): on a fresh 2-core
  // CI machine beside the sanitizer and preload tests, 170 inferences in 5 s stood out of their
  // noise in no window once. Whether the mixture is learned once is what is checked below.
  int n = 0;
  const auto start = std::chrono::steady_clock::now();
  for (; std::chrono::steady_clock::now() < start + std::chrono::seconds(5) ||
         (ex->learning().windows == 0 && std::chrono::steady_clock::now() < start + std::chrono::seconds(30));
       ++n) {
    EXPECT_TRUE(compare_outputs(expected[n % 2], ex->forward({x[n % 2].clone()})).equal) << "inference " << n;
    EXPECT_LE(ex->plan().total(), o.budget);
  }
  const Executor::Learning l = ex->learning();
  std::cerr << n << " inferences, " << l.windows << " windows, " << l.replans << " re-plans (" << l.kept_plans
            << " kept); the last window over " << l.window << " inferences, noise " << l.noise << ", plan error "
            << l.plan_error << "\n";
  EXPECT_GE(l.windows, 1u) << n << " inferences";
  // One re-plan alone here (each of 3 runs of 392-401 inferences), where windows of three with
  // medians made three. On this VM's clock another process's load is a change of costs, and the
  // learner follows it: under CI, beside the sanitizer tests on two cores, 2 (310 inferences, 35
  // windows, noise 16 %) and 3 (195 inferences, 31 windows, the last 38 % faster than the costs
  // taken under load). Each re-plan doubles the error the next needs: a fourth needs 80 %. The
  // mixture learned once on a clock of its own is CostLearner.InputsOfTwoSizesInTurnAreLearnedOnce.
  EXPECT_LE(l.replans, 3u) << n << " inferences, " << l.windows << " windows; the last over " << l.window
                           << " inferences, noise " << l.noise << ", plan error " << l.plan_error;
}

// The same with a budget grid (a Runtime's executors): the grid is rebuilt on a thread, the plan
// follows it at an inference boundary; a plan given by blocks is never re-planned.
TEST(Executor, LearnedCostsRebuildTheGridAndLeaveAGivenPlan) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const int last = static_cast<int>(pk.info.layers.size()) - 1;
  const std::string img = test_util::with_slow_last_layer(pk, "resnet18-slow-last-grid");
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  ExecutorOptions o;
  o.budget = std::max(pk.info.data_size / 3, min_budget(pk.info));
  o.grid_step = default_grid_step(pk.info);
  o.learn_after = 3;
  auto ex = Executor::open(img, o);
  const double at_open = ex->plan().predicted_ms;
  // The grid is rebuilt at nice 19: on a loaded machine (ctest -j) it can take longer than 40
  // quick inferences, so inferences go on, a pause apart, for up to a minute (a liveness bound).
  int i = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto followed = [&] { return ex->learning().adopted + ex->learning().kept_plans; };
  for (; followed() == 0 && std::chrono::steady_clock::now() < give_up; ++i) {
    EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal) << "inference " << i;
    EXPECT_LE(ex->plan().total(), o.budget);
    if (i >= 40) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(followed(), 1u) << "the grid was not taken up in " << i << " inferences";
  // Its plan put in force, or the plan in force kept (Note [A re-plan must gain]): which, depends
  // on how this run's layers timed; either way predicted with the costs learned.
  if (ex->learning().adopted == 1) EXPECT_EQ(ex->learning().predicted_before_ms, at_open);
  EXPECT_LT(ex->plan().predicted_ms, 5e3);
  EXPECT_LT(ex->latency_curve().back().second, 5e3) << "the latency curve is the new grid's";
  ex->set_budget(pk.info.data_size / 2);  // a budget change looks the new grid up
  EXPECT_LT(ex->plan().predicted_ms, 5e3);
  EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);

  ExecutorOptions given = o;
  given.grid_step = 0;
  given.blocks = 3;
  given.budget = pk.info.data_size;
  auto fixed = Executor::open(img, given);
  for (int j = 0; j < 4; ++j) EXPECT_TRUE(compare_outputs(expected, fixed->forward({x.clone()})).equal);
  EXPECT_EQ(fixed->learning().windows, 0u);
  EXPECT_EQ(fixed->info().layers[last].time_ms, 1e4);
}

// Note [One inference ahead]: after the last block and before finish(), the cursor reads the next
// inference's blocks ahead and nothing of the ones after. resnet18 in 40 equal-byte blocks, one
// or two swapped: the activations' zone has room for many copies of them, and the cursor had
// gone round again and again (7 inferences' reads ahead by the third inference), those blocks
// sitting in the zone through whole inferences (fcn_resnet101 in serve went 10 MB over budget).
TEST(Executor, TheCursorReadsOneInferenceAheadAtMost) {
  Packed pk = packed("resnet18", {1, 3, 224, 224});
  at::Tensor x = torch::randn({1, 3, 224, 224});
  const c10::IValue expected = reference(pk.m, x);
  install_cpu_meter();  // lending the activation reserve to blocks needs the meter's zone
  for (const std::vector<int>& swapped : std::vector<std::vector<int>>{{0}, {0, 1}}) {
    ExecutorOptions o;
    o.budget = 2 * pk.info.data_size;
    o.blocks = 40;
    for (int b = 0; b < o.blocks; ++b) {
      if (std::find(swapped.begin(), swapped.end(), b) == swapped.end()) o.resident.push_back(b);
    }
    auto ex = Executor::open(pk.img, o);
    const std::uint64_t per_inference = ex->plan().read_bytes;
    ASSERT_GT(per_inference, 0u);
    for (int i = 0; i < 3; ++i) {
      ex->begin({x.clone()});
      while (!ex->step()) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // reads submitted land
      const std::uint64_t ahead = ex->bytes_read() - ex->bytes_used();
      EXPECT_LE(ahead, per_inference) << swapped.size() << " swapped, inference " << i << ": read ahead " << ahead
                                      << " bytes, an inference reads " << per_inference;
      EXPECT_TRUE(compare_outputs(expected, ex->finish()).equal) << swapped.size() << " swapped, inference " << i;
      EXPECT_LE(ex->plan().total(), o.budget);
    }
    // The activations' zone has room for more inferences' blocks than the next one's (without a
    // zone the ring holds one inference's blocks, and the test would cover nothing).
    EXPECT_GT(ex->pipeline_stats().zone_bytes, 2 * per_inference) << swapped.size() << " swapped";
  }
}

// Note [A re-plan must gain] with a budget grid (a Runtime's executors): every block resident, the
// grid rebuilt with the costs learned (the 10 s layer gone) has the plan in force at this budget,
// so that plan stays (kept_plans), predicted with the costs learned, and is not put in force
// again (adopted 0; before the margin applied to grids, it was).
TEST(Executor, AGridReplanThatGainsNothingKeepsThePlan) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const std::string img = test_util::with_slow_last_layer(pk, "resnet18-slow-last-grid-kept");
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  ExecutorOptions o;
  o.budget = 2 * pk.info.data_size;
  o.grid_step = default_grid_step(pk.info);
  o.learn_after = 3;
  auto ex = Executor::open(img, o);
  const ExecutionPlan before = ex->plan();
  ASSERT_GT(before.predicted_ms, 1e4);
  int i = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // grids build at nice 19
  for (; ex->learning().adopted + ex->learning().kept_plans == 0 && std::chrono::steady_clock::now() < give_up; ++i) {
    EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal) << "inference " << i;
    if (i >= 40) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const Executor::Learning l = ex->learning();
  EXPECT_EQ(l.kept_plans, 1u) << i << " inferences, " << l.replans << " re-plans";
  EXPECT_EQ(l.adopted, 0u) << "no plan put in force again";
  EXPECT_EQ(ex->plan().blocks, before.blocks);
  EXPECT_EQ(ex->plan().resident, before.resident);
  EXPECT_LT(ex->plan().predicted_ms, 1e3) << "the plan in force predicted with the costs taken";
  EXPECT_LT(ex->latency_curve().back().second, 1e3) << "the latency curve is the new grid's";
  EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);
}

// Note [Learned costs kept]: what one executor learned is planned with by the next from its
// first inference; a store learned for another image, or that is not one, is said and unused;
// with learning off the store is neither read nor written.
TEST(Executor, LearnedCostsAreKeptForTheNextExecutor) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const int last = static_cast<int>(pk.info.layers.size()) - 1;
  const std::string img = test_util::with_slow_last_layer(pk, "resnet18-slow-last-kept");
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  const std::string store = test_util::process_temp_dir() + "/resnet18.learned.json";
  ExecutorOptions o;
  o.budget = std::max(pk.info.data_size / 3, min_budget(pk.info));
  o.learn_after = 3;
  o.learn_store = store;
  double learned_ms = 0;
  {
    auto ex = Executor::open(img, o);
    EXPECT_FALSE(ex->learning().loaded_times) << "nothing stored yet";
    EXPECT_GT(ex->plan().predicted_ms, 5e3) << "the image says the last layer takes 10 s";
    // A window is 3 inferences and 1 s (learn_window_ms) at least: ~1 s of them here.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (int i = 0; std::chrono::steady_clock::now() < until && ex->learning().stored == 0; ++i) {
      EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal) << "inference " << i;
    }
    ASSERT_GE(ex->learning().stored, 1u) << "learned costs were written";
    learned_ms = ex->plan().predicted_ms;
    EXPECT_LT(learned_ms, 5e3);
  }
  {
    auto again = Executor::open(img, o);  // the next executor (the next process alike)
    EXPECT_TRUE(again->learning().loaded_times);
    EXPECT_LT(again->info().layers[last].time_ms, 100) << "the last layer's learned time";
    EXPECT_LT(again->plan().predicted_ms, 5e3) << "planned with the learned costs from the start";
    EXPECT_TRUE(compare_outputs(expected, again->forward({x.clone()})).equal);
  }
  {
    ExecutorOptions off = o;
    off.learn_after = 0;  // costs as packed: the store is not read
    auto ex = Executor::open(img, off);
    EXPECT_FALSE(ex->learning().loaded_times);
    EXPECT_GT(ex->plan().predicted_ms, 5e3);
  }
  {
    // Another model's image: the store's costs were learned for resnet18's layers.
    Packed other = packed("mobilenet_v2", {1, 3, 64, 64});
    ExecutorOptions m = o;
    m.budget = std::max(other.info.data_size / 3, min_budget(other.info));
    auto ex = Executor::open(other.img, m);
    EXPECT_FALSE(ex->learning().loaded_times) << "learned for resnet18, not mobilenet_v2";
    EXPECT_FALSE(ex->learning().loaded_rate);
  }
  {
    // Learned on a GPU: its layer times are the GPU's (Note [Timing layers on the GPU]).
    nlohmann::json j = nlohmann::json::parse(test_util::slurp(store));
    EXPECT_EQ(j.value("device", ""), "cpu");
    j["device"] = "cuda:0";
    test_util::spit(store, j.dump());
    auto ex = Executor::open(img, o);
    EXPECT_FALSE(ex->learning().loaded_times) << "learned on the GPU, not on the CPU";
    EXPECT_FALSE(ex->learning().loaded_rate);
  }
  {
    test_util::spit(store, "{not json");
    auto ex = Executor::open(img, o);  // said, unused, and the run goes on
    EXPECT_FALSE(ex->learning().loaded_times);
    EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);
  }
  {
    ExecutorOptions bad = o;
    bad.learn_store = "/nonexistent-dir/x.learned.json";  // cannot be written: said, learning goes on
    auto ex = Executor::open(img, bad);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until && ex->learning().replans == 0) {
      EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);
    }
    EXPECT_GE(ex->learning().replans, 1u);
    EXPECT_EQ(ex->learning().stored, 0u);
    EXPECT_LT(ex->plan().predicted_ms, 5e3);
  }
}

}  // namespace
}  // namespace swapnet
