// Bounds no plan can beat: the least time an inference takes when weights must pass through a
// memory budget (memory_bound_ms), the fewest bytes any partition fitting a capacity reads
// (min_read_bytes), and the least arena a read-ahead mode needs (min_arena_bytes).
#include "swapnet/partitioner.h"

#include "prefix.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace swapnet {

using detail::kInf;

double memory_bound_ms(const std::vector<LayerCost>& layers, std::uint64_t budget, double ms_per_byte) {
  const int n = static_cast<int>(layers.size());
  if (n == 0) return 0;
  // Points in cyclic order: 2k = layer k at its activation peak, 2k+1 = the boundary after it.
  // avail[x]: the most bytes that may hold weights of other layers at point x.
  const int P = 2 * n;
  std::vector<double> avail(P);
  for (int k = 0; k < n; ++k) {
    const LayerCost& l = layers[k];
    const std::uint64_t before = k > 0 ? layers[k - 1].live_bytes : 0;
    const std::uint64_t peak = std::max({l.peak_bytes, l.live_bytes, l.peak_bytes ? 0 : before});
    if (peak + l.bytes > budget) return kInf;  // no schedule runs this layer in the budget
    avail[2 * k] = static_cast<double>(budget - peak - l.bytes);
    avail[2 * k + 1] = static_cast<double>(budget - l.live_bytes);
  }
  // Prefix sums over two periods of layers.
  std::vector<double> ex(2 * n + 1, 0), by(2 * n + 1, 0);
  for (int k = 0; k < 2 * n; ++k) {
    ex[k + 1] = ex[k] + layers[k % n].exec_ms;
    by[k + 1] = by[k] + static_cast<double>(layers[k % n].bytes);
  }
  // Segment from point x to point y (x < y <= x + P, unrolled): the layers after x's layer
  // through y's layer need their weights in (x, y]; layers strictly between them compute there.
  auto seg = [&](int x, int y) {
    const int lx = x / 2, ly = y / 2;  // unrolled layer indices
    double need = by[ly + 1] - by[lx + 1];
    // A whole period from a layer's peak back to it: that layer's weights, held at x, are the
    // ones it needs again.
    if (x % 2 == 0 && ly == lx + n) need -= static_cast<double>(layers[lx % n].bytes);
    const int last_inside = (y % 2 == 1) ? ly : ly - 1;
    const double compute = last_inside > lx ? ex[last_inside + 1] - ex[lx + 1] : 0.0;
    return std::max(compute, std::max(0.0, need - avail[x % P]) * ms_per_byte);
  };
  // Starting points: all of them for models of up to 200 layers, else the 128 with the least room
  // (where the bound binds; fewer starts still give a valid bound).
  std::vector<int> starts(P);
  for (int x = 0; x < P; ++x) starts[x] = x;
  if (n > 200) {
    std::partial_sort(starts.begin(), starts.begin() + 128, starts.end(),
                      [&](int a, int b) { return avail[a] < avail[b]; });
    starts.resize(128);
  }
  double best = 0;
  std::vector<double> dp(P + 1);
  for (int s : starts) {
    dp[0] = 0;
    for (int j = 1; j <= P; ++j) {
      double v = -kInf;
      for (int i = 0; i < j; ++i) v = std::max(v, dp[i] + seg(s + i, s + j));
      dp[j] = v;
    }
    best = std::max(best, dp[P]);
  }
  return best;
}

namespace {

// The possible rings A, ascending: a layer, or (`pairs`) a sum of two, within capacity.
std::vector<std::uint64_t> candidate_rings(const std::vector<LayerCost>& layers, std::uint64_t capacity, bool pairs) {
  const int L = static_cast<int>(layers.size());
  std::vector<std::uint64_t> rings;
  for (int i = 0; i < L; ++i) {
    if (layers[i].bytes > capacity) continue;
    rings.push_back(layers[i].bytes);
    for (int j = i + 1; pairs && j < L; ++j) {
      if (layers[i].bytes + layers[j].bytes <= capacity) rings.push_back(layers[i].bytes + layers[j].bytes);
    }
  }
  std::sort(rings.begin(), rings.end());
  rings.erase(std::unique(rings.begin(), rings.end()), rings.end());
  return rings;
}

// The largest sum of layers within `room` that includes every layer above `A`: a subset sum
// over units of `unit` bytes (a bitset), or room itself where the bytes are not whole pages
// (`unit` 1).
std::uint64_t most_resident(const std::vector<LayerCost>& layers, std::uint64_t unit, std::uint64_t A,
                            std::uint64_t room) {
  std::uint64_t forced = 0;
  for (const auto& l : layers) forced += l.bytes > A ? l.bytes : 0;
  const std::uint64_t cells = room / unit + 1;
  if (unit == 1 || cells > (1u << 22)) return room;
  std::vector<std::uint64_t> bits((cells + 63) / 64, 0);
  auto set = [&](std::uint64_t v) { bits[v / 64] |= 1ull << (v % 64); };
  auto get = [&](std::uint64_t v) { return (bits[v / 64] >> (v % 64)) & 1u; };
  if (forced > room) return 0;
  set(forced / unit);
  for (const auto& l : layers) {
    if (l.bytes > A || l.bytes == 0) continue;
    const std::uint64_t w = l.bytes / unit;
    if (w >= cells) continue;
    for (std::uint64_t v = cells - 1; v >= w; --v) {
      if (get(v - w)) set(v);
      if (v == w) break;
    }
  }
  for (std::uint64_t v = cells; v-- > 0;) {
    if (get(v)) return v * unit;
  }
  return 0;
}

constexpr std::uint64_t kNone = UINT64_MAX;

// With pairs: the fewest resident bytes that keep every consecutive swapped pair within A
// (kNone: none do). `pre` holds the layers' prefix sums of bytes; `dp` is scratch of L entries.
std::uint64_t least_resident_for_pairs(const std::vector<LayerCost>& layers, const std::vector<std::uint64_t>& pre,
                                       std::uint64_t A, std::vector<std::uint64_t>& dp) {
  const int L = static_cast<int>(layers.size());
  // dp[j]: fewest resident bytes in layers [0, j) with j swapped and every pair so far within A.
  std::uint64_t best = kNone;
  for (int j = 0; j < L; ++j) {
    dp[j] = kNone;
    if (layers[j].bytes > A) continue;
    dp[j] = pre[j];  // j is the first swapped layer
    for (int i = 0; i < j; ++i) {
      if (dp[i] == kNone || layers[i].bytes + layers[j].bytes > A) continue;
      dp[j] = std::min(dp[j], dp[i] + (pre[j] - pre[i + 1]));
    }
    best = std::min(best, dp[j] + (pre[L] - pre[j + 1]));
  }
  return best;
}

}  // namespace

std::uint64_t min_read_bytes(const std::vector<LayerCost>& layers, std::uint64_t capacity, bool pairs) {
  const int L = static_cast<int>(layers.size());
  std::vector<std::uint64_t> pre(L + 1, 0);
  for (int k = 0; k < L; ++k) pre[k + 1] = pre[k] + layers[k].bytes;
  const std::uint64_t total = pre[L];
  if (total <= capacity) return 0;
  // Any plan whose swapped layers are at most A bytes (the deep ring), or whose consecutive
  // swapped layers pair up to at most A bytes (`pairs`: A a layer or a sum of two), needs a ring
  // of A and keeps every layer larger than A resident, within capacity - A: it reads at least
  // total - (the largest subset sum of layers within capacity - A that holds those). With pairs,
  // A is possible when the fewest resident bytes that keep every consecutive swapped pair within
  // A (a DP over the last swapped layer) fit in capacity - A. The bound is the least over
  // possible A (it ignores only which subsets leave swapped pairs within A).
  const std::vector<std::uint64_t> rings = candidate_rings(layers, capacity, pairs);
  std::uint64_t unit = 4096;
  for (const auto& l : layers) unit = l.bytes % unit == 0 ? unit : 1;
  std::uint64_t least = total;
  std::vector<std::uint64_t> dp(L);
  for (std::uint64_t A : rings) {
    if (!pairs) {
      std::uint64_t forced = 0;
      for (const auto& l : layers) forced += l.bytes > A ? l.bytes : 0;
      if (A <= capacity && forced <= capacity - A) {
        least = std::min(least, total - most_resident(layers, unit, A, capacity - A));
      }
      // One layer kept in part (Partition::retain_block) fills what whole layers leave: the
      // ring holds the rest of it, so the layers above A fit when their sum does.
      if (A <= capacity && forced <= capacity) least = std::min(least, total - (capacity - A));
      continue;
    }
    const std::uint64_t best = least_resident_for_pairs(layers, pre, A, dp);
    if (best == kNone || A > capacity || best > capacity - A) continue;
    least = std::min(least, total - most_resident(layers, unit, A, capacity - A));
  }
  return least;
}

std::uint64_t min_arena_bytes(const std::vector<LayerCost>& layers, ReadAhead read_ahead) {
  if (layers.size() <= 1) return layers.empty() ? 0 : layers[0].bytes;
  std::uint64_t worst = 0;
  if (read_ahead == ReadAhead::kRing) {
    for (const auto& l : layers) worst = std::max(worst, l.bytes);
    return worst;
  }
  for (size_t k = 0; k + 1 < layers.size(); ++k) worst = std::max(worst, layers[k].bytes + layers[k + 1].bytes);
  std::uint64_t all = 0;
  for (const auto& l : layers) all += l.bytes;
  return std::min(worst, all);
}

}  // namespace swapnet
