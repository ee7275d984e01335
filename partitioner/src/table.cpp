// Partitions over budgets: the budget grid (PartitionTable, one optimal partition per step of
// capacity) and the paper's table of equal-byte partitions into 1..n blocks.
#include "swapnet/partitioner.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace swapnet {

PartitionTable::PartitionTable(const std::vector<LayerCost>& layers, const CostModel& m, std::uint64_t step,
                               const PartitionOptions& options) {
  min_ = min_arena_bytes(layers, options.read_ahead);
  std::uint64_t total = 0;
  for (const auto& l : layers) total += l.bytes;
  step = std::max<std::uint64_t>(step, 1);
  for (std::uint64_t a = min_;; a += step) {
    a = std::min(a, total);
    grid_.push_back(a);
    parts_.push_back(optimal_partition(layers, a, m, options));
    if (a >= total) break;
  }
}

const Partition& PartitionTable::lookup(std::uint64_t capacity) const {
  auto it = std::upper_bound(grid_.begin(), grid_.end(), capacity);
  if (it == grid_.begin()) return infeasible_;
  return parts_[static_cast<size_t>(it - grid_.begin()) - 1];
}

Blocks equal_bytes_blocks(const std::vector<LayerCost>& layers, int n) {
  Blocks blocks;
  const int L = static_cast<int>(layers.size());
  if (L == 0) return blocks;
  n = std::max(1, std::min(n, L));
  double total = 0;
  for (const auto& l : layers) total += static_cast<double>(l.bytes);
  const double target = total / n;
  int first = 0;
  double acc = 0;
  for (int k = 0; k < L; ++k) {
    acc += static_cast<double>(layers[k].bytes);
    const int blocks_after = n - static_cast<int>(blocks.size()) - 1;  // still to open after this one
    const int layers_after = L - k - 1;
    const bool must = blocks_after > 0 && layers_after == blocks_after;  // one layer each from here
    const bool want = blocks_after > 0 && acc >= target * static_cast<double>(blocks.size() + 1);
    if (k == L - 1 || must || want) {
      blocks.emplace_back(first, k);
      first = k + 1;
    }
  }
  return blocks;
}

std::vector<PaperRow> paper_table(const std::vector<LayerCost>& layers, const CostModel& m, int max_blocks) {
  std::vector<PaperRow> rows;
  max_blocks = std::min<int>(max_blocks, static_cast<int>(layers.size()));
  for (int n = 1; n <= max_blocks; ++n) {
    PaperRow r;
    r.n = n;
    r.partition.blocks = equal_bytes_blocks(layers, n);
    r.partition.resident.assign(r.partition.blocks.size(), n == 1 ? 1 : 0);  // one block: kept
    evaluate(layers, m, &r.partition);
    r.partition.feasible = true;
    rows.push_back(std::move(r));
  }
  return rows;
}

const Partition* paper_lookup(const std::vector<PaperRow>& table, std::uint64_t capacity) {
  const Partition* best = nullptr;
  for (const auto& r : table) {
    if (r.partition.memory() > capacity) continue;
    if (best == nullptr || r.partition.predicted_ms < best->predicted_ms) best = &r.partition;
  }
  return best;
}

}  // namespace swapnet
