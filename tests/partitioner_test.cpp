// Tests of swapnet/partitioner.h: the DP is exact (equals exhaustive search), feasibility is
// respected, and the budget grid answers like a fresh search.
#include <gtest/gtest.h>

#include <random>

#include "swapnet/partitioner.h"

namespace swapnet {
namespace {

std::vector<LayerCost> random_layers(int n, std::mt19937& rng) {
  std::vector<LayerCost> l(n);
  std::uniform_int_distribution<int> pages(0, 64), tensors(0, 6);
  std::uniform_real_distribution<double> ms(0.1, 10.0);
  for (auto& x : l) {
    x.bytes = static_cast<std::uint64_t>(pages(rng)) * 4096;
    x.tensors = static_cast<std::uint32_t>(tensors(rng));
    x.exec_ms = ms(rng);
  }
  return l;
}

TEST(Partitioner, DynamicProgramEqualsExhaustiveSearch) {
  std::mt19937 rng(42);
  CostModel m;
  m.alpha_ms_per_byte = 1.0 / 40000;  // reads comparable to compute, so cuts matter
  m.beta_ms_per_tensor = 0.01;
  m.eta_ms_per_tensor = 0.002;
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + trial % 16;
    auto layers = random_layers(n, rng);
    std::uint64_t total = 0;
    for (const auto& x : layers) total += x.bytes;
    const std::uint64_t arena = std::uniform_int_distribution<std::uint64_t>(0, total + 4096)(rng);
    Partition dp = optimal_partition(layers, arena, m);
    Partition ex = exhaustive_partition(layers, arena, m);
    ASSERT_EQ(dp.feasible, ex.feasible) << "trial " << trial;
    if (!dp.feasible) continue;
    ++compared;
    EXPECT_NEAR(dp.predicted_ms, ex.predicted_ms, 1e-9) << "trial " << trial;
    EXPECT_NEAR(predict_ms(layers, dp.blocks, m), dp.predicted_ms, 1e-9) << "reported == recomputed";
    EXPECT_LE(arena_bytes(layers, dp.blocks), arena);
    ASSERT_FALSE(dp.blocks.empty());
    EXPECT_EQ(dp.blocks.front().first, 0);
    EXPECT_EQ(dp.blocks.back().second, n - 1);
    for (size_t b = 0; b + 1 < dp.blocks.size(); ++b) EXPECT_EQ(dp.blocks[b].second + 1, dp.blocks[b + 1].first);
  }
  EXPECT_GT(compared, 150);
}

TEST(Partitioner, ExhaustiveOnTwentyFourLayers) {
  std::mt19937 rng(7);
  CostModel m;
  m.alpha_ms_per_byte = 1.0 / 40000;
  auto layers = random_layers(24, rng);
  const std::uint64_t arena = min_arena_bytes(layers) + 40 * 4096;
  Partition dp = optimal_partition(layers, arena, m);
  Partition ex = exhaustive_partition(layers, arena, m);
  ASSERT_TRUE(dp.feasible && ex.feasible);
  EXPECT_NEAR(dp.predicted_ms, ex.predicted_ms, 1e-9);
}

TEST(Partitioner, MinimumArenaIsTheLargestAdjacentPair) {
  std::vector<LayerCost> l(4);
  l[0].bytes = 10;
  l[1].bytes = 30;
  l[2].bytes = 25;
  l[3].bytes = 5;
  EXPECT_EQ(min_arena_bytes(l), 55u);
  EXPECT_FALSE(optimal_partition(l, 54, CostModel{}).feasible);
  EXPECT_TRUE(optimal_partition(l, 55, CostModel{}).feasible);
  EXPECT_EQ(optimal_partition(l, 70, CostModel{}).blocks.size(), 1u) << "everything fits: one block";
}

TEST(PartitionTable, LookupMatchesAFreshSearchAtGridPoints) {
  std::mt19937 rng(3);
  CostModel m;
  m.alpha_ms_per_byte = 1.0 / 40000;
  auto layers = random_layers(40, rng);
  PartitionTable table(layers, m, 8 * 4096);
  EXPECT_GT(table.size(), 2u);
  EXPECT_FALSE(table.lookup(table.min_arena() - 1).feasible);
  for (std::uint64_t a = table.min_arena(); a < table.min_arena() + 20 * 8 * 4096; a += 8 * 4096) {
    const Partition& p = table.lookup(a + 100);  // between grid points: the point below
    Partition fresh = optimal_partition(layers, a, m);
    ASSERT_TRUE(p.feasible);
    EXPECT_NEAR(p.predicted_ms, fresh.predicted_ms, 1e-9);
    EXPECT_LE(p.max_pair_bytes, a + 100);
  }
}

}  // namespace
}  // namespace swapnet
