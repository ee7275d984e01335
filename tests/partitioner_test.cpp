// Tests of swapnet/partitioner.h: the pipeline prediction on a worked example, the DP is exact
// (equals exhaustive search) for any set of resident layers, the choice of resident layers is
// never worse than none and is measured against the true optimum, feasibility is respected, the
// budget grid answers like a fresh search, the fit recovers known coefficients, and profile files
// round-trip or are refused with the field named.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <random>

#include "swapnet/partitioner.h"
#include "test_util.h"

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

CostModel io_heavy() {
  CostModel m;
  m.alpha_ms_per_byte = 1.0 / 40000;  // reads comparable to compute, so cuts matter
  m.beta_ms_per_tensor = 0.01;
  m.block_ms = 0.3;
  m.eta_ms_per_tensor = 0.002;
  return m;
}

// Worked examples: reads at `ms_per_byte`, layers' own times, no other cost.
CostModel reads_and_compute_only(double ms_per_byte) {
  CostModel m;
  m.alpha_ms_per_byte = ms_per_byte;
  m.beta_ms_per_tensor = 0;
  m.block_ms = 0;
  m.eta_ms_per_tensor = 0;
  m.inference_ms = 0;
  return m;
}

std::uint64_t total_bytes(const std::vector<LayerCost>& l) {
  std::uint64_t t = 0;
  for (const auto& x : l) t += x.bytes;
  return t;
}

void expect_well_formed(const std::vector<LayerCost>& layers, const Partition& p, std::uint64_t capacity,
                        const CostModel& m, const std::string& what) {
  ASSERT_FALSE(p.blocks.empty()) << what;
  ASSERT_EQ(p.blocks.size(), p.resident.size()) << what;
  EXPECT_EQ(p.blocks.front().first, 0) << what;
  EXPECT_EQ(p.blocks.back().second, static_cast<int>(layers.size()) - 1) << what;
  for (size_t b = 0; b + 1 < p.blocks.size(); ++b) EXPECT_EQ(p.blocks[b].second + 1, p.blocks[b + 1].first) << what;
  EXPECT_LE(p.memory(), capacity) << what;
  Partition again = p;
  evaluate(layers, m, &again);
  EXPECT_NEAR(again.predicted_ms, p.predicted_ms, 1e-9) << what << ": reported == recomputed";
  EXPECT_EQ(again.memory(), p.memory()) << what;
  EXPECT_EQ(p.read_bytes + p.resident_bytes + p.retained_bytes, total_bytes(layers)) << what;
}

TEST(Partitioner, PredictionFollowsThePipelineOnAWorkedExample) {
  // Layers of 100/200/100 bytes, 1/2/1 tensors, 5/1/5 ms; alpha 0.01 ms/B, beta 0.1 ms/tensor,
  // block 1 ms, eta 0.05 ms/tensor.
  std::vector<LayerCost> l = {{100, 1, 5.0}, {200, 2, 1.0}, {100, 1, 5.0}};
  CostModel m;
  m.alpha_ms_per_byte = 0.01;
  m.beta_ms_per_tensor = 0.1;
  m.block_ms = 1.0;
  m.eta_ms_per_tensor = 0.05;
  // Three swapped blocks: io = 2, 3, 2 ms.
  //   s0: fetched at 2; bind 0.1 -> 2.1; next fetch done 2.1 + 3 = 5.1; ex+out -> 2.1 + 5.05 = 7.15
  //   s1: start max(7.15, 5.1) = 7.15; bind 0.2 -> 7.35; next fetch done 9.35; ex+out -> 8.45
  //   s2: start max(8.45, 9.35) = 9.35; bind 0.1 -> 9.45; ex+out -> 14.5
  EXPECT_NEAR(predict_ms(l, {{0, 0}, {1, 1}, {2, 2}}, {0, 0, 0}, m), 14.5, 1e-12);
  // Layer 0 resident: the first swapped fetch (3 ms) overlaps its 5 ms.
  //   r0: 5; s1: start max(5, 3) = 5, bind -> 5.2, next done 7.2, ex+out -> 6.3
  //   s2: start 7.2, bind -> 7.3, ex+out -> 12.35
  EXPECT_NEAR(predict_ms(l, {{0, 0}, {1, 1}, {2, 2}}, {1, 0, 0}, m), 12.35, 1e-12);
  // Everything resident: execution only.
  EXPECT_NEAR(predict_ms(l, {{0, 2}}, {1}, m), 11.0, 1e-12);
  Partition p;
  p.blocks = {{0, 0}, {1, 1}, {2, 2}};
  p.resident = {0, 1, 0};
  evaluate(l, m, &p);
  EXPECT_EQ(p.resident_bytes, 200u);
  EXPECT_EQ(p.read_bytes, 200u);
  EXPECT_EQ(p.arena_bytes, 200u) << "consecutive swapped blocks 0 and 2 pair up across the resident one";
}

TEST(Partitioner, DynamicProgramEqualsExhaustiveSearchForAnyResidentLayers) {
  std::mt19937 rng(42);
  const CostModel m = io_heavy();
  int compared = 0, with_resident = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + trial % 16;
    auto layers = random_layers(n, rng);
    std::vector<char> mask(n, 0);
    if (trial % 2 == 1) {  // half the trials: random resident layers
      for (auto& r : mask) r = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
    }
    const std::uint64_t cap = std::uniform_int_distribution<std::uint64_t>(0, total_bytes(layers) + 4096)(rng);
    Partition dp = optimal_partition_for(layers, mask, cap, m);
    Partition ex = exhaustive_partition_for(layers, mask, cap, m);
    ASSERT_EQ(dp.feasible, ex.feasible) << "trial " << trial;
    if (!dp.feasible) continue;
    ++compared;
    with_resident += dp.resident_bytes > 0;
    EXPECT_NEAR(dp.predicted_ms, ex.predicted_ms, 1e-9) << "trial " << trial;
    expect_well_formed(layers, dp, cap, m, "trial " + std::to_string(trial));
    for (size_t b = 0; b < dp.blocks.size(); ++b) {
      for (int k = dp.blocks[b].first; k <= dp.blocks[b].second; ++k) {
        EXPECT_EQ(static_cast<bool>(dp.resident[b]), static_cast<bool>(mask[k])) << "trial " << trial << " layer " << k;
      }
    }
  }
  EXPECT_GT(compared, 150);
  EXPECT_GT(with_resident, 50);
}

TEST(Partitioner, ExhaustiveOnTwentyFourLayers) {
  std::mt19937 rng(7);
  const CostModel m = io_heavy();
  auto layers = random_layers(24, rng);
  std::vector<char> none(24, 0), some(24, 0);
  some[0] = some[1] = some[10] = 1;
  const std::uint64_t cap = min_arena_bytes(layers) + layers[0].bytes + layers[1].bytes + layers[10].bytes + 40 * 4096;
  for (const auto* mask : {&none, &some}) {
    Partition dp = optimal_partition_for(layers, *mask, cap, m);
    Partition ex = exhaustive_partition_for(layers, *mask, cap, m);
    ASSERT_TRUE(dp.feasible && ex.feasible);
    EXPECT_NEAR(dp.predicted_ms, ex.predicted_ms, 1e-9);
  }
}

TEST(Partitioner, ChosenResidencyIsNeverWorseThanNoneAndCloseToTheOptimum) {
  std::mt19937 rng(11);
  const CostModel m = io_heavy();
  std::vector<double> gaps;
  int gained = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + trial % 8;
    auto layers = random_layers(n, rng);
    const std::uint64_t lo = min_arena_bytes(layers), hi = total_bytes(layers) + 4096;
    const std::uint64_t cap = std::uniform_int_distribution<std::uint64_t>(lo, std::max(lo, hi))(rng);
    PartitionOptions paper, off;
    paper.read_ahead = off.read_ahead = ReadAhead::kPaper;  // the exhaustive search's pipeline
    off.residency = false;
    Partition none = optimal_partition(layers, cap, m, off);
    Partition chosen = optimal_partition(layers, cap, m, paper);
    Partition truth = exhaustive_partition_any(layers, cap, m);
    ASSERT_TRUE(none.feasible && chosen.feasible && truth.feasible) << "trial " << trial;
    expect_well_formed(layers, chosen, cap, m, "trial " + std::to_string(trial));
    EXPECT_EQ(none.resident_bytes, 0u);
    // Within the tolerance it trades for fewer bytes read, never worse than no residency.
    EXPECT_LE(chosen.predicted_ms, none.predicted_ms * 1.01 + 1e-9) << "trial " << trial;
    EXPECT_LE(chosen.read_bytes, none.read_bytes) << "trial " << trial;
    EXPECT_GE(chosen.predicted_ms, truth.predicted_ms - 1e-9) << "nothing beats the exhaustive optimum";
    gaps.push_back(chosen.predicted_ms / truth.predicted_ms - 1);
    gained += chosen.predicted_ms < none.predicted_ms - 1e-9;
  }
  std::sort(gaps.begin(), gaps.end());
  const double median_gap = gaps[gaps.size() / 2], p90 = gaps[gaps.size() * 9 / 10];
  std::printf("residency heuristic vs exhaustive optimum: median gap %.2f %%, p90 %.2f %%, max %.2f %%; faster "
              "than no residency in %d of %zu\n",
              100 * median_gap, 100 * p90, 100 * gaps.back(), gained, gaps.size());
  EXPECT_LE(median_gap, 0.02);
  EXPECT_GT(gained, 20);
}

TEST(Partitioner, MinimumArenaIsTheLargestAdjacentPair) {
  std::vector<LayerCost> l(4);
  l[0].bytes = 10;
  l[1].bytes = 30;
  l[2].bytes = 25;
  l[3].bytes = 5;
  EXPECT_EQ(min_arena_bytes(l), 55u);
  PartitionOptions two;
  two.read_ahead = ReadAhead::kTwoEnded;
  EXPECT_FALSE(optimal_partition(l, 54, CostModel{}, two).feasible);
  EXPECT_TRUE(optimal_partition(l, 55, CostModel{}, two).feasible);
  // The deep ring needs only the largest swapped layer (Note [A ring of one block]).
  EXPECT_FALSE(optimal_partition(l, 29, CostModel{}).feasible);
  Partition one = optimal_partition(l, 30, CostModel{});
  EXPECT_TRUE(one.feasible);
  EXPECT_EQ(one.memory(), 30u);
  EXPECT_EQ(one.block_max, 30u);
  Partition all = optimal_partition(l, 70, CostModel{});
  ASSERT_EQ(all.blocks.size(), 1u) << "everything fits: one resident block";
  EXPECT_EQ(all.resident[0], 1);
  EXPECT_EQ(all.read_bytes, 0u);
}

// The ring pipeline on a worked example: three swapped blocks of 10 pages, reads of 10 ms,
// execution of 2 ms each (I/O bound), and the same with execution of 20 ms (compute bound).
TEST(Partitioner, RingSimulationOnAWorkedExample) {
  constexpr std::uint64_t kB = 10 * 4096;  // a block: the ring holds whole pages
  CostModel m = reads_and_compute_only(10.0 / kB);
  std::vector<LayerCost> l(3);
  for (auto& x : l) {
    x.bytes = kB;
    x.exec_ms = 2;
  }
  const Blocks b = {{0, 0}, {1, 1}, {2, 2}};
  const std::vector<char> sw = {0, 0, 0};
  // A ring holding everything the reader may read ahead: the disk never waits, 30 ms per inference.
  EXPECT_NEAR(simulate_ms(l, b, sw, 3 * kB, 0, m), 30.0, 1e-9);
  // Two blocks at most: block k+2 waits for block k to execute, which waits for its read; the
  // disk still never idles (execution is shorter than a read): 30 ms.
  EXPECT_NEAR(simulate_ms(l, b, sw, 2 * kB, 2, m), 30.0, 1e-9);
  // The paper's pipeline starts every inference cold: three reads of 10 ms, then the last block
  // executes: 32 ms.
  EXPECT_NEAR(predict_ms(l, b, sw, m), 32.0, 1e-9);
  for (auto& x : l) x.exec_ms = 20;
  // Compute bound: the reads hide behind execution, 60 ms (the paper's: 10 + 60).
  EXPECT_NEAR(simulate_ms(l, b, sw, 3 * kB, 0, m), 60.0, 1e-9);
  EXPECT_NEAR(predict_ms(l, b, sw, m), 70.0, 1e-9);
  // A resident block costs its execution only.
  EXPECT_NEAR(simulate_ms(l, b, {1, 0, 0}, 2 * kB, 0, m), 60.0, 1e-9);
}

// Layer by layer (Note [Layer by layer] in assembly/src/read_ahead.cpp) on a worked example: a
// ring of one block (16 MiB), two blocks of two 8 MiB layers, reads of 1 ms per MiB, 10 ms per
// layer. Block by block, each block streams over the other's bytes only once it ended, and
// waits for all of them: (16 + 20) ms per block. Layer by layer, the next block's first half
// lands while the running block's second layer runs, and its second half while its own first
// layer runs: compute bound, 40 ms.
TEST(Partitioner, RingSimulationLayerByLayer) {
  constexpr std::uint64_t kMiB = 1 << 20;
  CostModel m = reads_and_compute_only(1.0 / kMiB);
  std::vector<LayerCost> l(4);
  for (auto& x : l) {
    x.bytes = 8 * kMiB;
    x.exec_ms = 10;
  }
  const Blocks b = {{0, 1}, {2, 3}};
  const std::vector<char> sw = {0, 0};
  EXPECT_NEAR(simulate_ms(l, b, sw, 16 * kMiB, 0, m, true, -1, 0, false), 72.0, 1e-9);
  EXPECT_NEAR(simulate_ms(l, b, sw, 16 * kMiB, 0, m, true, -1, 0, true), 40.0, 1e-9);
  // Reads slower than compute (3 ms per MiB): the disk is the bound either way, but layer by
  // layer it never waits for a block to end: 2 x 48 ms of reads, against 2 x (48 + 20).
  m.alpha_ms_per_byte = 3.0 / kMiB;
  EXPECT_NEAR(simulate_ms(l, b, sw, 16 * kMiB, 0, m, true, -1, 0, false), 136.0, 1e-9);
  EXPECT_NEAR(simulate_ms(l, b, sw, 16 * kMiB, 0, m, true, -1, 0, true), 96.0, 1e-9);
}

// The two-block ring runs layers as their bytes land too, and its blocks leave whole. A block of
// two 8 MiB layers of 30 ms, then one of a 16 MiB layer of 1 ms, at 1 ms per MiB: block by block
// the first block starts when all of it has landed and the next inference's read into its end
// waits for it: 76 ms per inference (16 + 60). Layer by layer its first layer starts at 8 ms and
// it ends 8 ms sooner: 68 ms.
TEST(Partitioner, TwoEndedSimulationLayerByLayer) {
  constexpr std::uint64_t kMiB = 1 << 20;
  const CostModel m = reads_and_compute_only(1.0 / kMiB);
  std::vector<LayerCost> l(3);
  l[0].bytes = l[1].bytes = 8 * kMiB;
  l[0].exec_ms = l[1].exec_ms = 30;
  l[2].bytes = 16 * kMiB;
  l[2].exec_ms = 1;
  const Blocks b = {{0, 1}, {2, 2}};
  const std::vector<char> sw = {0, 0};
  EXPECT_NEAR(simulate_ms(l, b, sw, 32 * kMiB, 2, m, true, -1, 0, false), 76.0, 1e-9);
  EXPECT_NEAR(simulate_ms(l, b, sw, 32 * kMiB, 2, m, true, -1, 0, true), 68.0, 1e-9);
}

// Note [Lending the activation reserve] in assembly/src/zone_lender.cpp, worked out by hand: four
// 8 MiB layers of 10 ms, single-layer blocks, an 8 MiB ring, reads of 1 ms per MiB; the first
// layer's activations need the whole 8 MiB reserve, the others nothing. With the reserve kept,
// every block streams over the one before once it ended: 4 x (8 + 10) = 72 ms. Lent, the
// blocks of layers 2 and 3 are read while the layer before computes (into the reserve, then
// over the block two back); those of layers 0 and 1 are held while layer 0 runs, so they wait
// as before: 40 + 2 x 8 = 56 ms.
TEST(Partitioner, RingSimulationLendsTheActivationReserve) {
  constexpr std::uint64_t kMiB = 1 << 20;
  const CostModel m = reads_and_compute_only(1.0 / kMiB);
  std::vector<LayerCost> l(4);
  for (auto& x : l) {
    x.bytes = 8 * kMiB;
    x.exec_ms = 10;
  }
  l[0].peak_bytes = 8 * kMiB;
  // Layers 1..3: no activations (nothing measured, nothing live).
  const Blocks b = {{0, 0}, {1, 1}, {2, 2}, {3, 3}};
  const std::vector<char> sw(4, 0);
  EXPECT_NEAR(simulate_ms(l, b, sw, 8 * kMiB, 0, m, true, -1, 0, true, 0), 72.0, 1e-9);
  EXPECT_NEAR(simulate_ms(l, b, sw, 8 * kMiB, 0, m, true, -1, 0, true, 8 * kMiB), 56.0, 1e-9);
  // Activations needing the whole reserve everywhere: nothing to lend.
  for (auto& x : l) x.peak_bytes = 8 * kMiB;
  EXPECT_NEAR(simulate_ms(l, b, sw, 8 * kMiB, 0, m, true, -1, 0, true, 8 * kMiB), 72.0, 1e-9);
  // The two-ended ring lends nothing.
  EXPECT_NEAR(simulate_ms(l, b, sw, 16 * kMiB, 2, m, true, -1, 0, true, 8 * kMiB),
              simulate_ms(l, b, sw, 16 * kMiB, 2, m, true, -1, 0, true, 0), 1e-9);
}

// Properties of the ring pipeline on random tables: never faster than the physical bound
// (all execution, all reads); two blocks ahead never slower than the paper's cold pipeline for
// the same blocks; a ring holding an inference never slower than two blocks ahead.
TEST(Partitioner, RingSimulationIsBounded) {
  std::mt19937 rng(17);
  const CostModel m = io_heavy();
  for (int trial = 0; trial < 300; ++trial) {
    auto layers = random_layers(2 + trial % 30, rng);
    const int L = static_cast<int>(layers.size());
    Partition p;
    p.blocks = equal_bytes_blocks(layers, 1 + trial % L);
    for (size_t k = 0; k < p.blocks.size(); ++k) p.resident.push_back(rng() % 4 == 0);
    evaluate(layers, m, &p);
    double ex = 0, io = 0;
    for (size_t k = 0; k < p.blocks.size(); ++k) {
      for (int i = p.blocks[k].first; i <= p.blocks[k].second; ++i) ex += layers[i].exec_ms;
      if (p.resident[k]) continue;
      std::uint64_t bytes = 0;
      for (int i = p.blocks[k].first; i <= p.blocks[k].second; ++i) bytes += layers[i].bytes;
      io += m.alpha_ms_per_byte * static_cast<double>(bytes) + m.block_ms;
    }
    const std::uint64_t pair = std::max<std::uint64_t>(p.arena_bytes, 1);
    const double two = simulate_ms(layers, p.blocks, p.resident, pair, 2, m);
    EXPECT_GE(two, std::max(ex, io) - 1e-9) << "trial " << trial;
    EXPECT_LE(two, predict_ms(layers, p.blocks, p.resident, m) + 1e-9) << "trial " << trial;
    // The contiguous ring (pages; a block that does not fit before the end goes to the start)
    // is within the bounds at any size; where it holds a whole inference and a block more, the
    // reader only ever waits for the one-inference limit, and no two-block pipeline beats it.
    std::uint64_t swapped_bytes = 0, largest = 0;
    for (size_t k = 0; k < p.blocks.size(); ++k) {
      if (p.resident[k]) continue;
      std::uint64_t bytes = 0;
      for (int i = p.blocks[k].first; i <= p.blocks[k].second; ++i) bytes += (layers[i].bytes + 4095) / 4096 * 4096;
      swapped_bytes += bytes + 4096;
      largest = std::max(largest, bytes + 4096);
    }
    for (std::uint64_t ring = pair + 4096; ring < pair * 4; ring += pair / 3 + 4096) {
      const double t = simulate_ms(layers, p.blocks, p.resident, ring, 0, m);
      EXPECT_GE(t, std::max(ex, io) - 1e-9) << "trial " << trial << " ring " << ring;
      // Lending a reserve of random activation peaks (Note [Lending the activation reserve]):
      // still within the physical bound, and the reserve fully needed everywhere lends nothing.
      std::vector<LayerCost> act = layers;
      std::uint64_t reserve = 0;
      for (auto& x : act) reserve = std::max<std::uint64_t>(reserve, x.peak_bytes = 1 + rng() % (pair / 2 + 1));
      const double lent = simulate_ms(act, p.blocks, p.resident, ring, 0, m, true, -1, 0, true, reserve);
      EXPECT_GE(lent, std::max(ex, io) - 1e-9) << "trial " << trial << " ring " << ring;
      for (auto& x : act) x.peak_bytes = reserve;
      EXPECT_NEAR(simulate_ms(act, p.blocks, p.resident, ring, 0, m, true, -1, 0, true, reserve), t, 1e-9)
          << "trial " << trial << " ring " << ring;
    }
    const double all = simulate_ms(layers, p.blocks, p.resident, swapped_bytes + largest, 0, m);
    EXPECT_LE(all, two + 1e-9) << "trial " << trial << ": depth is free once the ring holds an inference";
  }
}

// The chosen ring plan: feasible, as predicted when re-evaluated, never slower than the best
// paper-pipeline plan simulated with the same memory, and reading no fewer bytes than the bound.
TEST(Partitioner, RingPlansFitAndBeatTheTwoBlockPipeline) {
  std::mt19937 rng(23);
  const CostModel m = io_heavy();
  for (int trial = 0; trial < 150; ++trial) {
    auto layers = random_layers(3 + trial % 25, rng);
    const std::uint64_t lo = min_arena_bytes(layers), hi = total_bytes(layers) + 4096;
    const std::uint64_t cap = std::uniform_int_distribution<std::uint64_t>(lo, std::max(lo, hi))(rng);
    Partition ring = optimal_partition(layers, cap, m);
    PartitionOptions paper;
    paper.read_ahead = ReadAhead::kPaper;
    Partition old = optimal_partition(layers, cap, m, paper);
    ASSERT_TRUE(ring.feasible && old.feasible) << "trial " << trial;
    expect_well_formed(layers, ring, cap, m, "trial " + std::to_string(trial));
    EXPECT_GE(ring.ring_bytes, ring.read_bytes ? ring.block_max : 0) << "trial " << trial;
    if (ring.ring_depth == 2) EXPECT_GE(ring.ring_bytes, ring.arena_bytes) << "trial " << trial << ": two ends, a pair";
    // The old plan, run with a ring of what its resident blocks leave.
    Partition as_ring = old;
    as_ring.ring_bytes = old.read_bytes ? cap - old.resident_bytes : 0;
    evaluate(layers, m, &as_ring);
    EXPECT_LE(ring.predicted_ms, as_ring.predicted_ms * 1.01 + 1e-9) << "trial " << trial;
    EXPECT_GE(ring.read_bytes, min_read_bytes(layers, cap)) << "trial " << trial;
  }
}

// A decoder's shape: an embedding and an output head much larger than the blocks between them,
// I/O-bound. Neither big layer can stay resident beside the other's ring, but the blocks between
// can, or most of one big layer can (Note [Keeping part of a block]; the two plans are
// predicted within 0.01 % of each other here): the plan keeps ~150 MiB across inferences and
// reads the least any plan in that budget reads (the candidate orders used to stop at the first
// layer that did not fit, keeping nothing: 11 % more bytes per token for gpt_350m at 1/4).
TEST(Partitioner, KeepsTheSmallLayersBehindTwoThatCannotStay) {
  std::vector<LayerCost> layers;
  layers.push_back(LayerCost{200u << 20, 1, 0.5, 1 << 20, 1 << 20});  // embedding: bytes, little compute
  for (int b = 0; b < 24; ++b) {
    for (int k = 0; k < 6; ++k) layers.push_back(LayerCost{(k % 3 == 0 ? 16u : 4u) << 20, 2, 0.3, 1 << 20, 1 << 20});
  }
  layers.push_back(LayerCost{200u << 20, 1, 0.5, 1 << 20, 1 << 20});  // output head
  const std::uint64_t cap = 380u << 20;
  const CostModel m = io_heavy();
  Partition p = optimal_partition(layers, cap, m);
  ASSERT_TRUE(p.feasible);
  expect_well_formed(layers, p, cap, m, "decoder");
  EXPECT_GT(p.resident_bytes + p.retained_bytes, 150u << 20) << "the blocks between the big layers stay, or part of one";
  EXPECT_EQ(p.read_bytes, min_read_bytes(layers, cap));
  PartitionOptions none;
  none.residency = false;
  EXPECT_LT(p.predicted_ms, optimal_partition(layers, cap, m, none).predicted_ms * 0.95);
}

// vgg19's shape: sixteen 5 MiB convolutions, then a 400 MiB layer that holds most of a 430 MiB
// budget, and two smaller fully connected ones.
std::vector<LayerCost> vgg_like() {
  std::vector<LayerCost> layers;
  for (int k = 0; k < 16; ++k) layers.push_back(LayerCost{5u << 20, 2, 12.0, 4 << 20, 8 << 20});
  layers.push_back(LayerCost{400u << 20, 2, 20.0, 1 << 20, 1 << 20});
  layers.push_back(LayerCost{64u << 20, 2, 4.0, 1 << 20, 1 << 20});
  layers.push_back(LayerCost{16u << 20, 2, 1.0, 1 << 20, 1 << 20});
  return layers;
}

// vgg19's shape: a layer holding most of the capacity. Kept or swapped whole it is read every
// inference; the plan keeps most of it and reads the rest (Note [Keeping part of a block]):
// fewer bytes, and a prediction faster than the same blocks without it.
TEST(Partitioner, KeepsPartOfALayerThatHoldsMostOfTheBudget) {
  const std::vector<LayerCost> layers = vgg_like();
  const std::uint64_t cap = 430u << 20;
  const CostModel m = io_heavy();
  Partition p = optimal_partition(layers, cap, m);
  ASSERT_TRUE(p.feasible);
  expect_well_formed(layers, p, cap, m, "vgg-like");
  ASSERT_GE(p.retain_block, 0);
  EXPECT_EQ(p.blocks[p.retain_block], std::make_pair(16, 16)) << "the large layer";
  EXPECT_GT(p.retained_bytes, 200u << 20);
  EXPECT_LT(p.read_bytes, 300u << 20) << "whole layers: every one of its 560 MiB";
  EXPECT_GE(p.read_bytes, min_read_bytes(layers, cap));
  Partition whole = p;
  whole.retain_block = -1;
  whole.retained_bytes = 0;
  whole.ring_bytes = cap - whole.resident_bytes;
  evaluate(layers, m, &whole);
  EXPECT_LT(p.predicted_ms, whole.predicted_ms * 0.8);
  PartitionOptions paper;
  paper.residency = false;
  EXPECT_EQ(optimal_partition(layers, cap, m, paper).retain_block, -1) << "the paper's plans keep nothing";
}

// Where reads hide behind compute, keeping part of the large layer is about as fast as reading
// it whole every inference: predicted within the tolerance of the fastest, the plan that keeps
// part wins by reading less (vgg19 at 2 GB/s read all 575 MB every inference while a plan
// keeping 344 MB of fc6 was predicted as fast).
TEST(Partitioner, KeepsPartOfALargeLayerWhereReadsHideBehindCompute) {
  const std::vector<LayerCost> layers = vgg_like();
  const std::uint64_t cap = 430u << 20;
  for (double mb_per_ms : {4.0, 8.0, 16.0}) {  // 560 MiB in 147, 73, 37 ms; 217 ms of compute
    const CostModel m = reads_and_compute_only(1.0 / (mb_per_ms * 1e6));
    const std::string at = std::to_string(mb_per_ms) + " MB/ms";
    Partition p = optimal_partition(layers, cap, m);
    ASSERT_TRUE(p.feasible) << at;
    expect_well_formed(layers, p, cap, m, at);
    PartitionOptions fastest_only;
    fastest_only.tolerance = 0;
    EXPECT_GE(p.retain_block, 0) << at << ": part of the large layer kept";
    EXPECT_LT(p.read_bytes, 300u << 20) << at;
    // The fastest plan of all, kept or not, is no more than the tolerance faster.
    Partition fastest = optimal_partition(layers, cap, m, fastest_only);
    EXPECT_LE(p.predicted_ms, fastest.predicted_ms * 1.01 + 1e-9) << at;
  }
}

// min_read_bytes is a lower bound on every plan's bytes read, and tight on most small tables:
// the exhaustive least (every cut, every resident flag that fits) is compared.
TEST(Partitioner, LeastBytesReadIsALowerBound) {
  std::mt19937 rng(29);
  int tight = 0, tight_deep = 0, trials = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 2 + trial % 9;
    auto layers = random_layers(L, rng);
    const std::uint64_t lo = min_arena_bytes(layers), hi = total_bytes(layers) + 4096;
    const std::uint64_t cap = std::uniform_int_distribution<std::uint64_t>(lo, std::max(lo, hi))(rng);
    std::uint64_t least = UINT64_MAX, least_deep = UINT64_MAX;
    for (std::uint32_t cuts = 0; cuts < (1u << (L - 1)); ++cuts) {
      Blocks blocks;
      int first = 0;
      for (int k = 0; k < L - 1; ++k) {
        if (cuts & (1u << k)) {
          blocks.emplace_back(first, k);
          first = k + 1;
        }
      }
      blocks.emplace_back(first, L - 1);
      for (std::uint32_t flags = 0; flags < (1u << blocks.size()); ++flags) {
        Partition c;
        c.blocks = blocks;
        for (size_t b = 0; b < blocks.size(); ++b) c.resident.push_back((flags >> b) & 1u);
        evaluate(layers, CostModel{}, &c);
        if (c.memory() <= cap) least = std::min(least, c.read_bytes);
        // The deep ring: the largest swapped block, not a pair.
        if (c.block_max + c.resident_bytes <= cap) least_deep = std::min(least_deep, c.read_bytes);
        // ... and with the most of one swapped block kept that fits beside the ring.
        for (size_t r = 0; r < blocks.size(); ++r) {
          if (c.resident[r]) continue;
          Partition k = c;
          k.retain_block = static_cast<int>(r);
          std::uint64_t other = 0, s = 0;
          for (size_t b = 0; b < blocks.size(); ++b) {
            if (c.resident[b]) continue;
            std::uint64_t bytes = 0;
            for (int l = blocks[b].first; l <= blocks[b].second; ++l) bytes += layers[l].bytes;
            (b == r ? s : other) = b == r ? bytes : std::max(other, bytes);
          }
          if (c.resident_bytes + other > cap) continue;
          k.retained_bytes = std::min(s, cap - c.resident_bytes - other);
          evaluate(layers, CostModel{}, &k);
          if (k.block_max + k.resident_bytes + k.retained_bytes <= cap) least_deep = std::min(least_deep, k.read_bytes);
        }
      }
    }
    const std::uint64_t bound = min_read_bytes(layers, cap, /*pairs=*/true);  // as evaluate()'s memory() counts
    ASSERT_NE(least, UINT64_MAX);
    EXPECT_LE(bound, least) << "trial " << trial;
    tight += bound == least;
    const std::uint64_t deep = min_read_bytes(layers, cap);
    EXPECT_LE(deep, least_deep) << "trial " << trial;
    EXPECT_LE(least_deep, least) << "trial " << trial << ": a ring of one block never reads more";
    tight_deep += deep == least_deep;
    ++trials;
  }
  std::printf("min_read_bytes equals the exhaustive least in %d of %d tables\n", tight, trials);
  std::printf("deep ring: min_read_bytes equals the exhaustive least in %d of %d tables\n", tight_deep, trials);
  EXPECT_GT(tight_deep, trials / 2);
  EXPECT_GT(tight, trials / 2);
}

// memory_bound_ms on a worked example: a head computing with large activations, a weight-heavy
// tail. In 410,000 bytes the boundary after layer 0 holds 300,000 of activations, so at most
// 110,000 of the tail's 400,000 bytes can be read ahead during the head; the rest (7.25 ms at
// 40,000 bytes/ms) is read after it, while only layers 1-2 compute (2 ms): 10 + 7.25 = 17.25 ms,
// above max(compute 12, read 10). (A bound, not the optimum: the best schedule also waits for
// layer 2's 1 ms after its reads, 18.25 ms.)
TEST(Partitioner, MemoryBoundOnAWorkedExample) {
  std::vector<LayerCost> l(3);
  l[0].exec_ms = 10, l[0].live_bytes = 300000, l[0].peak_bytes = 300000;
  l[1].exec_ms = 1, l[1].live_bytes = 10, l[1].peak_bytes = 300000;
  l[2].exec_ms = 1, l[2].bytes = 400000, l[2].peak_bytes = 10;
  const double r = 1.0 / 40000;
  EXPECT_NEAR(memory_bound_ms(l, 410000, r), 17.25, 1e-9);
  // With room for the whole tail next to the head's activations, the bound is the compute.
  EXPECT_NEAR(memory_bound_ms(l, 700000, r), 12.0, 1e-9);
  // ... even with a slow disk: the tail fits resident next to the head's activations.
  EXPECT_NEAR(memory_bound_ms(l, 700000, 1.0 / 10000), 12.0, 1e-9);
  // A slow disk in the small budget: 290,000 bytes at 10,000 bytes/ms after the head.
  EXPECT_NEAR(memory_bound_ms(l, 410000, 1.0 / 10000), 39.0, 1e-9);
  // Below a layer's weights + its peak nothing can run.
  EXPECT_EQ(memory_bound_ms(l, 400005, r), std::numeric_limits<double>::infinity());
}

// memory_bound_ms is a lower bound on real schedules: the ring pipeline (simulate_ms), with the
// executor's memory accounting (a constant activation reserve of the largest peak, the ring what
// resident blocks leave), is never faster than it, for random layer tables, activations,
// partitions and budgets; with unlimited memory it is the compute time.
TEST(Partitioner, MemoryBoundIsBelowEveryRingSchedule) {
  std::mt19937 rng(31);
  CostModel m = io_heavy();
  m.block_ms = 0;  // reads at the bare rate: the bound has no per-block cost
  m.beta_ms_per_tensor = m.eta_ms_per_tensor = 0;
  int above = 0;
  for (int trial = 0; trial < 200; ++trial) {
    auto layers = random_layers(2 + trial % 25, rng);
    std::uniform_int_distribution<std::uint64_t> act(0, 200000);
    std::uint64_t reserve = 0;
    double compute = 0, read = 0;
    // Every other table is shaped like a detector: a head computing on large activations with
    // few weights, a weight-heavy tail on small activations (where the memory term binds).
    const bool shaped = trial % 2 == 1;
    for (size_t k = 0; k < layers.size(); ++k) {
      auto& x = layers[k];
      const bool head = 2 * k < layers.size();
      if (shaped) x.bytes = head ? x.bytes / 16 / 4096 * 4096 : x.bytes * 2;
      x.live_bytes = shaped && !head ? act(rng) / 20 : act(rng);
      x.peak_bytes = x.live_bytes + (shaped && !head ? 0 : act(rng));
      reserve = std::max(reserve, x.peak_bytes);
      compute += x.exec_ms;
      read += static_cast<double>(x.bytes) * m.alpha_ms_per_byte;
    }
    EXPECT_NEAR(memory_bound_ms(layers, std::uint64_t{1} << 40, m.alpha_ms_per_byte), compute, 1e-6) << trial;
    const std::uint64_t lo = min_arena_bytes(layers), hi = total_bytes(layers) + 4096;
    const std::uint64_t cap = shaped ? lo + (hi - lo) / 8 : std::uniform_int_distribution<std::uint64_t>(lo, std::max(lo, hi))(rng);
    Partition p = optimal_partition(layers, cap, m);
    ASSERT_TRUE(p.feasible) << trial;
    const double ring = p.ring_bytes ? simulate_ms(layers, p.blocks, p.resident, p.ring_bytes, p.ring_depth, m)
                                     : compute;
    const double bound = memory_bound_ms(layers, p.memory() + reserve, m.alpha_ms_per_byte);
    EXPECT_LE(bound, ring * (1 + 1e-9) + 1e-9) << "trial " << trial;
    EXPECT_GE(bound, compute - 1e-9) << "trial " << trial;
    above += bound > std::max(compute, p.read_bytes * m.alpha_ms_per_byte) * 1.01;
  }
  // The memory term matters in some of these tables (it is not just max(compute, reads)).
  std::printf("memory bound above max(compute, reads) in %d of 200 tables\n", above);
  EXPECT_GT(above, 0);
}

// Streaming (Note [Streaming into the ring]) on tables of layers of up to 16 MiB, so that blocks
// span several pieces: never faster than the physical bounds (all execution, all reads) nor the
// memory bound of the same memory, and faster than waiting for a whole room where the ring holds
// little more than the largest block.
TEST(Partitioner, StreamedRingIsBoundedAndBeatsWaitingForWholeRoom) {
  std::mt19937 rng(41);
  CostModel m = io_heavy();
  m.alpha_ms_per_byte /= 64;
  m.block_ms = 0;
  m.beta_ms_per_tensor = m.eta_ms_per_tensor = 0;
  int faster = 0, slower = 0, tight = 0;
  for (int trial = 0; trial < 200; ++trial) {
    auto layers = random_layers(3 + trial % 25, rng);
    double ex = 0, io = 0;
    for (auto& x : layers) {
      x.bytes *= 64;
      ex += x.exec_ms;
      io += m.alpha_ms_per_byte * static_cast<double>(x.bytes);
    }
    const std::uint64_t lo = min_arena_bytes(layers), hi = total_bytes(layers) + 4096;
    const std::uint64_t cap = std::uniform_int_distribution<std::uint64_t>(lo, std::max(lo, lo + (hi - lo) / 4))(rng);
    Partition p = optimal_partition(layers, cap, m);
    ASSERT_TRUE(p.feasible) << trial;
    if (p.ring_bytes == 0 || p.ring_depth != 0) continue;
    // The plan's ring, and a ring of its largest block (where streaming matters most).
    for (std::uint64_t ring : {p.ring_bytes, (p.block_max + 4095) / 4096 * 4096}) {
      const double s = simulate_ms(layers, p.blocks, p.resident, ring, 0, m, true, p.retain_block, p.retained_bytes);
      const double w = simulate_ms(layers, p.blocks, p.resident, ring, 0, m, false, p.retain_block, p.retained_bytes);
      const double swapped_io = m.alpha_ms_per_byte * static_cast<double>(p.read_bytes);
      EXPECT_GE(s, std::max(ex, swapped_io) - 1e-6) << "trial " << trial << " ring " << ring;
      EXPECT_LE(memory_bound_ms(layers, p.resident_bytes + p.retained_bytes + ring, m.alpha_ms_per_byte),
                s * (1 + 1e-9) + 1e-9)
          << "trial " << trial << " ring " << ring;
      faster += s < w * 0.99;
      slower += s > w * 1.01;
      tight += ring < p.ring_bytes;
    }
    (void)io;
  }
  std::printf("streaming: faster in %d, slower in %d (%d tight rings)\n", faster, slower, tight);
  EXPECT_GT(faster, 20);
  EXPECT_LE(slower, faster / 10) << "streaming is rarely slower than waiting for whole room";
}

TEST(PartitionTable, LookupMatchesAFreshSearchAtGridPoints) {
  std::mt19937 rng(3);
  const CostModel m = io_heavy();
  auto layers = random_layers(40, rng);
  PartitionTable table(layers, m, 8 * 4096);
  EXPECT_GT(table.size(), 2u);
  EXPECT_FALSE(table.lookup(table.min_capacity() - 1).feasible);
  for (std::uint64_t a = table.min_capacity(); a < table.min_capacity() + 20 * 8 * 4096; a += 8 * 4096) {
    const Partition& p = table.lookup(a + 100);  // between grid points: the point below
    Partition fresh = optimal_partition(layers, a, m);
    ASSERT_TRUE(p.feasible);
    EXPECT_NEAR(p.predicted_ms, fresh.predicted_ms, 1e-9);
    EXPECT_LE(p.memory(), a + 100);
  }
  EXPECT_EQ(table.lookup(total_bytes(layers)).read_bytes, 0u) << "the top of the grid keeps everything";
}

TEST(PartitionTable, PaperTableRowsAndLookup) {
  std::mt19937 rng(5);
  const CostModel m = io_heavy();
  auto layers = random_layers(20, rng);
  auto rows = paper_table(layers, m, 20);
  ASSERT_EQ(rows.size(), 20u);
  for (const auto& r : rows) EXPECT_EQ(static_cast<int>(r.partition.blocks.size()), r.n);
  EXPECT_EQ(rows[0].partition.read_bytes, 0u) << "one block is kept";
  const std::uint64_t cap = rows[5].partition.memory();
  const Partition* p = paper_lookup(rows, cap);
  ASSERT_NE(p, nullptr);
  EXPECT_LE(p->memory(), cap);
  for (const auto& r : rows) {
    if (r.partition.memory() <= cap) EXPECT_LE(p->predicted_ms, r.partition.predicted_ms);
  }
  EXPECT_EQ(paper_lookup(rows, 0), nullptr);
  // The DP is at least as good as the paper's best row at the same capacity, without residency.
  PartitionOptions off;
  off.residency = false;
  off.read_ahead = ReadAhead::kPaper;
  EXPECT_LE(optimal_partition(layers, cap, m, off).predicted_ms, p->predicted_ms + 1e-9);
}

TEST(CostFit, RecoversKnownCoefficientsAndClampsNegativeOnes) {
  std::mt19937 rng(9);
  std::normal_distribution<double> noise(0, 0.01);
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (int s = 0; s < 60; ++s) {
    const double bytes = std::uniform_real_distribution<double>(1e5, 6e7)(rng);
    const double tensors = std::uniform_int_distribution<int>(1, 80)(rng);
    X.push_back({bytes, tensors, 1.0});
    y.push_back(bytes / 3e6 + 0.002 * tensors + 0.15 + noise(rng));  // 3 GB/s, 2 us/tensor, 0.15 ms
  }
  auto b = fit_nonnegative(X, y);
  EXPECT_NEAR(1.0 / b[0], 3e6, 3e6 * 0.01);
  EXPECT_NEAR(b[1], 0.002, 0.0005);
  EXPECT_NEAR(b[2], 0.15, 0.02);
  // y decreasing in x2: its coefficient is clamped at zero, the others refitted.
  std::vector<double> y2;
  for (const auto& row : X) y2.push_back(row[0] / 3e6 - 0.001 * row[1]);
  auto c = fit_nonnegative(X, y2);
  EXPECT_EQ(c[1], 0.0);
  EXPECT_GT(c[0], 0.0);
}

TEST(DeviceProfileFile, RoundTripsAndRefusesBadFields) {
  test_util::ScopedTempDir tmp("swapnet-partitioner-test");
  const std::string dir = tmp.path();
  const std::string path = dir + "/sub/device.json";
  DeviceProfile p;
  p.threads = 3;
  p.raw_read_mb_s = 2500;
  p.sustained_read_mb_s = 2400;
  p.cost.alpha_ms_per_byte = 1.0 / 2.5e6;
  p.cost.beta_ms_per_tensor = 0.001;
  p.cost.block_ms = 0.1;
  p.gamma_ms_per_flop = 1e-8;
  p.exec_source = "flops";
  ASSERT_TRUE(save_profile(path, p).ok());
  DeviceProfile q;
  Status s = load_profile(path, &q);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(q.threads, 3);
  EXPECT_DOUBLE_EQ(q.cost.alpha_ms_per_byte, p.cost.alpha_ms_per_byte);
  EXPECT_DOUBLE_EQ(q.cost.block_ms, 0.1);
  EXPECT_DOUBLE_EQ(q.sustained_read_mb_s, 2400);
  EXPECT_EQ(q.exec_source, "flops");
  EXPECT_EQ(profile_mismatch(q, 3), "") << "saved here: matches this host and CPU";
  EXPECT_NE(profile_mismatch(q, 4).find("3 threads"), std::string::npos);

  auto rewrite = [&](const std::string& from, const std::string& to) {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    std::ofstream(dir + "/bad.json") << text;
    DeviceProfile r;
    return load_profile(dir + "/bad.json", &r);
  };
  Status bad = rewrite("\"block_ms\": 0.1", "\"block_ms\": -1");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("'block_ms'"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("bad.json"), std::string::npos) << bad.message();
  bad = rewrite("\"version\": " + std::to_string(DeviceProfile::kVersion), "\"version\": 7");
  EXPECT_NE(bad.message().find("version 7"), std::string::npos) << bad.message();
  bad = rewrite("\"exec_source\": \"flops\"", "\"exec_source\": \"guess\"");
  EXPECT_NE(bad.message().find("exec_source"), std::string::npos) << bad.message();
  std::ofstream(dir + "/junk.json") << "{ not json";
  DeviceProfile r;
  bad = load_profile(dir + "/junk.json", &r);
  EXPECT_NE(bad.message().find("invalid JSON"), std::string::npos) << bad.message();
  bad = load_profile(dir + "/missing.json", &r);
  EXPECT_NE(bad.message().find("no device profile"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace swapnet
