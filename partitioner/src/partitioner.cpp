// Partitions: the pipeline prediction, the exact DP for a given set of resident layers, the
// choice of resident layers, the budget grid and the paper's table; the device profile file and
// the non-negative least squares it is fitted with.
#include "swapnet/partitioner.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "swapnet/allocator.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

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
  // All over layers [i, j]; empty (0) when j < i.
  std::uint64_t b(int i, int j) const { return j < i ? 0 : bytes[j + 1] - bytes[i]; }
  double n(int i, int j) const { return j < i ? 0.0 : static_cast<double>(tensors[j + 1] - tensors[i]); }
  double ex(int i, int j) const { return j < i ? 0.0 : exec[j + 1] - exec[i]; }
  double io(int i, int j, const CostModel& m) const {
    return m.alpha_ms_per_byte * static_cast<double>(b(i, j)) + m.block_ms;
  }
  double bind(int i, int j, const CostModel& m) const { return m.beta_ms_per_tensor * n(i, j); }
  double out(int i, int j, const CostModel& m) const { return m.eta_ms_per_tensor * n(i, j); }
};

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

}  // namespace

double predict_ms(const std::vector<LayerCost>& layers, const Blocks& blocks, const std::vector<char>& resident,
                  const CostModel& m) {
  Prefix p(layers);
  double t = 0;           // compute clock
  double fetched = 0;     // when the next swapped block's fetch completes
  // The first swapped block is fetched from time 0, during the resident prefix.
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (!resident[b]) {
      fetched = p.io(blocks[b].first, blocks[b].second, m);
      break;
    }
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    const auto [i, j] = blocks[b];
    if (resident[b]) {
      t += p.ex(i, j);
      continue;
    }
    t = std::max(t, fetched) + p.bind(i, j, m);
    // Submit the next swapped block now (this one is bound; the one before it is released).
    for (size_t c = b + 1; c < blocks.size(); ++c) {
      if (!resident[c]) {
        fetched = t + p.io(blocks[c].first, blocks[c].second, m);
        break;
      }
    }
    t += p.ex(i, j) + p.out(i, j, m);
  }
  return t + m.inference_ms;
}

const char* to_string(ReadAhead r) {
  switch (r) {
    case ReadAhead::kRing: return "ring";
    case ReadAhead::kTwoEnded: return "two-ended";
    default: return "paper";
  }
}

double simulate_ms(const std::vector<LayerCost>& layers, const Blocks& blocks, const std::vector<char>& resident,
                   std::uint64_t ring_bytes, int ring_depth, const CostModel& m, bool stream, int retain_block,
                   std::uint64_t retained_bytes, bool by_layer, std::uint64_t lend) {
  Prefix p(layers);
  struct Item {
    bool swapped;
    std::uint64_t bytes;
    double io, bind, ex, out;
    bool first = false;  // the rest of a block kept in part: read into the ring's first bytes
    int i = 0, j = -1;   // its layers
    bool layered = false;  // runs layer by layer as its bytes land, gives them back as it goes
  };
  std::vector<Item> items;
  size_t swapped = 0;
  // Layer by layer (Note [Layer by layer] in assembly/src/executor.cpp): the deep ring only, not
  // the block kept in part.
  by_layer = by_layer && ring_depth == 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const auto [i, j] = blocks[b];
    if (resident[b]) {
      items.push_back(Item{false, 0, 0, 0, p.ex(i, j), 0});
    } else {
      items.push_back(Item{true, p.b(i, j), p.io(i, j, m), p.bind(i, j, m), p.ex(i, j), p.out(i, j, m)});
      items.back().i = i;
      items.back().j = j;
      items.back().layered = by_layer && static_cast<int>(b) != retain_block && items.back().bytes > kStreamPieceBytes;
      if (static_cast<int>(b) == retain_block && ring_depth == 0 && retained_bytes < items.back().bytes) {
        items.back().bytes -= retained_bytes;
        items.back().io -= m.alpha_ms_per_byte * static_cast<double>(retained_bytes);
        items.back().first = true;
      }
      ++swapped;
    }
  }
  const size_t n = items.size();
  if (n == 0) return m.inference_ms;
  if (swapped == 0) return p.ex(0, static_cast<int>(layers.size()) - 1) + m.inference_ms;
  // Inferences played back to back; the last one's period is the steady state (the ring is
  // then as full as it gets at an inference boundary).
  constexpr size_t kInferences = 4;
  const size_t total = kInferences * n;
  std::vector<double> read_done(total, 0), finish(total, 0);
  // Layered items: when the read started (bytes then land at the disk's rate: read_start +
  // fixed + alpha x), or, streamed, when pieces 0..q had all landed (piece_done[g][q]); and when
  // each of its layers ended.
  std::vector<double> read_start(total, 0);
  std::vector<std::vector<double>> piece_done(total), layer_done(total);
  // Lending the activation reserve (`lend`; Note [Lending the activation reserve] in
  // assembly/src/executor.cpp): the zone after the ring's last byte holds activations; a block
  // may end in it below what the layers from the one running when its read starts to its own
  // last need (their activation peak). Layers unrolled over the inferences played: end[u]
  // (infinite until computed), need[u], and a sparse table for the most need over a range.
  const int L = static_cast<int>(layers.size());
  const bool lends = lend > 0 && ring_depth == 0;
  std::vector<double> layer_end;
  std::vector<std::vector<std::uint64_t>> need_max;
  if (lends) {
    layer_end.assign(kInferences * static_cast<size_t>(L), std::numeric_limits<double>::infinity());
    std::vector<std::uint64_t> need(kInferences * static_cast<size_t>(L));
    for (int k = 0; k < L; ++k) {
      const std::uint64_t before = k > 0 ? layers[k - 1].live_bytes : 0;
      const std::uint64_t a = std::max({layers[k].peak_bytes, layers[k].live_bytes, layers[k].peak_bytes ? 0 : before});
      for (size_t r = 0; r < kInferences; ++r) need[r * L + k] = a;
    }
    need_max.push_back(std::move(need));
    for (size_t w = 1; 2 * w <= need_max[0].size(); w *= 2) {
      const std::vector<std::uint64_t>& prev = need_max.back();
      std::vector<std::uint64_t> next(prev.size() - w);
      for (size_t u = 0; u < next.size(); ++u) next[u] = std::max(prev[u], prev[u + w]);
      need_max.push_back(std::move(next));
    }
  }
  auto most_need = [&](size_t a, size_t b) {  // over unrolled layers [a, b]
    if (b < a) return std::uint64_t{0};
    size_t lv = 0;
    while ((size_t{2} << lv) <= b - a + 1) ++lv;
    return std::max(need_max[lv][a], need_max[lv][b + 1 - (size_t{1} << lv)]);
  };
  double t_compute = 0, t_read = 0;
  double ends[kInferences] = {};
  size_t next = 0;  // the next item the compute thread runs
  auto fixed_ms = [&](const Item& it) {
    return std::max(0.0, it.io - m.alpha_ms_per_byte * static_cast<double>(it.bytes));
  };
  // When the first x bytes of item g have landed.
  auto landed = [&](size_t g, std::uint64_t x) {
    const Item& it = items[g % n];
    if (piece_done[g].empty()) {
      return std::min(read_done[g], read_start[g] + fixed_ms(it) + m.alpha_ms_per_byte * static_cast<double>(x));
    }
    const size_t k = std::min<size_t>(piece_done[g].size(), (x + kStreamPieceBytes - 1) / kStreamPieceBytes);
    return k == 0 ? read_start[g] : std::max(read_start[g], piece_done[g][k - 1]);
  };
  auto compute_through = [&](size_t g) {
    for (; next <= g; ++next) {
      const Item& it = items[next % n];
      if (next % n == 0) t_compute += m.inference_ms;
      const size_t u0 = (next / n) * static_cast<size_t>(L);  // the inference's first unrolled layer
      if (it.swapped && it.layered) {
        // Its first layer's bytes, then each layer once its bytes (and those before it) landed.
        layer_done[next].resize(static_cast<size_t>(it.j - it.i + 1));
        t_compute = std::max(t_compute, landed(next, p.b(it.i, it.i))) + it.bind;
        for (int l = it.i; l <= it.j; ++l) {
          t_compute = std::max(t_compute, landed(next, p.b(it.i, l))) + layers[l].exec_ms;
          layer_done[next][l - it.i] = t_compute;
          if (lends) layer_end[u0 + l] = t_compute;
        }
        t_compute += it.out;
      } else {
        if (it.swapped) t_compute = std::max(t_compute, read_done[next]) + it.bind;
        const auto [bi, bj] = blocks[next % n];
        if (lends) {
          double t = t_compute;
          for (int l = bi; l <= bj; ++l) layer_end[u0 + l] = t += layers[l].exec_ms;
        }
        t_compute += it.ex + it.out;
      }
      finish[next] = t_compute;
      if (next % n == n - 1) ends[next / n] = t_compute;
    }
  };
  // When the byte at `x` of held item g is free: once its layer ended (layered), else once the
  // item ended.
  auto free_at_byte = [&](size_t g, std::uint64_t x) {
    const Item& it = items[g % n];
    if (!it.layered) return finish[g];
    // The first layer l of the item whose bytes end past x: bytes[l + 1] > bytes[i] + x.
    const auto end = p.bytes.begin() + it.j + 2;
    const auto at = std::upper_bound(p.bytes.begin() + it.i + 1, end, p.bytes[it.i] + x);
    return at == end ? finish[g] : layer_done[g][static_cast<size_t>(at - p.bytes.begin() - 1 - it.i)];
  };
  // Swapped items read or being read, not yet executed, where the ring holds them: the
  // executor's contiguous ring (Note [Block ring] in allocator/src/ring.cpp), page-rounded, a
  // block that does not fit before the end going to the start, up to the oldest.
  struct Held {
    size_t g;
    std::uint64_t off, bytes;
  };
  constexpr std::uint64_t kPage = 4096;
  const std::uint64_t cap = ring_depth == 2 ? ring_bytes : ring_bytes / kPage * kPage;
  constexpr std::uint64_t kNo = kNoRingSlot;  // does not fit
  std::deque<Held> held;
  std::uint64_t head = 0, held_bytes = 0;
  // Where a block ending at most at `lim` (cap, or into the zone) goes, as BlockRing::push
  // (ring_slot: Note [Holes in the ring] in allocator/src/ring.cpp).
  std::vector<RingBlock> ranges;
  auto held_now = [&]() -> std::vector<RingBlock>& {
    ranges.clear();
    for (const Held& h : held) ranges.push_back(RingBlock{h.off, h.bytes});
    return ranges;
  };
  auto slot = [&](std::uint64_t bytes, std::uint64_t lim) -> std::uint64_t {
    if (ring_depth == 2) return held_bytes + bytes <= cap ? 0 : kNo;  // two ends: bytes only
    return ring_slot(held_now(), head, bytes, lim);
  };
  // The same for a block that must start at the ring's first byte (never in the zone).
  auto place = [&](std::uint64_t bytes, bool first, std::uint64_t lim) -> std::uint64_t {
    if (!first) return slot(bytes, lim);
    for (const Held& h : held) {
      if (h.off < bytes) return kNo;
    }
    return bytes <= cap ? 0 : kNo;
  };
  // Lending: the unrolled layer running at time T (a cursor: T only grows), and the limit a block
  // of item g read from then may end at.
  size_t cursor = 0;
  auto limit_at = [&](double T, size_t g) -> std::uint64_t {
    if (!lends) return cap;
    const size_t first_u = (g / n) * static_cast<size_t>(L) + static_cast<size_t>(items[g % n].i);
    const size_t last_u = (g / n) * static_cast<size_t>(L) + static_cast<size_t>(items[g % n].j);
    while (cursor < first_u && layer_end[cursor] <= T) ++cursor;
    const std::uint64_t most = most_need(std::min(cursor, first_u), last_u);
    return cap + (lend > most ? (lend - most) / kPage * kPage : 0);
  };
  // When the limit for item g may next grow after T: the end of the layer running then (before g).
  auto next_lend = [&](double T, size_t g) -> double {
    if (!lends) return std::numeric_limits<double>::infinity();
    const size_t first_u = (g / n) * static_cast<size_t>(L) + static_cast<size_t>(items[g % n].i);
    (void)limit_at(T, g);
    return cursor < first_u ? layer_end[cursor] : std::numeric_limits<double>::infinity();
  };
  auto pop = [&](double* room) {
    const Held h = held.front();
    compute_through(h.g);
    *room = std::max(*room, finish[h.g]);
    held_bytes -= h.bytes;
    held.pop_front();
    if (held.empty()) head = 0;
  };
  for (size_t g = 0; g < total; ++g) {
    const Item& it = items[g % n];
    if (!it.swapped) continue;
    const std::uint64_t bytes = ring_depth == 2 ? it.bytes : (it.bytes + kPage - 1) / kPage * kPage;
    // The read starts once the reader is free and the block fits next to those not yet
    // executed (never two copies of one block: at most one inference ahead).
    double room = 0;
    while (!held.empty() && (held.size() >= swapped ||
                             (ring_depth > 0 && held.size() >= static_cast<size_t>(ring_depth)))) {
      pop(&room);
    }
    if (lends && g > 0) compute_through(g - 1);  // when each layer before it ends (their reads are known)
    if (stream && ring_depth == 0 && !held.empty() && place(bytes, it.first, limit_at(std::max(t_read, room), g)) == kNo &&
        bytes <= cap && bytes > kStreamPieceBytes) {
      // Streamed (Note [Streaming into the ring] in allocator/src/ring.cpp): blocks executed by
      // the time the reader gets here are gone; the rest free the block's pieces as they end.
      while (!held.empty() && (compute_through(held.front().g), finish[held.front().g] <= t_read)) pop(&room);
      const std::uint64_t lim = it.first ? cap : limit_at(std::max(t_read, room), g);
      if (!held.empty() && place(bytes, it.first, lim) == kNo) {
        // Where it waits least, as BlockRing::push_streamed chooses (the block kept in part: at
        // the ring's first byte).
        std::uint64_t off = it.first ? 0 : ring_stream_slot(held_now(), head, bytes, lim);
        if (off == kNoRingSlot) off = 0;
        compute_through(held.back().g);  // when each block it waits for ends (all were read)
        struct Piece {
          double free_at;
          std::uint64_t len;
          size_t index;
        };
        std::vector<Piece> pieces;
        size_t last = 0;  // held entries up to this one (FIFO) go before the block is whole
        for (std::uint64_t at = 0; at < bytes; at += kStreamPieceBytes) {
          const std::uint64_t len = std::min(kStreamPieceBytes, bytes - at);
          double free_at = t_read;
          for (size_t i = 0; i < held.size(); ++i) {
            if (held[i].off < off + at + len && off + at < held[i].off + held[i].bytes) {
              // Its last byte this piece covers (page-rounded: the layer holding the page's end).
              const std::uint64_t hi = std::min(off + at + len, held[i].off + held[i].bytes) - held[i].off;
              free_at = std::max(free_at, free_at_byte(held[i].g, hi - 1));
              last = std::max(last, i + 1);
            }
          }
          pieces.push_back(Piece{free_at, len, pieces.size()});
        }
        std::stable_sort(pieces.begin(), pieces.end(),
                         [](const Piece& a, const Piece& b) { return a.free_at < b.free_at; });
        double t = std::max(t_read, room) + fixed_ms(it);
        read_start[g] = t;
        piece_done[g].assign(pieces.size(), 0);
        for (const Piece& q : pieces) {
          t = std::max(t, q.free_at) + m.alpha_ms_per_byte * static_cast<double>(q.len);
          piece_done[g][q.index] = t;
        }
        for (size_t q = 1; q < piece_done[g].size(); ++q) piece_done[g][q] = std::max(piece_done[g][q], piece_done[g][q - 1]);
        read_done[g] = t;
        t_read = t;
        for (size_t i = 0; i < last; ++i) pop(&room);
        held.push_back(Held{g, off, bytes});
        held_bytes += bytes;
        head = off + bytes;
        continue;
      }
    }
    // Room opens as older blocks end, or (lending) as the layers that need the zone end.
    std::uint64_t at = kNo;
    while (true) {
      const double T = std::max(t_read, room);
      at = place(bytes, it.first, it.first ? cap : limit_at(T, g));
      if (at != kNo || held.empty()) break;
      compute_through(held.front().g);
      const double t_layer = it.first ? std::numeric_limits<double>::infinity() : next_lend(T, g);
      if (t_layer < finish[held.front().g]) {
        room = std::max(room, t_layer);
      } else {
        pop(&room);
      }
    }
    const std::uint64_t off = at != kNo ? at : 0;  // a block larger than the ring: as if alone
    held.push_back(Held{g, off, bytes});
    read_start[g] = std::max(t_read, room);
    read_done[g] = read_start[g] + it.io;
    t_read = read_done[g];
    held_bytes += bytes;
    head = off + bytes;
  }
  compute_through(total - 1);
  return ends[kInferences - 1] - ends[kInferences - 2];
}

bool prefer_two_ended(const std::vector<LayerCost>& layers, const CostModel& m, Partition* p) {
  if (p->ring_depth != 0 || p->ring_bytes == 0 || p->read_bytes == 0 || p->retain_block >= 0) return false;
  if (p->arena_bytes > p->ring_bytes) return false;  // two ends need a pair; the ring holds less
  Partition two = *p;
  two.ring_depth = 2;
  evaluate(layers, m, &two);
  if (two.predicted_ms >= p->predicted_ms - 1e-12) return false;
  *p = std::move(two);
  return true;
}

void evaluate(const std::vector<LayerCost>& layers, const CostModel& m, Partition* part) {
  Prefix p(layers);
  part->arena_bytes = part->resident_bytes = part->read_bytes = part->block_max = 0;
  std::uint64_t prev = 0;
  bool have_prev = false;
  for (size_t b = 0; b < part->blocks.size(); ++b) {
    const std::uint64_t s = p.b(part->blocks[b].first, part->blocks[b].second);
    if (part->resident[b]) {
      part->resident_bytes += s;
      continue;
    }
    const std::uint64_t kept = static_cast<int>(b) == part->retain_block ? std::min(part->retained_bytes, s) : 0;
    part->read_bytes += s - kept;
    part->block_max = std::max(part->block_max, s - kept);
    part->arena_bytes = std::max(part->arena_bytes, have_prev ? prev + s : s);
    prev = s;
    have_prev = true;
  }
  part->predicted_ms = part->ring_bytes == 0
                           ? predict_ms(layers, part->blocks, part->resident, m)
                           : simulate_ms(layers, part->blocks, part->resident, part->ring_bytes, part->ring_depth, m,
                                         true, part->retain_block, part->retained_bytes, true, part->lend_bytes);
}

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
  // The largest sum of layers within `room` that includes every layer above `A`: a subset sum
  // over pages (a bitset), or room itself where the bytes are not whole pages.
  std::uint64_t unit = 4096;
  for (const auto& l : layers) unit = l.bytes % unit == 0 ? unit : 1;
  auto most_resident = [&](std::uint64_t A, std::uint64_t room) -> std::uint64_t {
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
  };
  constexpr std::uint64_t kNone = UINT64_MAX;
  std::uint64_t least = total;
  std::vector<std::uint64_t> dp(L);
  for (std::uint64_t A : rings) {
    if (!pairs) {
      std::uint64_t forced = 0;
      for (const auto& l : layers) forced += l.bytes > A ? l.bytes : 0;
      if (A <= capacity && forced <= capacity - A) least = std::min(least, total - most_resident(A, capacity - A));
      // One layer kept in part (Partition::retain_block) fills what whole layers leave: the
      // ring holds the rest of it, so the layers above A fit when their sum does.
      if (A <= capacity && forced <= capacity) least = std::min(least, total - (capacity - A));
      continue;
    }
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
    if (best == kNone || A > capacity || best > capacity - A) continue;
    least = std::min(least, total - most_resident(A, capacity - A));
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
  std::vector<int> prev_nr(L, -1), run_start(L, -1);  // previous swapped layer; start of this swapped run
  int last_nr = -1;
  for (int k = 0; k < L; ++k) {
    prev_nr[k] = last_nr;
    if (!resident_layer[k]) {
      run_start[k] = (k > 0 && !resident_layer[k - 1]) ? run_start[k - 1] : k;
      last_nr = k;
    }
  }
  if (last_nr < 0) {  // everything resident
    assemble(resident_layer, {}, &best);  // (evaluate adds inference_ms)
    evaluate(layers, m, &best);
    best.feasible = true;
    return best;
  }
  // dp[i][j]: earliest start (fetch complete) of swapped block [i, j] over partitions of the
  // swapped layers before it; from[i][j] the first layer of the block before it.
  std::vector<std::vector<double>> dp(L);
  std::vector<std::vector<int>> from(L);
  for (int i = 0; i < L; ++i) {
    if (resident_layer[i]) continue;
    dp[i].assign(L - i, kInf);
    from[i].assign(L - i, -1);
    const int e = prev_nr[i];  // the previous block ends here
    for (int j = i; j < L && !resident_layer[j]; ++j) {
      const std::uint64_t cur = p.b(i, j);
      if (cur > arena) break;  // longer blocks only grow
      const double io = p.io(i, j, m);
      if (e < 0) {
        dp[i][j - i] = std::max(p.ex(0, i - 1), io);  // fetched during the resident prefix
        continue;
      }
      const double gap = p.ex(e + 1, i - 1);
      for (int k = e; k >= run_start[e]; --k) {
        if (p.b(k, e) + cur > arena) break;
        const double prev = dp[k][e - k];
        if (prev == kInf) continue;
        const double t = prev + p.bind(k, e, m) + std::max(p.ex(k, e) + p.out(k, e, m) + gap, io);
        if (t < dp[i][j - i]) {
          dp[i][j - i] = t;
          from[i][j - i] = k;
        }
      }
    }
  }
  double t_best = kInf;
  int last = -1;
  for (int i = run_start[last_nr]; i <= last_nr; ++i) {
    const double d = dp[i][last_nr - i];
    if (d == kInf) continue;
    const double t = d + p.bind(i, last_nr, m) + p.ex(i, last_nr) + p.out(i, last_nr, m) + p.ex(last_nr + 1, L - 1) +
                     m.inference_ms;
    if (t < t_best) {
      t_best = t;
      last = i;
    }
  }
  if (last < 0) return best;
  Blocks swapped;
  for (int i = last, j = last_nr; i >= 0;) {
    swapped.emplace_back(i, j);
    const int k = from[i][j - i];
    j = prev_nr[i];
    i = k;
  }
  std::reverse(swapped.begin(), swapped.end());
  assemble(resident_layer, swapped, &best);
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

}  // namespace

Partition optimal_partition(const std::vector<LayerCost>& layers, std::uint64_t capacity, const CostModel& m,
                            const PartitionOptions& options) {
  const int L = static_cast<int>(layers.size());
  std::vector<Partition> found;
  std::set<std::vector<char>> tried;
  // Every partition worth trying for one set of resident layers.
  const bool deep = options.read_ahead == ReadAhead::kRing;
  // Note [Keeping part of a block]: the deep ring plan `c` (ring = room) with part of its
  // largest swapped block kept, for a few ring sizes; each is a candidate of its own (`found`),
  // so that one predicted within the tolerance of the fastest wins by reading less. (It had to
  // be 3 % faster than `c` to replace it: with reads predicted cheap, vgg19 at 2 GB/s read all
  // 575 MB every inference where a plan keeping 344 MB of fc6 read 231 MB, predicted as fast.)
  const Prefix pre(layers);
  auto keep_part = [&](const Partition& c, std::uint64_t room, std::vector<Partition>* out) {
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
  };
  auto try_mask = [&](const std::vector<char>& mask) {
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
  };
  auto consider = [&](std::vector<char> mask) {
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
  };
  if (L == 0) return Partition{};
  consider(std::vector<char>(L, 0));
  if (options.residency) {
    consider(std::vector<char>(L, 1));
    // Candidate orders: a prefix of the model (its fetch is never hidden); the layers with the
    // most bytes per millisecond of compute (their fetch is the hardest to hide); the largest
    // layers (they shrink the least ring the rest needs, so the most bytes stay resident).
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
    for (const auto* order : {&prefix, &heavy, &largest}) {
      if (order == &largest && options.read_ahead == ReadAhead::kPaper) break;
      for (int f = 1; f < 16; ++f) {
        const double target = static_cast<double>(capacity) * f / 16.0;
        std::vector<char> mask(L, 0);
        double acc = 0;
        for (int k : *order) {
          if (acc + static_cast<double>(layers[k].bytes) > target) break;
          acc += static_cast<double>(layers[k].bytes);
          mask[k] = 1;
        }
        consider(std::move(mask));
      }
      if (options.read_ahead == ReadAhead::kPaper) continue;
      // The most of this order that still leaves room to swap the rest: the fewest bytes read.
      std::vector<char> mask(L, 0), best_mask;
      std::uint64_t acc = 0;
      for (int k : *order) {
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
      for (int k : *order) {
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
  }
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

// ---- least squares ------------------------------------------------------------------------

namespace {

// Solves A x = b (n x n, Gaussian elimination with partial pivoting); false if singular.
bool solve(std::vector<std::vector<double>> A, std::vector<double> b, std::vector<double>* x) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::fabs(A[r][c]) > std::fabs(A[piv][c])) piv = r;
    }
    if (std::fabs(A[piv][c]) < 1e-300) return false;
    std::swap(A[c], A[piv]);
    std::swap(b[c], b[piv]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = A[r][c] / A[c][c];
      for (size_t k = c; k < n; ++k) A[r][k] -= f * A[c][k];
      b[r] -= f * b[c];
    }
  }
  x->assign(n, 0);
  for (size_t c = n; c-- > 0;) {
    double s = b[c];
    for (size_t k = c + 1; k < n; ++k) s -= A[c][k] * (*x)[k];
    (*x)[c] = s / A[c][c];
  }
  return true;
}

}  // namespace

std::vector<double> fit_nonnegative(const std::vector<std::vector<double>>& X, const std::vector<double>& y) {
  const size_t p = X.empty() ? 0 : X[0].size();
  std::vector<double> best(p, 0.0);
  double best_sse = 0;
  for (double v : y) best_sse += v * v;  // all-zero coefficients
  for (std::uint32_t subset = 1; subset < (1u << p); ++subset) {
    std::vector<size_t> cols;
    for (size_t c = 0; c < p; ++c) {
      if (subset & (1u << c)) cols.push_back(c);
    }
    // Columns are scaled to unit norm first: bytes (~1e7) and counts (~10) in one system.
    std::vector<double> scale(cols.size(), 0.0);
    for (size_t a = 0; a < cols.size(); ++a) {
      for (const auto& row : X) scale[a] += row[cols[a]] * row[cols[a]];
      scale[a] = scale[a] > 0 ? std::sqrt(scale[a]) : 1.0;
    }
    std::vector<std::vector<double>> A(cols.size(), std::vector<double>(cols.size(), 0.0));
    std::vector<double> b(cols.size(), 0.0), x;
    for (size_t r = 0; r < X.size(); ++r) {
      for (size_t a = 0; a < cols.size(); ++a) {
        b[a] += X[r][cols[a]] / scale[a] * y[r];
        for (size_t c = 0; c < cols.size(); ++c) A[a][c] += X[r][cols[a]] / scale[a] * X[r][cols[c]] / scale[c];
      }
    }
    if (!solve(A, b, &x)) continue;
    bool nonneg = true;
    for (double v : x) nonneg &= v >= 0;
    if (!nonneg) continue;
    std::vector<double> coef(p, 0.0);
    for (size_t a = 0; a < cols.size(); ++a) coef[cols[a]] = x[a] / scale[a];
    double sse = 0;
    for (size_t r = 0; r < X.size(); ++r) {
      double pred = 0;
      for (size_t c = 0; c < p; ++c) pred += coef[c] * X[r][c];
      sse += (pred - y[r]) * (pred - y[r]);
    }
    if (sse < best_sse) {
      best_sse = sse;
      best = coef;
    }
  }
  return best;
}

// ---- the profile file -----------------------------------------------------------------------

namespace {

std::string host_name() {
  struct utsname u {};
  return ::uname(&u) == 0 ? u.nodename : "";
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "";
}

}  // namespace

std::string default_profile_path() {
  if (const char* p = std::getenv("SWAPNET_PROFILE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/swapnet/device.json";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/swapnet/device.json";
}

Status save_profile(const std::string& path, const DeviceProfile& p) {
  nlohmann::json j = {{"version", p.version},
                      {"host", p.host.empty() ? host_name() : p.host},
                      {"cpu", p.cpu.empty() ? cpu_model() : p.cpu},
                      {"threads", p.threads},
                      {"created", p.created},
                      {"image", p.image},
                      {"raw_read_mb_s", p.raw_read_mb_s},
                      {"sustained_read_mb_s", p.sustained_read_mb_s},
                      {"alpha_ms_per_byte", p.cost.alpha_ms_per_byte},
                      {"beta_ms_per_tensor", p.cost.beta_ms_per_tensor},
                      {"block_ms", p.cost.block_ms},
                      {"eta_ms_per_tensor", p.cost.eta_ms_per_tensor},
                      {"inference_ms", p.cost.inference_ms},
                      {"gamma_ms_per_flop", p.gamma_ms_per_flop},
                      {"pipeline_extra_block_ms", p.pipeline_extra_block_ms},
                      {"pipeline_error", p.pipeline_error},
                      {"calibration_direct_ms", p.calibration_direct_ms},
                      {"calibration_exec_ms", p.calibration_exec_ms},
                      {"t_in_error", p.t_in_error},
                      {"t_out_error", p.t_out_error},
                      {"exec_error_flops", p.exec_error_flops},
                      {"exec_error_measured", p.exec_error_measured},
                      {"exec_source", p.exec_source}};
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    // Create the directory chain (~/.cache/swapnet) as needed.
    std::string dir = path.substr(0, slash);
    for (size_t pos = 1; pos <= dir.size(); ++pos) {
      if (pos == dir.size() || dir[pos] == '/') (void)::mkdir(dir.substr(0, pos).c_str(), 0755);
    }
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << j.dump(2) << "\n";
    if (!f) return Status::error(-1, path + ": cannot write the device profile (" + tmp + ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status::error(-1, path + ": cannot rename " + tmp + " onto it");
  return Status();
}

Status load_profile(const std::string& path, DeviceProfile* out) {
  std::ifstream f(path);
  if (!f) return Status::error(-1, path + ": no device profile there (run `swapnet profile IMAGE -o " + path + "`)");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    return Status::error(-1, path + ": not a device profile (invalid JSON: " + e.what() + ")");
  }
  DeviceProfile p;
  auto num = [&](const char* key, double* v, bool positive) -> Status {
    if (!j.contains(key) || !j[key].is_number()) return Status::error(-1, path + ": field '" + key + "' is missing or not a number");
    *v = j[key].get<double>();
    if (!std::isfinite(*v) || *v < 0 || (positive && *v == 0)) {
      return Status::error(-1, path + ": field '" + key + "' = " + std::to_string(*v) + " is out of range (must be " +
                           (positive ? "> 0" : ">= 0") + ")");
    }
    return Status();
  };
  if (!j.is_object()) return Status::error(-1, path + ": not a device profile (not a JSON object)");
  double version = 0, threads = 0;
  if (Status s = num("version", &version, true); !s.ok()) return s;
  if (static_cast<int>(version) != DeviceProfile::kVersion) {
    return Status::error(-1, path + ": device profile version " + std::to_string(static_cast<int>(version)) +
                                 ", this swapnet reads " + std::to_string(DeviceProfile::kVersion) +
                                 " (run `swapnet profile` again)");
  }
  for (auto [key, v, pos] : {std::tuple<const char*, double*, bool>{"threads", &threads, true},
                             {"raw_read_mb_s", &p.raw_read_mb_s, true},
                             {"sustained_read_mb_s", &p.sustained_read_mb_s, true},
                             {"alpha_ms_per_byte", &p.cost.alpha_ms_per_byte, true},
                             {"beta_ms_per_tensor", &p.cost.beta_ms_per_tensor, false},
                             {"block_ms", &p.cost.block_ms, false},
                             {"eta_ms_per_tensor", &p.cost.eta_ms_per_tensor, false},
                             {"inference_ms", &p.cost.inference_ms, false},
                             {"pipeline_error", &p.pipeline_error, false},
                             {"gamma_ms_per_flop", &p.gamma_ms_per_flop, false},
                             {"t_in_error", &p.t_in_error, false},
                             {"t_out_error", &p.t_out_error, false},
                             {"exec_error_flops", &p.exec_error_flops, false},
                             {"exec_error_measured", &p.exec_error_measured, false}}) {
    Status s = num(key, v, pos);
    if (!s.ok()) return s;
  }
  p.version = static_cast<int>(version);
  // Informational fields: read when present.
  for (auto [key, v] : {std::pair<const char*, double*>{"pipeline_extra_block_ms", &p.pipeline_extra_block_ms},
                        {"calibration_direct_ms", &p.calibration_direct_ms},
                        {"calibration_exec_ms", &p.calibration_exec_ms}}) {
    if (j.contains(key) && j[key].is_number()) *v = j[key].get<double>();
  }
  p.threads = static_cast<int>(threads);
  for (auto [key, v] : {std::pair<const char*, std::string*>{"host", &p.host},
                        {"cpu", &p.cpu},
                        {"created", &p.created},
                        {"image", &p.image},
                        {"exec_source", &p.exec_source}}) {
    if (!j.contains(key) || !j[key].is_string()) return Status::error(-1, path + ": field '" + key + "' is missing or not a string");
    *v = j[key].get<std::string>();
  }
  if (p.exec_source != "measured" && p.exec_source != "flops") {
    return Status::error(-1, path + ": field 'exec_source' = '" + p.exec_source + "' is not measured|flops");
  }
  *out = std::move(p);
  return Status();
}

std::string profile_mismatch(const DeviceProfile& p, int threads) {
  if (p.host != host_name()) return "it was measured on host '" + p.host + "', this is '" + host_name() + "'";
  if (p.cpu != cpu_model()) return "it was measured on CPU '" + p.cpu + "', this is '" + cpu_model() + "'";
  if (p.threads != threads) {
    return "it was measured with " + std::to_string(p.threads) + " threads, this run uses " + std::to_string(threads);
  }
  return "";
}

}  // namespace swapnet
