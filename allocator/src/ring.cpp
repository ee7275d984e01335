// The block ring: swapped blocks in flight and executing, first in, first out.
//
// Note [Block ring]
// ~~~~~~~~~~~~~~~~~
// Blocks are used in the order they are read: the executor pushes the next block at the head
// as soon as it fits and pops the oldest once it has executed. In host memory the ring is
// *contiguous*: one anonymous buffer (huge pages where the kernel gives them) in which each block
// takes the bytes after the newest one, or, when those are not free, the lowest free range (from
// the start up to the oldest one, or a tail left behind: Note [Holes in the ring]). A block is
// always one contiguous range, so the reader DMAs into it and the executor binds views of it as
// they are, and the ring holds as many blocks as fit: read-ahead is as deep as the budget.
//
// (The first version mirrored a memfd, mapped twice back to back, so that no byte was lost to
// wrap-around. Measured on this 2-core VM at host disk speed, layers computing on weights in the
// shared memfd pages ran 30-60 % slower than on anonymous memory, with three times the page
// faults, and RSS counted the pages of both views; the anonymous ring has none of that, for at
// most one block of lost depth.)
//
// Note [Holes in the ring]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A block goes after the newest one when those bytes are free, as above; when they are not, to
// the lowest free range that holds it below its limit, wherever that lies: the tail a wrapped
// ring left behind, a hole between blocks, or the zone beyond the older blocks (Note [Lending
// the activation reserve]). Only going to the start up to the oldest block left that room
// unused: measured on yolov3 at 83 MB with an emulated 400 MB/s disk, a large block (layer 90's
// 18 MiB) then streamed over the one before it and the disk idled while that one's single
// layer ran, with 24 MiB free in the zone after the blocks held. Blocks still leave in FIFO
// order and each is one contiguous range; the accounting counts their bytes as before.
//
// Note [Streaming into the ring]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where the next block does not fit next to the blocks held, waiting for room to open whole
// serialises its read with the compute of every block it waits for: with a ring barely larger
// than the largest block (vgg19 at its minimum budget: fc7's 64 MiB in a 64.1 MiB ring; the
// fcn_resnet101 head's 36 MiB in 36 MiB) the disk idled for whole blocks of compute. A block may
// instead be pushed *streamed* (push_streamed): it takes the place it will have once the older
// blocks it overlaps are gone, and the executor reads it in pieces, each as soon as no older
// block holds its bytes (range_free), so the disk fills space as compute frees it. Of the places
// after the newest block, at the start, after any block held and ending at its limit (in the
// zone), it takes the one whose newest block overlapped leaves first, then the one over the
// fewest held bytes (the old rule, after the newest block else from the start, could wait for
// the block pushed just before it). Until the overlap is gone no other block streams, but a
// block that overlaps nothing held is still pushed after it (fits() sees the
// streamed block's whole range as held): measured on yolov3 at 83 MB with an emulated 400 MB/s
// disk, the disk idled 70 ms per inference while block 1 waited for block 0's last layers, with
// the zone free enough for block 2 from layer 19 on. The executor's reads carry their block's
// place in the read order, so the streamed block's later pieces go before that block's rest
// (Note [Earliest block first] in swapcore/src/reader.cpp): the disk works on bytes it would
// read anyway, and the bytes needed first land first. used() and the accounting count the
// union of the bytes held, never a byte twice, so the ring's capacity stays the promise.
//
// Note [Giving a block back layer by layer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A block's layers run in the order their bytes lie, so the bytes of the layers that have run
// are dead for the rest of the inference (weights a later layer of the same block reads stay:
// the executor asks only up to the lowest layer still needed; weights read outside their block
// are pinned elsewhere). Waiting for the whole block to end before its bytes may be reused made
// the ring block-granular: with a ring of one large block (fcn_resnet101's 36 MiB head in a
// 36 MiB ring) the next block's pieces could only be read once the last layer of the one
// before had run. release_front_until() gives the oldest block's prefix back as it runs: the
// entry shrinks from the front, the accounting drops those bytes (but for those a streaming
// newest block already counts), and range_free()/fits() see the room at once.
//
// Note [Keeping part of a block]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer larger than most of the budget (vgg19's fc6: 392 MiB of a 429 MiB budget) has to be
// read whole every inference when blocks are kept or swapped whole, though most of its bytes
// could stay: the ring needs its room only while the other blocks pass through. A ring may
// therefore be created with `kept` bytes just before its first byte. The planner keeps the
// first `kept` bytes of one swapped block there across inferences; each inference the rest of
// that block is pushed at the ring's first byte (push_first, or streamed into it as the blocks
// there end), so the block lies whole and contiguous at kept_begin() while it runs, and the ring
// is free for the others the rest of the time. The kept bytes are read once (the block's first
// read is whole) and count as used from the ring's creation.
//
// Note [Lending the activation reserve]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A plan reserves its activations' peak for the whole inference, yet most layers use a fraction
// of it (yolov3: 57 MiB while its first layers run, 27 MiB or less from layer 9 on). A ring may
// be created with `lend` bytes more after its last byte: the *zone*, where the executor places
// the model's activations (the CPU meter's region for its account, filled from the top down)
// and lends what they leave to blocks whose whole stay in the ring falls where activations are
// small (Note [Lending the activation reserve] in assembly/src/zone_lender.cpp says how it decides).
// push(bytes, limit) and push_streamed(bytes, limit) place a block only below `limit`
// (capacity() <= limit <= capacity() + lend()); the block kept in part stays below capacity().
// The ring's accounting counts only the bytes of blocks below capacity(): the zone is the
// activation reserve the budget already holds, whoever uses it (lent_bytes() says how much
// blocks do).
//
// A ring not asked to be `deep` is the two-ended arena (Note [Two-ended arena]): at most two
// blocks, at opposite ends, the paper's pipeline, which still guarantees progress whenever any
// two consecutive blocks fit. Memory the GPU reads in place (managed, or registered) may be
// deep too, and keep part of a block; only the zone lent to blocks needs host memory (the
// activations placed there are the CPU meter's).
#include <cerrno>
#include <cstring>
#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "accounting.h"
#include "swapnet/allocator.h"

namespace swapnet {
namespace {

constexpr std::uint64_t kPage = 4096;  // bytes
std::uint64_t page_up(std::uint64_t v) { return (v + kPage - 1) / kPage * kPage; }

}  // namespace

struct BlockRing::Impl {
  MemoryKind kind = MemoryKind::kHost;
  std::uint64_t capacity = 0;
  std::uint64_t kept = 0;        // bytes before the ring (Note [Keeping part of a block])
  std::uint64_t lend = 0;        // the zone after it (Note [Lending the activation reserve])
  std::shared_ptr<Arena> arena;  // the memory (two-ended: its two ends); deep: kept + capacity + lend
  char* base() const { return arena->base() + kept; }
  bool deep = false;             // a contiguous ring; else two-ended
  // Contiguous ring: where the next block goes after the newest.
  std::uint64_t head = 0;
  struct Entry {
    std::uint64_t offset = 0;  // deep: offset in the ring; two-ended: 0 low, 1 high
    std::uint64_t bytes = 0;
    bool streams = false;  // streamed, and older blocks still hold some of its bytes
  };
  std::deque<Entry> fifo;
  std::uint64_t used = 0;     // the union of the blocks' bytes
  std::uint64_t overlap = 0;  // bytes of the streamed block that older ones still hold
  std::uint64_t lent = 0;     // bytes of blocks in the zone (not in `used` or the accounting)
  mutable std::vector<RingBlock> ranges;  // held_now()'s

  // The part of [off, off + bytes) in the zone.
  std::uint64_t in_zone(std::uint64_t off, std::uint64_t bytes) const {
    const std::uint64_t a = std::max(off, capacity), b = off + bytes;
    return b > a ? b - a : 0;
  }
  // Accounts a block entering (+) or leaving (-) the ring: zone bytes as lent.
  void enter(std::uint64_t off, std::uint64_t bytes) {
    const std::uint64_t z = in_zone(off, bytes);
    lent += z;
    used += bytes - z;
    account_memory(static_cast<std::int64_t>(bytes - z));
  }
  void leave(std::uint64_t off, std::uint64_t bytes) {
    const std::uint64_t z = in_zone(off, bytes);
    lent -= z;
    used -= bytes - z;
    account_memory(-static_cast<std::int64_t>(bytes - z));
  }

  // Bytes of [off, off + bytes) that the `count` oldest blocks hold.
  std::uint64_t held_by(std::uint64_t off, std::uint64_t bytes, size_t count) const {
    std::uint64_t n = 0;
    for (size_t i = 0; i < count && i < fifo.size(); ++i) {
      const std::uint64_t a = std::max(off, fifo[i].offset), b = std::min(off + bytes, fifo[i].offset + fifo[i].bytes);
      if (a < b) n += b - a;
    }
    return n;
  }
  // ... that blocks other than the newest hold.
  std::uint64_t held_by_older(std::uint64_t off, std::uint64_t bytes) const {
    return fifo.empty() ? 0 : held_by(off, bytes, fifo.size() - 1);
  }
  // Where the streamed block older ones still hold bytes of is in the FIFO (blocks pushed after
  // it lie elsewhere: Note [Streaming into the ring]); fifo.size() when there is none.
  size_t streaming_at() const {
    if (overlap == 0) return fifo.size();
    size_t i = 0;
    while (i < fifo.size() && !fifo[i].streams) ++i;
    return i;
  }
  // An older block gives up [off, off + n): what the streamed block shares stays held (by it);
  // the rest leaves `lent` (zone bytes) or `used` and the accounting.
  void give_up(std::uint64_t off, std::uint64_t n) {
    std::uint64_t shared = 0, shared_zone = 0;
    const size_t si = streaming_at();
    if (si < fifo.size()) {
      const Entry& s = fifo[si];
      const std::uint64_t a = std::max(off, s.offset), b = std::min(off + n, s.offset + s.bytes);
      if (a < b) {
        shared = b - a;
        shared_zone = in_zone(a, shared);
      }
    }
    const std::uint64_t z = in_zone(off, n);
    lent -= z - shared_zone;
    const std::uint64_t below = (n - z) - (shared - shared_zone);
    used -= below;
    overlap -= shared;
    if (si < fifo.size() && overlap == 0) fifo[si].streams = false;
    account_memory(-static_cast<std::int64_t>(below));
  }
  void* push_over(std::uint64_t offset, std::uint64_t bytes);
  // Whether a block of `bytes` (page-rounded) may be pushed over older ones: deep, none streaming.
  bool may_stream(std::uint64_t bytes) const { return deep && overlap == 0 && bytes > 0 && bytes <= capacity; }

  ~Impl() {
    if (deep) account_memory(-static_cast<std::int64_t>(used + kept));  // a two-ended arena accounts its own
  }
  // Whether any block holds some of [0, bytes).
  bool start_held(std::uint64_t bytes) const {
    for (const Entry& e : fifo) {
      if (e.offset < bytes) return true;
    }
    return false;
  }
  // Deep: where a block of `bytes` ending at most at `limit` goes now, or kNoRingSlot.
  std::uint64_t slot(std::uint64_t bytes, std::uint64_t limit) const { return ring_slot(held_now(), head, bytes, limit); }
  // The blocks held, oldest first (scratch reused).
  std::vector<RingBlock>& held_now() const {
    ranges.clear();
    for (const Entry& e : fifo) ranges.push_back(RingBlock{e.offset, e.bytes});
    return ranges;
  }
  std::uint64_t clamp(std::uint64_t limit) const { return std::min(std::max(limit, capacity), capacity + lend); }
};

std::uint64_t ring_slot(std::vector<RingBlock>& held, std::uint64_t head, std::uint64_t bytes, std::uint64_t limit) {
  if (bytes > limit) return kNoRingSlot;
  if (held.empty()) return 0;
  bool head_free = head <= limit - bytes;
  for (const RingBlock& h : held) head_free = head_free && (h.offset + h.bytes <= head || head + bytes <= h.offset);
  if (head_free) return head;
  std::sort(held.begin(), held.end(), [](const RingBlock& a, const RingBlock& b) { return a.offset < b.offset; });
  std::uint64_t at = 0;  // the lowest byte after the blocks before it
  for (size_t i = 0; i < held.size() && at <= limit - bytes; ++i) {
    if (held[i].offset >= at + bytes) return at;
    at = std::max(at, held[i].offset + held[i].bytes);
  }
  return at <= limit - bytes ? at : kNoRingSlot;
}

std::uint64_t ring_stream_slot(const std::vector<RingBlock>& held, std::uint64_t head, std::uint64_t bytes,
                               std::uint64_t limit) {
  if (bytes > limit) return kNoRingSlot;
  std::uint64_t best = kNoRingSlot, best_held = 0;
  size_t best_newest = 0;
  auto consider = [&](std::uint64_t o) {
    if (o > limit - bytes) return;
    size_t newest = 0;  // 1 + the FIFO index of the newest block it overlaps
    std::uint64_t n = 0;
    for (size_t i = 0; i < held.size(); ++i) {
      const std::uint64_t a = std::max(o, held[i].offset), b = std::min(o + bytes, held[i].offset + held[i].bytes);
      if (a < b) newest = i + 1, n += b - a;
    }
    if (best == kNoRingSlot || newest < best_newest || (newest == best_newest && n < best_held)) {
      best = o, best_newest = newest, best_held = n;
    }
  };
  consider(head);
  consider(0);
  for (const RingBlock& h : held) consider(h.offset + h.bytes);
  consider(limit - bytes);
  return best;
}

std::unique_ptr<BlockRing> BlockRing::create(std::uint64_t capacity, MemoryKind kind, bool deep, std::uint64_t kept,
                                             std::uint64_t lend) {
  capacity = page_up(capacity);
  kept = page_up(kept);
  lend = page_up(lend);
  if (capacity == 0) throw Error("block ring: capacity must be positive");
  auto impl = std::make_unique<Impl>();
  const bool host = kind == MemoryKind::kHost || (kind == MemoryKind::kManaged && !cuda_device().usable);
  if (kept > 0 && !deep) throw Error("block ring: kept bytes need a deep ring");
  if (lend > 0 && !(deep && host)) throw Error("block ring: a zone to lend needs a deep ring in host memory");
  impl->arena = Arena::create(kept + capacity + lend, kind);
  impl->kind = impl->arena->kind();
  impl->kept = kept;
  impl->lend = lend;
  impl->capacity = impl->arena->capacity() - kept - lend;
  impl->deep = deep;
  if (kept > 0) account_memory(static_cast<std::int64_t>(kept));
  return std::unique_ptr<BlockRing>(new BlockRing(std::move(impl)));
}

BlockRing::BlockRing(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockRing::~BlockRing() = default;

MemoryKind BlockRing::kind() const { return impl_->kind; }
bool BlockRing::deep() const { return impl_->deep; }
std::uint64_t BlockRing::capacity() const { return impl_->capacity; }
std::size_t BlockRing::blocks() const { return impl_->fifo.size(); }
std::uint64_t BlockRing::used() const { return impl_->used + impl_->kept; }

char* BlockRing::base() const { return impl_->base(); }
char* BlockRing::kept_begin() const { return impl_->arena->base(); }
std::uint64_t BlockRing::kept() const { return impl_->kept; }
std::uint64_t BlockRing::lend() const { return impl_->lend; }
char* BlockRing::zone_begin() const { return impl_->base() + impl_->capacity; }
std::uint64_t BlockRing::lent_bytes() const { return impl_->lent; }
std::shared_ptr<void> BlockRing::memory() const { return impl_->arena; }
std::uint64_t BlockRing::held_end() const {
  std::uint64_t e = 0;
  for (const Impl::Entry& x : impl_->fifo) e = std::max(e, x.offset + x.bytes);
  return impl_->deep ? e : 0;
}

char* BlockRing::device_address(void* p) const {
  return impl_->arena->device_base() + (static_cast<char*>(p) - impl_->arena->base());
}

bool BlockRing::fits(std::uint64_t bytes) const { return fits(bytes, impl_->capacity); }

bool BlockRing::fits(std::uint64_t bytes, std::uint64_t limit) const {
  const Impl& m = *impl_;
  bytes = page_up(bytes);
  if (m.deep) return m.slot(bytes, m.clamp(limit)) != kNoRingSlot;
  if (m.fifo.size() >= 2) return false;
  return bytes <= m.capacity - m.used;
}

void* BlockRing::push(std::uint64_t bytes) { return push(bytes, impl_->capacity); }

void* BlockRing::push(std::uint64_t bytes, std::uint64_t limit) {
  Impl& m = *impl_;
  bytes = page_up(bytes);
  if (!fits(bytes, limit)) return nullptr;
  void* p = nullptr;
  Impl::Entry e;
  e.bytes = bytes;
  if (m.deep) {
    e.offset = m.slot(bytes, m.clamp(limit));
    p = m.base() + e.offset;
    m.head = e.offset + bytes;
  } else {
    // The end opposite the block already there (low when the ring is empty).
    const bool high = !m.fifo.empty() && m.fifo.back().offset == 0;
    e.offset = high ? 1 : 0;
    p = m.arena->place(high, bytes);
    if (p == nullptr) return nullptr;
  }
  m.fifo.push_back(e);
  if (m.deep) {
    m.enter(e.offset, bytes);
  } else {
    m.used += bytes;  // the arena accounts its own
  }
  return p;
}

void* BlockRing::push_first(std::uint64_t bytes) {
  Impl& m = *impl_;
  bytes = page_up(bytes);
  if (!m.may_stream(bytes) || m.start_held(bytes)) return nullptr;
  m.fifo.push_back(Impl::Entry{0, bytes});
  m.enter(0, bytes);
  m.head = bytes;
  return m.base();
}

void* BlockRing::push_first_streamed(std::uint64_t bytes) {
  if (void* p = push_first(bytes)) return p;
  bytes = page_up(bytes);
  return impl_->may_stream(bytes) ? impl_->push_over(0, bytes) : nullptr;
}

void* BlockRing::push_streamed(std::uint64_t bytes) { return push_streamed(bytes, impl_->capacity); }

void* BlockRing::push_streamed(std::uint64_t bytes, std::uint64_t limit) {
  Impl& m = *impl_;
  bytes = page_up(bytes);
  limit = m.clamp(limit) / kPage * kPage;
  if (!m.may_stream(bytes)) return nullptr;
  if (m.fifo.empty() || m.slot(bytes, limit) != kNoRingSlot) return push(bytes, limit);
  const std::uint64_t off = ring_stream_slot(m.held_now(), m.head, bytes, limit);
  if (off == kNoRingSlot) return nullptr;
  return m.push_over(off, bytes);
}

// A block at `offset` over bytes older blocks still hold (Note [Streaming into the ring]).
void* BlockRing::Impl::push_over(std::uint64_t offset, std::uint64_t bytes) {
  Impl& m = *this;
  Impl::Entry e;
  e.bytes = bytes;
  e.offset = offset;
  m.fifo.push_back(e);
  m.overlap = m.held_by_older(e.offset, bytes);
  m.fifo.back().streams = m.overlap > 0;
  // The bytes older blocks do not hold are new: in the zone, lent; below it, used.
  const std::uint64_t z = m.in_zone(offset, bytes);
  const std::uint64_t zs = std::max(offset, m.capacity);
  const std::uint64_t overlap_zone = z > 0 ? m.held_by_older(zs, offset + bytes - zs) : 0;
  m.lent += z - overlap_zone;
  const std::uint64_t added = (bytes - z) - (m.overlap - overlap_zone);
  m.used += added;
  m.head = e.offset + bytes;
  account_memory(static_cast<std::int64_t>(added));
  return m.base() + e.offset;
}

bool BlockRing::streaming() const { return impl_->overlap > 0; }

bool BlockRing::range_free(const void* p, std::uint64_t bytes) const {
  const Impl& m = *impl_;
  if (!m.deep || m.overlap == 0) return true;
  const std::uint64_t off = static_cast<std::uint64_t>(static_cast<const char*>(p) - m.base());
  return m.held_by(off, bytes, m.streaming_at()) == 0;
}

std::uint64_t BlockRing::release_front_until(const void* p) {
  Impl& m = *impl_;
  if (!m.deep || m.fifo.empty()) return 0;
  const char* c = static_cast<const char*>(p);
  if (c < m.base()) return 0;
  Impl::Entry& e = m.fifo.front();
  const std::uint64_t off = static_cast<std::uint64_t>(c - m.base()) / kPage * kPage;
  if (off <= e.offset || off >= e.offset + e.bytes) return 0;
  const std::uint64_t n = off - e.offset;
  if (m.fifo.size() > 1) {
    m.give_up(e.offset, n);
  } else {  // the only block: nothing streams over it
    const std::uint64_t z = m.in_zone(e.offset, n);
    m.lent -= z;
    m.used -= n - z;
    account_memory(-static_cast<std::int64_t>(n - z));
  }
  e.offset += n;
  e.bytes -= n;
  return n;
}

void BlockRing::pop() {
  Impl& m = *impl_;
  if (m.fifo.empty()) return;
  const Impl::Entry e = m.fifo.front();
  m.fifo.pop_front();
  if (m.deep) {
    m.give_up(e.offset, e.bytes);
    if (m.fifo.empty()) m.head = 0;  // start over at the beginning: fewer pages touched, no tail lost
  } else {
    m.used -= e.bytes;
    m.arena->release(e.offset == 1);
  }
}

void BlockRing::clear() {
  while (!impl_->fifo.empty()) pop();
}

void BlockRing::discard_except(const std::vector<std::pair<const char*, std::uint64_t>>& keep) {
  Impl& m = *impl_;
  const char* base = m.arena->base();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> kept;  // [begin, end), page-rounded outwards
  for (const auto& [p, bytes] : keep) {
    if (bytes == 0) continue;
    const std::uint64_t off = static_cast<std::uint64_t>(p - base);
    kept.emplace_back(off / kPage * kPage, std::min(page_up(off + bytes), m.kept + m.capacity + m.lend));
  }
  std::sort(kept.begin(), kept.end());
  std::uint64_t at = 0;
  for (const auto& [a, b] : kept) {
    if (a > at) m.arena->discard(at, a - at);
    at = std::max(at, b);
  }
  if (m.kept + m.capacity + m.lend > at) m.arena->discard(at, m.kept + m.capacity + m.lend - at);
}

}  // namespace swapnet
