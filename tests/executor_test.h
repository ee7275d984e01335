// What the executor tests share (executor_test.cpp, executor_zone_test.cpp,
// executor_learn_test.cpp: one test binary).
#pragma once

#include <gtest/gtest.h>

#include <torch/script.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "swapnet/assembly.h"
#include "packed.h"
#include "test_util.h"

namespace swapnet {
namespace executor_test {

using test_util::error_of;
using test_util::model;
using test_util::pack;
using test_util::Packed;
using test_util::packed;
using test_util::reference;

// One inference: bit-identical to `expected`, the weights' peak plus the activations' (blocks
// lent their bytes counted with them) within `budget`. Its output; none (a failure recorded)
// when it differs.
inline std::optional<c10::IValue> forward_within(Executor& ex, const at::Tensor& x, const c10::IValue& expected,
                                          std::uint64_t budget, const std::string& what) {
  ex.reset_weight_peak();
  reset_cpu_meter_peak();
  const std::uint64_t base = cpu_meter().current;
  c10::IValue out = ex.forward({x.clone()});
  EXPECT_LE(ex.weight_memory().peak + (cpu_meter().peak_with_lent - base), budget) << what;
  Comparison c = compare_outputs(expected, out);
  EXPECT_TRUE(c.equal) << what << ": " << c.difference;
  if (!c.equal) return std::nullopt;
  return out;
}

// Eight inferences, each with a budget change at a random layer in its middle (budget(trial)):
// weights held plus the reserve stay within the new plan right after it, and every output is
// bit-identical.
inline void change_budgets_mid_inference(Executor& ex, const at::Tensor& x, const c10::IValue& expected,
                                  unsigned seed, const std::function<std::uint64_t(int)>& budget,
                                  const std::string& what) {
  std::mt19937 rng(seed);
  const int L = static_cast<int>(ex.info().layers.size());
  for (int trial = 0; trial < 8; ++trial) {
    ex.begin({x.clone()});
    bool done = false;
    const int k = 1 + static_cast<int>(rng() % (L - 1));
    while (!done && ex.next_layer() < k) done = ex.step(k);
    ex.set_budget(budget(trial));
    EXPECT_LE(ex.weight_memory().held + ex.plan().activation_bytes, ex.plan().total()) << what << " trial " << trial;
    while (!done) done = ex.step();
    Comparison c = compare_outputs(expected, ex.finish());
    ASSERT_TRUE(c.equal) << what << " trial " << trial << " at layer " << k << ": " << c.difference;
  }
}

}  // namespace executor_test
}  // namespace swapnet
