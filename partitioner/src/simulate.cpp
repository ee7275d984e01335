// The read-ahead ring played event by event (simulate_ms): back-to-back inferences, one reader
// that fills the executor's ring in order (whole blocks, or streamed in pieces into the bytes
// older blocks free as they end), and one compute thread that runs each block once it is read
// (or each layer as its bytes land). The steps: one Item per block (its bytes and costs), then a
// Simulation that reads every swapped item of every inference in turn, running the compute
// thread only as far as the next read needs to know when ring bytes come free.
#include "swapnet/partitioner.h"

#include "swapnet/allocator.h"

#include "prefix.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

namespace swapnet {
namespace {

using detail::Prefix;

// Inferences played back to back; the last one's period is the steady state (the ring is
// then as full as it gets at an inference boundary).
constexpr size_t kInferences = 4;
constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kNo = kNoRingSlot;  // does not fit

struct Item {
  bool swapped;
  std::uint64_t bytes;
  double io, bind, ex, out;
  bool first = false;  // the rest of a block kept in part: read into the ring's first bytes
  int i = 0, j = -1;   // its layers
  bool layered = false;  // runs layer by layer as its bytes land, and gives them back as it goes
};

// One item per block; `*swapped` counts the swapped ones.
std::vector<Item> make_items(const Prefix& p, const Blocks& blocks, const std::vector<char>& resident,
                             int ring_depth, const CostModel& m, int retain_block, std::uint64_t retained_bytes,
                             bool by_layer, size_t* swapped) {
  std::vector<Item> items;
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
      ++*swapped;
    }
  }
  return items;
}

// Swapped items read or being read, not yet executed, where the ring holds them: the
// executor's contiguous ring (Note [Block ring] in allocator/src/ring.cpp), page-rounded, a
// block that does not fit before the end going to the start, up to the oldest.
struct Held {
  size_t g;
  std::uint64_t off, bytes;
};

// A piece of a streamed block: when the bytes it lands in are free, its length, its place.
struct Piece {
  double free_at;
  std::uint64_t len;
  size_t index;
};

// Items are unrolled over the inferences played: item g is items[g % n] of inference g / n.
struct Simulation {
  const std::vector<LayerCost>& layers;
  const Blocks& blocks;
  const CostModel& m;
  const Prefix& p;
  const std::vector<Item>& items;
  const size_t n, swapped, total;
  const int ring_depth;
  const bool stream;
  const std::uint64_t lend;
  const int L;
  const bool lends;
  std::vector<double> read_done, finish;
  // Layered items: when the read started (bytes then land at the disk's rate: read_start +
  // fixed + alpha x), or, streamed, when pieces 0..q had all landed (piece_done[g][q]); and when
  // each of its layers ended.
  std::vector<double> read_start;
  std::vector<std::vector<double>> piece_done, layer_done;
  // Lending: unrolled layers' end (infinite until computed) and the sparse table of their need
  // (make_lending).
  std::vector<double> layer_end;
  std::vector<std::vector<std::uint64_t>> need_max;
  double t_compute = 0, t_read = 0;
  double ends[kInferences] = {};
  size_t next = 0;  // the next item the compute thread runs
  const std::uint64_t cap;
  std::deque<Held> held;
  std::uint64_t head = 0, held_bytes = 0;
  std::vector<RingBlock> ranges;  // held_now()
  // Lending: the unrolled layer running at time T (a cursor: T only grows; limit_at).
  size_t cursor = 0;

  Simulation(const std::vector<LayerCost>& layers_in, const Blocks& blocks_in, const CostModel& m_in,
             const Prefix& p_in, const std::vector<Item>& items_in, size_t swapped_in, std::uint64_t ring_bytes,
             int ring_depth_in, bool stream_in, std::uint64_t lend_in)
      : layers(layers_in),
        blocks(blocks_in),
        m(m_in),
        p(p_in),
        items(items_in),
        n(items_in.size()),
        swapped(swapped_in),
        total(kInferences * items_in.size()),
        ring_depth(ring_depth_in),
        stream(stream_in),
        lend(lend_in),
        L(static_cast<int>(layers_in.size())),
        lends(lend_in > 0 && ring_depth_in == 0),
        read_done(total, 0),
        finish(total, 0),
        read_start(total, 0),
        piece_done(total),
        layer_done(total),
        cap(ring_depth_in == 2 ? ring_bytes : ring_bytes / kPage * kPage) {
    if (lends) make_lending();
  }

  // Lending the activation reserve (`lend`; Note [Lending the activation reserve] in
  // assembly/src/zone_lender.cpp): the zone after the ring's last byte holds activations; a block
  // may end in it below what the layers from the one running when its read starts to its own
  // last need (their activation peak). Layers unrolled over the inferences played: end[u]
  // (infinite until computed), need[u], and a sparse table for the most need over a range.
  void make_lending() {
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

  std::uint64_t most_need(size_t a, size_t b) const {  // over unrolled layers [a, b]
    if (b < a) return std::uint64_t{0};
    size_t lv = 0;
    while ((size_t{2} << lv) <= b - a + 1) ++lv;
    return std::max(need_max[lv][a], need_max[lv][b + 1 - (size_t{1} << lv)]);
  }

  double fixed_ms(const Item& it) const {
    return std::max(0.0, it.io - m.alpha_ms_per_byte * static_cast<double>(it.bytes));
  }

  // When the first x bytes of item g have landed.
  double landed(size_t g, std::uint64_t x) const {
    const Item& it = items[g % n];
    if (piece_done[g].empty()) {
      return std::min(read_done[g], read_start[g] + fixed_ms(it) + m.alpha_ms_per_byte * static_cast<double>(x));
    }
    const size_t k = std::min<size_t>(piece_done[g].size(), (x + kStreamPieceBytes - 1) / kStreamPieceBytes);
    return k == 0 ? read_start[g] : std::max(read_start[g], piece_done[g][k - 1]);
  }

  // The compute thread, on through item g.
  void compute_through(size_t g) {
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
  }

  // When the byte at `x` of held item g is free: once its layer ended (layered), else once the
  // item ended.
  double free_at_byte(size_t g, std::uint64_t x) const {
    const Item& it = items[g % n];
    if (!it.layered) return finish[g];
    // The first layer l of the item whose bytes end past x: bytes[l + 1] > bytes[i] + x.
    const auto end = p.bytes.begin() + it.j + 2;
    const auto at = std::upper_bound(p.bytes.begin() + it.i + 1, end, p.bytes[it.i] + x);
    return at == end ? finish[g] : layer_done[g][static_cast<size_t>(at - p.bytes.begin() - 1 - it.i)];
  }

  // Where a block ending at most at `lim` (cap, or into the zone) goes, as BlockRing::push
  // (ring_slot: Note [Holes in the ring] in allocator/src/ring.cpp).
  std::vector<RingBlock>& held_now() {
    ranges.clear();
    for (const Held& h : held) ranges.push_back(RingBlock{h.off, h.bytes});
    return ranges;
  }
  std::uint64_t slot(std::uint64_t bytes, std::uint64_t lim) {
    if (ring_depth == 2) return held_bytes + bytes <= cap ? 0 : kNo;  // two ends: bytes only
    return ring_slot(held_now(), head, bytes, lim);
  }
  // The same for a block that must start at the ring's first byte (never in the zone).
  std::uint64_t place(std::uint64_t bytes, bool first, std::uint64_t lim) {
    if (!first) return slot(bytes, lim);
    for (const Held& h : held) {
      if (h.off < bytes) return kNo;
    }
    return bytes <= cap ? 0 : kNo;
  }

  // Lending: the limit a block of item g read from time T may end at.
  std::uint64_t limit_at(double T, size_t g) {
    if (!lends) return cap;
    const size_t first_u = (g / n) * static_cast<size_t>(L) + static_cast<size_t>(items[g % n].i);
    const size_t last_u = (g / n) * static_cast<size_t>(L) + static_cast<size_t>(items[g % n].j);
    while (cursor < first_u && layer_end[cursor] <= T) ++cursor;
    const std::uint64_t most = most_need(std::min(cursor, first_u), last_u);
    return cap + (lend > most ? (lend - most) / kPage * kPage : 0);
  }
  // When the limit for item g may next grow after T: the end of the layer running then (before g).
  double next_lend(double T, size_t g) {
    if (!lends) return std::numeric_limits<double>::infinity();
    const size_t first_u = (g / n) * static_cast<size_t>(L) + static_cast<size_t>(items[g % n].i);
    (void)limit_at(T, g);
    return cursor < first_u ? layer_end[cursor] : std::numeric_limits<double>::infinity();
  }

  // The oldest held item leaves the ring once it ran; `room` is when its bytes are free.
  void pop(double* room) {
    const Held h = held.front();
    compute_through(h.g);
    *room = std::max(*room, finish[h.g]);
    held_bytes -= h.bytes;
    held.pop_front();
    if (held.empty()) head = 0;
  }

  // Item g's read. It starts once the reader is free and the block fits next to those not yet
  // executed (never two copies of one block: at most one inference ahead).
  void read(size_t g) {
    const Item& it = items[g % n];
    const std::uint64_t bytes = ring_depth == 2 ? it.bytes : (it.bytes + kPage - 1) / kPage * kPage;
    double room = 0;
    while (!held.empty() && (held.size() >= swapped ||
                             (ring_depth > 0 && held.size() >= static_cast<size_t>(ring_depth)))) {
      pop(&room);
    }
    if (lends && g > 0) compute_through(g - 1);  // when each layer before it ends (their reads are known)
    if (read_streamed(g, bytes, &room)) return;
    read_whole(g, bytes, room);
  }

  // Streamed (Note [Streaming into the ring] in allocator/src/ring.cpp), where the block does not
  // fit yet: blocks executed by the time the reader gets here are gone; the rest free the
  // block's pieces as they end. False (nothing read) where it is not streamed.
  bool read_streamed(size_t g, std::uint64_t bytes, double* room) {
    const Item& it = items[g % n];
    const bool streams = stream && ring_depth == 0 && !held.empty() &&
                         place(bytes, it.first, limit_at(std::max(t_read, *room), g)) == kNo && bytes <= cap &&
                         bytes > kStreamPieceBytes;
    if (!streams) return false;
    while (!held.empty() && (compute_through(held.front().g), finish[held.front().g] <= t_read)) pop(room);
    const std::uint64_t lim = it.first ? cap : limit_at(std::max(t_read, *room), g);
    if (held.empty() || place(bytes, it.first, lim) != kNo) return false;
    // Where it waits least, as BlockRing::push_streamed chooses (the block kept in part: at
    // the ring's first byte).
    std::uint64_t off = it.first ? 0 : ring_stream_slot(held_now(), head, bytes, lim);
    if (off == kNoRingSlot) off = 0;
    compute_through(held.back().g);  // when each block it waits for ends (all were read)
    size_t last = 0;  // held entries up to this one (FIFO) go before the block is whole
    const std::vector<Piece> pieces = stream_pieces(off, bytes, &last);
    read_pieces(g, pieces, *room);
    for (size_t i = 0; i < last; ++i) pop(room);
    held.push_back(Held{g, off, bytes});
    held_bytes += bytes;
    head = off + bytes;
    return true;
  }

  // The pieces of a block streamed to `off`, in the order their bytes come free.
  std::vector<Piece> stream_pieces(std::uint64_t off, std::uint64_t bytes, size_t* last) const {
    std::vector<Piece> pieces;
    for (std::uint64_t at = 0; at < bytes; at += kStreamPieceBytes) {
      const std::uint64_t len = std::min(kStreamPieceBytes, bytes - at);
      double free_at = t_read;
      for (size_t i = 0; i < held.size(); ++i) {
        if (held[i].off < off + at + len && off + at < held[i].off + held[i].bytes) {
          // Its last byte this piece covers (page-rounded: the layer holding the page's end).
          const std::uint64_t hi = std::min(off + at + len, held[i].off + held[i].bytes) - held[i].off;
          free_at = std::max(free_at, free_at_byte(held[i].g, hi - 1));
          *last = std::max(*last, i + 1);
        }
      }
      pieces.push_back(Piece{free_at, len, pieces.size()});
    }
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const Piece& a, const Piece& b) { return a.free_at < b.free_at; });
    return pieces;
  }

  // Item g read piece by piece, each once its bytes are free.
  void read_pieces(size_t g, const std::vector<Piece>& pieces, double room) {
    const Item& it = items[g % n];
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
  }

  // Item g read whole once its room is free. Room opens as older blocks end, or (lending) as the
  // layers that need the zone end.
  void read_whole(size_t g, std::uint64_t bytes, double room) {
    const Item& it = items[g % n];
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

  // Every swapped item of every inference read in turn; the last inference's period.
  double run() {
    for (size_t g = 0; g < total; ++g) {
      if (items[g % n].swapped) read(g);
    }
    compute_through(total - 1);
    return ends[kInferences - 1] - ends[kInferences - 2];
  }
};

}  // namespace

double simulate_ms(const std::vector<LayerCost>& layers, const Blocks& blocks, const std::vector<char>& resident,
                   std::uint64_t ring_bytes, int ring_depth, const CostModel& m, bool stream, int retain_block,
                   std::uint64_t retained_bytes, bool by_layer, std::uint64_t lend) {
  Prefix p(layers);
  size_t swapped = 0;
  // Layer by layer (Note [Layer by layer] in assembly/src/read_ahead.cpp): the ring, deep or of
  // two blocks (whose bytes go only when the block ends: pop), not the block kept in part
  // (make_items).
  const std::vector<Item> items =
      make_items(p, blocks, resident, ring_depth, m, retain_block, retained_bytes, by_layer, &swapped);
  const size_t n = items.size();
  if (n == 0) return m.inference_ms;
  if (swapped == 0) return p.ex(0, static_cast<int>(layers.size()) - 1) + m.inference_ms;
  Simulation sim(layers, blocks, m, p, items, swapped, ring_bytes, ring_depth, stream, lend);
  return sim.run();
}

}  // namespace swapnet
