// Exact partitioning by dynamic programming, exhaustive search for tests, and the budget grid.
#include "swapnet/partitioner.h"

#include <algorithm>
#include <limits>

namespace swapnet {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Prefix {
  std::vector<std::uint64_t> bytes;  // bytes[i] = sum of layers [0, i)
  std::vector<std::uint64_t> tensors;
  std::vector<double> exec;
  explicit Prefix(const std::vector<LayerCost>& l) : bytes(l.size() + 1), tensors(l.size() + 1), exec(l.size() + 1) {
    for (size_t i = 0; i < l.size(); ++i) {
      bytes[i + 1] = bytes[i] + l[i].bytes;
      tensors[i + 1] = tensors[i] + l[i].tensors;
      exec[i + 1] = exec[i] + l[i].exec_ms;
    }
  }
  std::uint64_t b(int i, int j) const { return bytes[j + 1] - bytes[i]; }  // layers [i, j]
  double t_in(int i, int j, const CostModel& m) const {
    return m.alpha_ms_per_byte * static_cast<double>(b(i, j)) +
           m.beta_ms_per_tensor * static_cast<double>(tensors[j + 1] - tensors[i]);
  }
  double t_ex(int i, int j) const { return exec[j + 1] - exec[i]; }
  double t_out(int i, int j, const CostModel& m) const {
    return m.eta_ms_per_tensor * static_cast<double>(tensors[j + 1] - tensors[i]);
  }
};

}  // namespace

double predict_ms(const std::vector<LayerCost>& layers, const Blocks& blocks, const CostModel& m) {
  if (blocks.empty()) return 0;
  Prefix p(layers);
  // One block stays resident (the executor reads it once): per inference only execution.
  if (blocks.size() == 1) return p.t_ex(blocks[0].first, blocks[0].second);
  double t = p.t_in(blocks[0].first, blocks[0].second, m);
  for (size_t b = 0; b < blocks.size(); ++b) {
    double next_in = b + 1 < blocks.size() ? p.t_in(blocks[b + 1].first, blocks[b + 1].second, m) : 0.0;
    t += std::max(p.t_ex(blocks[b].first, blocks[b].second), next_in);
  }
  return t + p.t_out(blocks.back().first, blocks.back().second, m);
}

std::uint64_t arena_bytes(const std::vector<LayerCost>& layers, const Blocks& blocks) {
  Prefix p(layers);
  std::uint64_t worst = blocks.empty() ? 0 : p.b(blocks[0].first, blocks[0].second);
  for (size_t b = 0; b + 1 < blocks.size(); ++b) {
    worst = std::max(worst, p.b(blocks[b].first, blocks[b].second) + p.b(blocks[b + 1].first, blocks[b + 1].second));
  }
  return worst;
}

std::uint64_t min_arena_bytes(const std::vector<LayerCost>& layers) {
  if (layers.size() <= 1) return layers.empty() ? 0 : layers[0].bytes;
  std::uint64_t worst = 0;
  for (size_t k = 0; k + 1 < layers.size(); ++k) worst = std::max(worst, layers[k].bytes + layers[k + 1].bytes);
  // One block holding everything can be smaller than the finest pairs only for tiny models.
  std::uint64_t all = 0;
  for (const auto& l : layers) all += l.bytes;
  return std::min(worst, all);
}

Partition optimal_partition(const std::vector<LayerCost>& layers, std::uint64_t arena, const CostModel& m) {
  Partition best;
  const int L = static_cast<int>(layers.size());
  if (L == 0) return best;
  Prefix p(layers);
  // One block: no pipeline.
  if (p.b(0, L - 1) <= arena) {
    best.feasible = true;
    best.blocks = {{0, L - 1}};
    best.predicted_ms = predict_ms(layers, best.blocks, m);
    best.max_pair_bytes = p.b(0, L - 1);
  }
  // dp[i][j]: least time until block [i, j] has been fetched, with every earlier step counted;
  // the step from the previous block [k, i-1] costs max(t_ex(k..i-1), t_in(i..j)).
  std::vector<std::vector<double>> dp(L, std::vector<double>(L, kInf));
  std::vector<std::vector<int>> from(L, std::vector<int>(L, -1));
  for (int j = 0; j < L; ++j) {
    if (p.b(0, j) <= arena) dp[0][j] = p.t_in(0, j, m);
  }
  for (int i = 1; i < L; ++i) {
    for (int j = i; j < L; ++j) {
      const std::uint64_t cur = p.b(i, j);
      if (cur > arena) break;  // longer blocks only grow
      const double t_in = p.t_in(i, j, m);
      for (int k = i - 1; k >= 0; --k) {
        if (p.b(k, i - 1) + cur > arena) break;
        if (dp[k][i - 1] == kInf) continue;
        double t = dp[k][i - 1] + std::max(p.t_ex(k, i - 1), t_in);
        if (t < dp[i][j]) {
          dp[i][j] = t;
          from[i][j] = k;
        }
      }
    }
  }
  double t_best = best.feasible ? best.predicted_ms : kInf;
  int last = -1;
  for (int i = 1; i < L; ++i) {
    if (dp[i][L - 1] == kInf) continue;
    double t = dp[i][L - 1] + p.t_ex(i, L - 1) + p.t_out(i, L - 1, m);
    if (t < t_best) {
      t_best = t;
      last = i;
    }
  }
  if (last >= 0) {
    Blocks blocks;
    int i = last, j = L - 1;
    while (i > 0) {
      blocks.emplace_back(i, j);
      int k = from[i][j];
      j = i - 1;
      i = k;
    }
    blocks.emplace_back(0, j);
    std::reverse(blocks.begin(), blocks.end());
    best.feasible = true;
    best.blocks = std::move(blocks);
    best.predicted_ms = t_best;
    best.max_pair_bytes = arena_bytes(layers, best.blocks);
  }
  return best;
}

Partition exhaustive_partition(const std::vector<LayerCost>& layers, std::uint64_t arena, const CostModel& m) {
  Partition best;
  const int L = static_cast<int>(layers.size());
  if (L == 0 || L > 25) return best;
  for (std::uint32_t mask = 0; mask < (1u << (L - 1)); ++mask) {  // bit k: cut after layer k
    Blocks blocks;
    int first = 0;
    for (int k = 0; k < L - 1; ++k) {
      if (mask & (1u << k)) {
        blocks.emplace_back(first, k);
        first = k + 1;
      }
    }
    blocks.emplace_back(first, L - 1);
    if (arena_bytes(layers, blocks) > arena) continue;
    double t = predict_ms(layers, blocks, m);
    if (!best.feasible || t < best.predicted_ms) {
      best.feasible = true;
      best.blocks = blocks;
      best.predicted_ms = t;
      best.max_pair_bytes = arena_bytes(layers, blocks);
    }
  }
  return best;
}

PartitionTable::PartitionTable(const std::vector<LayerCost>& layers, const CostModel& m, std::uint64_t step) {
  min_ = min_arena_bytes(layers);
  std::uint64_t total = 0;
  for (const auto& l : layers) total += l.bytes;
  step = std::max<std::uint64_t>(step, 1);
  for (std::uint64_t a = min_;; a += step) {
    a = std::min(a, total);
    grid_.push_back(a);
    parts_.push_back(optimal_partition(layers, a, m));
    if (a >= total) break;
  }
}

const Partition& PartitionTable::lookup(std::uint64_t arena) const {
  auto it = std::upper_bound(grid_.begin(), grid_.end(), arena);
  if (it == grid_.begin()) return infeasible_;
  return parts_[static_cast<size_t>(it - grid_.begin()) - 1];
}

}  // namespace swapnet
