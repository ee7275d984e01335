// swapnet/partitioner.h — where to cut a model into blocks: pure arithmetic over the layer
// table (no torch, no I/O).
//
// The latency of a partition follows the two-block pipeline (the paper's Eq. 4): block b+1 is
// fetched while block b executes, so each step costs max(t_ex(b), t_in(b+1)):
//   T = t_in(0) + sum_b max(t_ex(b), t_in(b+1)) + t_out(last),   t_in(n) = 0
// with t_in = alpha*bytes + beta*tensors, t_ex = per-layer measured time (or gamma*FLOPs),
// t_out = eta*tensors. A single block is resident (read once, as the executor does): T = t_ex. A partition is feasible for an arena of C bytes when every pair of
// adjacent blocks fits: s_b + s_{b+1} <= C (one block: s_0 <= C).
// optimal_partition() finds the minimum-T feasible partition exactly by dynamic programming
// over (previous block, current block) in O(L^3); tests compare it with exhaustive search.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "swapnet/swapcore.h"

namespace swapnet {

struct LayerCost {
  std::uint64_t bytes = 0;    // aligned bytes in the image
  std::uint32_t tensors = 0;  // the paper's depth
  double exec_ms = 0;         // execution time (measured, or gamma * FLOPs)
};

struct CostModel {
  double alpha_ms_per_byte = 1.0 / 1.5e6;  // swap-in: 1 / (read rate in bytes per ms)
  double beta_ms_per_tensor = 0.0005;      // assembly by reference: ~0.5 us per tensor
  double eta_ms_per_tensor = 0.0;          // swap-out (dropping views): negligible
};

using Blocks = std::vector<std::pair<int, int>>;  // [first, last] layer of each block

struct Partition {
  bool feasible = false;
  Blocks blocks;
  double predicted_ms = 0;
  std::uint64_t max_pair_bytes = 0;  // the arena this partition needs
};

// Predicted latency of `blocks` (Eq. 4 as above).
SWAPNET_API double predict_ms(const std::vector<LayerCost>& layers, const Blocks& blocks, const CostModel& m);
// The arena bytes `blocks` needs: the largest adjacent pair (or the single block).
SWAPNET_API std::uint64_t arena_bytes(const std::vector<LayerCost>& layers, const Blocks& blocks);
// The smallest arena any partition needs: the finest partition's.
SWAPNET_API std::uint64_t min_arena_bytes(const std::vector<LayerCost>& layers);
// The minimum-latency partition whose adjacent pairs fit `arena` (exact, O(L^3)).
SWAPNET_API Partition optimal_partition(const std::vector<LayerCost>& layers, std::uint64_t arena, const CostModel& m);
// The same by trying all 2^(L-1) partitions (tests only; L <= 25).
SWAPNET_API Partition exhaustive_partition(const std::vector<LayerCost>& layers, std::uint64_t arena,
                                           const CostModel& m);

// Optimal partitions precomputed for a grid of arena sizes, so a new budget maps to its
// partition by a binary search (microseconds) instead of a search (milliseconds).
class SWAPNET_API PartitionTable {
 public:
  // Grid from min_arena_bytes to the model's bytes (where one block fits) in `step` bytes.
  PartitionTable(const std::vector<LayerCost>& layers, const CostModel& m, std::uint64_t step);
  // The best partition whose arena is <= `arena` (largest grid point not above it);
  // infeasible below the minimum.
  const Partition& lookup(std::uint64_t arena) const;
  std::size_t size() const { return grid_.size(); }
  std::uint64_t min_arena() const { return min_; }

 private:
  std::uint64_t min_ = 0;
  std::vector<std::uint64_t> grid_;
  std::vector<Partition> parts_;
  Partition infeasible_;
};

}  // namespace swapnet
