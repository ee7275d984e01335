// Choosing a partition: the exact DP over the cuts for a given set of resident layers
// (optimal_partition_for), the exhaustive searches the tests check it against, and
// optimal_partition, which tries candidate resident sets, cuts and rings and keeps the best.
#include "swapnet/partitioner.h"

#include "prefix.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

namespace swapnet {
namespace {

using detail::kInf;
using detail::Prefix;

// Blocks from swapped blocks (in order) and resident flags per layer: maximal resident runs
// become resident blocks.
void assemble(const std::vector<char>& resident_layer, const Blocks& swapped, Partition* p) {
  const int L = static_cast<int>(resident_layer.size());
  p->blocks.clear();
  p->resident.clear();
  size_t s = 0;
  for (int k = 0; k < L;) {
    if (resident_layer[k]) {
      int e = k;
      while (e + 1 < L && resident_layer[e + 1]) ++e;
      p->blocks.emplace_back(k, e);
      p->resident.push_back(1);
      k = e + 1;
    } else {
      p->blocks.push_back(swapped[s]);
      p->resident.push_back(0);
      k = swapped[s++].second + 1;
    }
  }
}

// The swapped layers as optimal_partition_for's DP walks them: per layer the previous swapped
// layer and the start of its swapped run; the last swapped layer (-1: everything resident).
struct SwappedRuns {
  std::vector<int> prev_nr, run_start;
  int last_nr = -1;
};

SwappedRuns swapped_runs(const std::vector<char>& resident_layer) {
  const int L = static_cast<int>(resident_layer.size());
  SwappedRuns r;
  r.prev_nr.assign(L, -1);  // previous swapped layer
  r.run_start.assign(L, -1);  // start of this swapped run
  for (int k = 0; k < L; ++k) {
    r.prev_nr[k] = r.last_nr;
    if (!resident_layer[k]) {
      r.run_start[k] = (k > 0 && !resident_layer[k - 1]) ? r.run_start[k - 1] : k;
      r.last_nr = k;
    }
  }
  return r;
}

// dp[i][j]: earliest start (fetch complete) of swapped block [i, j] over partitions of the
// swapped layers before it; from[i][j] the first layer of the block before it.
struct BlockDp {
  std::vector<std::vector<double>> dp;
  std::vector<std::vector<int>> from;
};

BlockDp block_dp(const Prefix& p, const std::vector<char>& resident_layer, const SwappedRuns& r,
                 std::uint64_t arena, const CostModel& m) {
  const int L = static_cast<int>(resident_layer.size());
  BlockDp d;
  std::vector<std::vector<double>>& dp = d.dp;
  dp.resize(L);
  d.from.resize(L);
  for (int i = 0; i < L; ++i) {
    if (resident_layer[i]) continue;
    dp[i].assign(L - i, kInf);
    d.from[i].assign(L - i, -1);
    const int e = r.prev_nr[i];  // the previous block ends here
    for (int j = i; j < L && !resident_layer[j]; ++j) {
      const std::uint64_t cur = p.b(i, j);
      if (cur > arena) break;  // longer blocks only grow
      const double io = p.io(i, j, m);
      if (e < 0) {
        dp[i][j - i] = std::max(p.ex(0, i - 1), io);  // fetched during the resident prefix
        continue;
      }
      const double gap = p.ex(e + 1, i - 1);
      for (int k = e; k >= r.run_start[e]; --k) {
        if (p.b(k, e) + cur > arena) break;
        const double prev = dp[k][e - k];
        if (prev == kInf) continue;
        const double t = prev + p.bind(k, e, m) + std::max(p.ex(k, e) + p.out(k, e, m) + gap, io);
        if (t < dp[i][j - i]) {
          dp[i][j - i] = t;
          d.from[i][j - i] = k;
        }
      }
    }
  }
  return d;
}

// The first layer of the last swapped block in the fastest partition (-1: none fits).
int best_last_block(const Prefix& p, const BlockDp& d, const SwappedRuns& r, int L, const CostModel& m) {
  const int last_nr = r.last_nr;
  double t_best = kInf;
  int last = -1;
  for (int i = r.run_start[last_nr]; i <= last_nr; ++i) {
    const double t0 = d.dp[i][last_nr - i];
    if (t0 == kInf) continue;
    const double t = t0 + p.bind(i, last_nr, m) + p.ex(i, last_nr) + p.out(i, last_nr, m) + p.ex(last_nr + 1, L - 1) +
                     m.inference_ms;
    if (t < t_best) {
      t_best = t;
      last = i;
    }
  }
  return last;
}

// The swapped blocks, in order, of the partition whose last block starts at `last`.
Blocks swapped_blocks(const BlockDp& d, const SwappedRuns& r, int last) {
  Blocks swapped;
  for (int i = last, j = r.last_nr; i >= 0;) {
    swapped.emplace_back(i, j);
    const int k = d.from[i][j - i];
    j = r.prev_nr[i];
    i = k;
  }
  std::reverse(swapped.begin(), swapped.end());
  return swapped;
}

}  // namespace

Partition optimal_partition_for(const std::vector<LayerCost>& layers, const std::vector<char>& resident_layer,
                                std::uint64_t capacity, const CostModel& m) {
  Partition best;
  const int L = static_cast<int>(layers.size());
  if (L == 0 || static_cast<int>(resident_layer.size()) != L) return best;
  Prefix p(layers);
  std::uint64_t resident_bytes = 0;
  for (int k = 0; k < L; ++k) resident_bytes += resident_layer[k] ? layers[k].bytes : 0;
  if (resident_bytes > capacity) return best;
  const std::uint64_t arena = capacity - resident_bytes;
  const SwappedRuns runs = swapped_runs(resident_layer);
  if (runs.last_nr < 0) {  // everything resident
    assemble(resident_layer, {}, &best);  // (evaluate adds inference_ms)
    evaluate(layers, m, &best);
    best.feasible = true;
    return best;
  }
  const BlockDp d = block_dp(p, resident_layer, runs, arena, m);
  const int last = best_last_block(p, d, runs, L, m);
  if (last < 0) return best;
  assemble(resident_layer, swapped_blocks(d, runs, last), &best);
  evaluate(layers, m, &best);
  best.feasible = true;
  return best;
}

Partition exhaustive_partition_for(const std::vector<LayerCost>& layers, const std::vector<char>& resident_layer,
                                   std::uint64_t capacity, const CostModel& m) {
  Partition best;
  const int L = static_cast<int>(layers.size());
  if (L == 0 || static_cast<int>(resident_layer.size()) != L) return best;
  std::vector<int> free_cuts;  // cut after k possible: k and k+1 both swapped
  for (int k = 0; k + 1 < L; ++k) {
    if (!resident_layer[k] && !resident_layer[k + 1]) free_cuts.push_back(k);
  }
  if (free_cuts.size() > 24) return best;
  for (std::uint32_t mask = 0; mask < (1u << free_cuts.size()); ++mask) {
    Blocks swapped;
    int first = -1;
    for (int k = 0; k < L; ++k) {
      if (resident_layer[k]) continue;
      if (first < 0) first = k;
      const bool end_run = k + 1 == L || resident_layer[k + 1];
      const auto pos = std::find(free_cuts.begin(), free_cuts.end(), k) - free_cuts.begin();
      const bool cut = !end_run && (mask >> pos) & 1u;
      if (end_run || cut) {
        swapped.emplace_back(first, k);
        first = -1;
      }
    }
    Partition c;
    assemble(resident_layer, swapped, &c);
    evaluate(layers, m, &c);
    if (c.memory() > capacity) continue;
    if (!best.feasible || c.predicted_ms < best.predicted_ms) {
      c.feasible = true;
      best = std::move(c);
    }
  }
  return best;
}

Partition exhaustive_partition_any(const std::vector<LayerCost>& layers, std::uint64_t capacity, const CostModel& m) {
  Partition best;
  const int L = static_cast<int>(layers.size());
  if (L == 0 || L > 12) return best;
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
      evaluate(layers, m, &c);
      if (c.memory() > capacity) continue;
      if (!best.feasible || c.predicted_ms < best.predicted_ms - 1e-12) {
        c.feasible = true;
        best = std::move(c);
      }
    }
  }
  return best;
}

namespace {

// The least ring any partition with these resident layers needs: the largest pair of
// consecutive swapped layers (resident ones skipped; a single swapped layer alone) for the
// two-block pipelines, the largest swapped layer for the deep ring (`single`).
std::uint64_t least_ring(const std::vector<LayerCost>& layers, const std::vector<char>& mask, bool single) {
  std::uint64_t worst = 0, prev = 0;
  bool have = false;
  for (size_t k = 0; k < layers.size(); ++k) {
    if (mask[k]) continue;
    worst = std::max(worst, have && !single ? prev + layers[k].bytes : layers[k].bytes);
    prev = layers[k].bytes;
    have = true;
  }
  return worst;
}

// Swapped blocks of about `target` bytes: runs of swapped layers cut greedily before the layer
// that would take a block past it (a larger layer is a block of its own).
Blocks greedy_swapped(const std::vector<LayerCost>& layers, const std::vector<char>& mask, std::uint64_t target) {
  Blocks out;
  const int L = static_cast<int>(layers.size());
  int first = -1;
  std::uint64_t acc = 0;
  for (int k = 0; k < L; ++k) {
    if (mask[k]) continue;
    if (first >= 0 && acc > 0 && acc + layers[k].bytes > target) {
      out.emplace_back(first, k - 1);
      first = -1;
    }
    if (first < 0) {
      first = k;
      acc = 0;
    }
    acc += layers[k].bytes;
    if (k + 1 == L || mask[k + 1]) {
      out.emplace_back(first, k);
      first = -1;
    }
  }
  return out;
}

// optimal_partition's search: every partition worth trying for each candidate set of resident
// layers goes into `found`; pick() chooses among them.
struct Search {
  const std::vector<LayerCost>& layers;
  const std::uint64_t capacity;
  const CostModel& m;
  const PartitionOptions& options;
  const int L;
  const bool deep;
  const Prefix pre;
  std::vector<Partition> found;
  std::set<std::vector<char>> tried;

  Search(const std::vector<LayerCost>& layers_in, std::uint64_t capacity_in, const CostModel& m_in,
         const PartitionOptions& options_in)
      : layers(layers_in),
        capacity(capacity_in),
        m(m_in),
        options(options_in),
        L(static_cast<int>(layers_in.size())),
        deep(options_in.read_ahead == ReadAhead::kRing),
        pre(layers_in) {}

  // Note [Keeping part of a block]: the deep ring plan `c` (ring = room) with part of its
  // largest swapped block kept, for a few ring sizes; each is a candidate of its own (`found`),
  // so that one predicted within the tolerance of the fastest wins by reading less. (It had to
  // be 3 % faster than `c` to replace it: with reads predicted cheap, vgg19 at 2 GB/s read all
  // 575 MB every inference where a plan keeping 344 MB of fc6 read 231 MB, predicted as fast.)
  void keep_part(const Partition& c, std::uint64_t room, std::vector<Partition>* out) const {
    constexpr std::uint64_t kPage = 4096;
    int r = -1;
    std::uint64_t largest = 0, other = 0;
    for (size_t b = 0; b < c.blocks.size(); ++b) {
      if (c.resident[b]) continue;
      const std::uint64_t s = pre.b(c.blocks[b].first, c.blocks[b].second);
      if (s > largest) {
        other = std::max(other, largest);
        largest = s;
        r = static_cast<int>(b);
      } else {
        other = std::max(other, s);
      }
    }
    // Worth it only where one block takes much of the ring (a few simulations per candidate).
    if (r < 0 || largest > room || largest * 4 < room || largest < 2 * kStreamPieceBytes) return;
    const std::uint64_t least = std::max<std::uint64_t>(other, kStreamPieceBytes);
    for (std::uint64_t ring : {least, 2 * least, (room + least) / 2}) {
      if (ring >= room) continue;
      const std::uint64_t kept = std::min((room - ring) / kPage * kPage, (largest - kPage) / kPage * kPage);
      if (kept == 0) continue;
      Partition t = c;
      t.retain_block = r;
      t.retained_bytes = kept;
      t.ring_bytes = room - kept;
      evaluate(layers, m, &t);
      t.feasible = true;
      out->push_back(std::move(t));
    }
  }

  // Every partition worth trying for one set of resident layers.
  void try_mask(const std::vector<char>& mask) {
    std::uint64_t resident = 0;
    for (int k = 0; k < L; ++k) resident += mask[k] ? layers[k].bytes : 0;
    if (resident > capacity || least_ring(layers, mask, deep) > capacity - resident) return;
    Partition dp = optimal_partition_for(layers, mask, capacity, m);
    if (options.read_ahead == ReadAhead::kPaper) {
      if (dp.feasible) found.push_back(std::move(dp));
      return;
    }
    // The ring gets what the resident layers leave; the paper DP's cuts and equal-byte cuts of
    // several sizes compete by simulation.
    const std::uint64_t room = capacity - resident;
    std::vector<Blocks> swapped_sets;
    if (dp.feasible) {
      Blocks sw;
      for (size_t b = 0; b < dp.blocks.size(); ++b) {
        if (!dp.resident[b]) sw.push_back(dp.blocks[b]);
      }
      swapped_sets.push_back(std::move(sw));
    }
    for (int parts : {2, 3, 4, 6, 8, 12, 16, 24, 32}) swapped_sets.push_back(greedy_swapped(layers, mask, room / parts));
    Partition best;
    for (const Blocks& sw : swapped_sets) {
      Partition c;
      assemble(mask, sw, &c);
      c.ring_depth = options.read_ahead == ReadAhead::kTwoEnded ? 2 : 0;
      c.lend_bytes = deep ? options.lend : 0;
      evaluate(layers, m, &c);  // arena_bytes first: the two-ended ring is just that
      if ((c.ring_depth == 2 ? c.arena_bytes : c.block_max) > room) continue;
      c.ring_bytes = c.read_bytes == 0 ? 0 : c.ring_depth == 2 ? c.arena_bytes : room;
      evaluate(layers, m, &c);
      if (deep && options.residency) keep_part(c, room, &found);
      prefer_two_ended(layers, m, &c);
      c.feasible = true;
      if (!best.feasible || c.predicted_ms < best.predicted_ms - 1e-12) best = std::move(c);
    }
    if (best.feasible) found.push_back(std::move(best));
  }

  void consider(std::vector<char> mask) {
    // A weightless layer between resident neighbours (or the model's ends) is resident too, so
    // it does not split a resident run into a swapped block of nothing.
    for (int k = 0; k < L; ++k) {
      if (mask[k] || layers[k].bytes != 0) continue;
      int a = k - 1, b = k + 1;
      while (a >= 0 && layers[a].bytes == 0) --a;
      while (b < L && layers[b].bytes == 0) ++b;
      const bool left = a < 0 || mask[a], right = b >= L || mask[b];
      if (left && right && (a >= 0 || b < L)) mask[k] = 1;
    }
    if (!tried.insert(mask).second) return;
    try_mask(mask);
  }

  // Candidate orders: a prefix of the model (its fetch is never hidden); the layers with the
  // most bytes per millisecond of compute (their fetch is the hardest to hide); the largest
  // layers (they shrink the least ring the rest needs, so the most bytes stay resident).
  std::array<std::vector<int>, 3> candidate_orders() const {
    std::vector<int> prefix(L), heavy, largest;
    for (int k = 0; k < L; ++k) {
      prefix[k] = k;
      if (layers[k].bytes) heavy.push_back(k);
    }
    largest = heavy;
    std::stable_sort(heavy.begin(), heavy.end(), [&](int a, int b) {
      return static_cast<double>(layers[a].bytes) / (layers[a].exec_ms + 1e-6) >
             static_cast<double>(layers[b].bytes) / (layers[b].exec_ms + 1e-6);
    });
    std::stable_sort(largest.begin(), largest.end(), [&](int a, int b) { return layers[a].bytes > layers[b].bytes; });
    return {std::move(prefix), std::move(heavy), std::move(largest)};
  }

  // The layers of `order` up to fractions of the capacity.
  void consider_fractions(const std::vector<int>& order) {
    for (int f = 1; f < 16; ++f) {
      const double target = static_cast<double>(capacity) * f / 16.0;
      std::vector<char> mask(L, 0);
      double acc = 0;
      for (int k : order) {
        if (acc + static_cast<double>(layers[k].bytes) > target) break;
        acc += static_cast<double>(layers[k].bytes);
        mask[k] = 1;
      }
      consider(std::move(mask));
    }
  }

  void consider_most(const std::vector<int>& order) {
    // The most of this order that still leaves room to swap the rest: the fewest bytes read.
    std::vector<char> mask(L, 0), best_mask;
    std::uint64_t acc = 0;
    for (int k : order) {
      if (acc + layers[k].bytes > capacity) break;
      acc += layers[k].bytes;
      mask[k] = 1;
      if (least_ring(layers, mask, deep) <= capacity - acc) best_mask = mask;
    }
    if (!best_mask.empty()) consider(std::move(best_mask));
    // The same, passing over what does not fit instead of stopping there: a layer too large
    // to keep (or whose keeping leaves too little ring for the largest swapped one) does not
    // stop smaller ones after it. A decoder's embedding and output head come first in every
    // order and never fit beside each other; the transformer blocks behind them do (gpt_350m
    // at 1/4: 181 MB kept resident, 11 % fewer bytes read per token).
    std::vector<char> skip(L, 0);
    acc = 0;
    for (int k : order) {
      if (acc + layers[k].bytes > capacity) continue;
      skip[k] = 1;
      if (least_ring(layers, skip, deep) > capacity - acc - layers[k].bytes) {
        skip[k] = 0;
        continue;
      }
      acc += layers[k].bytes;
    }
    if (acc > 0) consider(std::move(skip));
  }

  void consider_orders() {
    const std::array<std::vector<int>, 3> orders = candidate_orders();
    for (size_t o = 0; o < orders.size(); ++o) {
      if (o == 2 && options.read_ahead == ReadAhead::kPaper) break;  // the largest layers
      consider_fractions(orders[o]);
      if (options.read_ahead == ReadAhead::kPaper) continue;
      consider_most(orders[o]);
    }
  }

  // The candidate within the tolerance of the fastest that reads the fewest bytes.
  Partition pick() const {
    if (found.empty()) return Partition{};
    double fastest = kInf;
    for (const auto& p : found) fastest = std::min(fastest, p.predicted_ms);
    const Partition* pick = nullptr;
    for (const auto& p : found) {
      if (p.predicted_ms > fastest * (1 + options.tolerance)) continue;
      if (pick == nullptr || p.read_bytes < pick->read_bytes ||
          (p.read_bytes == pick->read_bytes && p.predicted_ms < pick->predicted_ms)) {
        pick = &p;
      }
    }
    return *pick;
  }
};

}  // namespace

Partition optimal_partition(const std::vector<LayerCost>& layers, std::uint64_t capacity, const CostModel& m,
                            const PartitionOptions& options) {
  const int L = static_cast<int>(layers.size());
  if (L == 0) return Partition{};
  Search search(layers, capacity, m, options);
  search.consider(std::vector<char>(L, 0));
  if (options.residency) {
    search.consider(std::vector<char>(L, 1));
    search.consider_orders();
  }
  return search.pick();
}

}  // namespace swapnet
