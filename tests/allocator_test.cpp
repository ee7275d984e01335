// Tests of swapnet/allocator.h: the CUDA probe answers, never fails, and explains itself.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>
#include <random>

#include "swapnet/allocator.h"

namespace swapnet {
namespace {

TEST(CudaDevice, ProbeIsConsistent) {
  const DeviceInfo& d = cuda_device();
  EXPECT_EQ(&d, &cuda_device()) << "probed once";
  if (d.usable) {
    EXPECT_TRUE(d.built_with_cuda);
    EXPECT_GE(d.count, 1);
    EXPECT_FALSE(d.name.empty());
  } else {
    EXPECT_FALSE(d.reason.empty()) << "a missing GPU must say why";
    EXPECT_TRUE(d.name.empty());
  }
}

std::uint64_t resident_bytes(const char* p, std::uint64_t bytes) {
  std::vector<unsigned char> v(bytes / 4096);
  if (::mincore(const_cast<char*>(p), bytes, v.data()) != 0) return ~0ull;
  std::uint64_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n * 4096;
}

// Note [Giving back huge pages] (arena.cpp): pages given back inside a huge-page region stay
// given back when the kernel collapses regions into huge pages. MADV_COLLAPSE does now what
// khugepaged does within seconds (and, like it, leaves alone what is marked no-huge-page);
// without the fix the kept page per region grew back to 2 MiB each.
TEST(Arena, PagesGivenBackStayGoneWhenTheKernelCollapsesHugePages) {
  std::string thp;
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::getline(f, thp);
  if (thp.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off on this machine: nothing can grow back";
  }
  const std::uint64_t huge = 2u << 20, cap = 8 * huge;
  auto arena = Arena::create(cap, MemoryKind::kHost);
  char* base = arena->base();
  std::memset(base, 1, cap);
  // Keep one page in the middle of every 2 MiB of the arena, give back the rest (the ring's
  // discard_except pattern), and the tail past a smaller budget (set_budget's).
  std::uint64_t at = 0;
  for (std::uint64_t k = huge / 2; k + 4096 <= cap - huge; k += huge) {
    arena->discard(at, k - at);
    at = k + 4096;
  }
  arena->set_budget(cap - huge + 8192);  // keeps two pages of the last region
  arena->discard(at, cap - huge - at);
  const std::uint64_t kept = resident_bytes(base, cap);
  ASSERT_LE(kept, 9 * 4096u);
  // Region by region: the kernel stops at the first region it may not collapse.
  constexpr int kCollapse = 25;  // MADV_COLLAPSE (Linux 6.1), not in Debian 12's headers
  const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(base);
  int collapsed = 0, refused = 0;
  for (std::uintptr_t r = lo / huge * huge; r < lo + cap; r += huge) {
    if (r < lo || r + huge > lo + cap) continue;
    if (::madvise(reinterpret_cast<void*>(r), huge, kCollapse) == 0) {
      ++collapsed;
    } else if (errno == EINVAL) {
      ++refused;  // marked no-huge-page (or no MADV_COLLAPSE at all: see below)
    }
  }
  // An empty region cannot collapse; a marked one is refused: both prove the kernel knows the
  // call. A kernel without MADV_COLLAPSE refuses every region, empty ones included.
  if (collapsed == 0 && ::madvise(base, 4096, kCollapse) != 0 && errno == EINVAL && refused > 0) {
    void* probe = ::mmap(nullptr, 2 * huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char* aligned = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(probe) + huge - 1) / huge * huge);
    std::memset(aligned, 1, 4096);
    const bool known = ::madvise(aligned, huge, kCollapse) == 0 || errno != EINVAL;
    ::munmap(probe, 2 * huge);
    if (!known) GTEST_SKIP() << "this kernel has no MADV_COLLAPSE: cannot play khugepaged";
  }
  EXPECT_LE(resident_bytes(base, cap), kept + 4 * 4096) << "given-back pages grew back as huge pages";
  for (std::uint64_t o = 0; o < cap - huge; o += huge) EXPECT_EQ(base[o], 0) << "given back at " << o;
}

// The contiguous ring: blocks in FIFO order, each one contiguous range; a block that does not
// fit before the end goes to the start, up to the oldest block; accounting.
TEST(BlockRing, BlocksGoAfterTheNewestOrFromTheStart) {
  const std::uint64_t cap = 64 * 4096;
  auto ring = BlockRing::create(cap, MemoryKind::kHost);
  ASSERT_TRUE(ring->deep());
  EXPECT_EQ(ring->capacity(), cap);
  const MemoryStats before = memory_stats();
  char* a = static_cast<char*>(ring->push(40 * 4096));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a, ring->base());
  char* b = static_cast<char*>(ring->push(20 * 4096));
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b, a + 40 * 4096);
  EXPECT_FALSE(ring->fits(5 * 4096)) << "4 pages left at the end, none before the oldest";
  EXPECT_EQ(ring->push(5 * 4096), nullptr);
  EXPECT_EQ(memory_stats().current - before.current, 60u * 4096);
  ring->pop();  // a goes
  EXPECT_EQ(ring->used(), 20u * 4096);
  // 30 pages: not before the end (4 left), so from the start, up to b at page 40.
  char* c = static_cast<char*>(ring->push(30 * 4096));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c, ring->base());
  std::memset(c, 0x5A, 30 * 4096);
  EXPECT_TRUE(ring->fits(10 * 4096)) << "pages 30..40 are free";
  EXPECT_FALSE(ring->fits(11 * 4096));
  EXPECT_EQ(ring->blocks(), 2u);
  ring->pop();  // b goes: c is the oldest, the newest follows it
  char* d = static_cast<char*>(ring->push(34 * 4096));
  EXPECT_EQ(d, c + 30 * 4096);
  ring->clear();
  EXPECT_EQ(ring->used(), 0u);
  EXPECT_EQ(memory_stats().current, before.current);
  EXPECT_EQ(ring->push(64 * 4096), ring->base()) << "an empty ring starts over";
}

// Note [Holes in the ring]: where the bytes after the newest block are held, a block goes to the
// lowest free range, also a tail that a wrapped ring left behind the oldest blocks; a streamed
// block goes where it waits for the blocks that leave first, into the zone too.
TEST(BlockRing, BlocksTakeHolesAndStreamOverTheBlocksThatLeaveFirst) {
  const std::uint64_t P = 4096;
  auto ring = BlockRing::create(64 * P, MemoryKind::kHost);
  char* a = static_cast<char*>(ring->push(40 * P));
  char* b = static_cast<char*>(ring->push(20 * P));  // 40..60
  ring->pop();                                        // a
  char* c = static_cast<char*>(ring->push(30 * P));  // 0..30: wrapped
  char* e = static_cast<char*>(ring->push(10 * P));  // 30..40, up to b
  ASSERT_EQ(b, a + 40 * P);
  ASSERT_EQ(c, ring->base());
  ASSERT_EQ(e, c + 30 * P);
  EXPECT_FALSE(ring->fits(5 * P)) << "4 pages left after b";
  EXPECT_EQ(ring->push(4 * P), b + 20 * P) << "the tail after b, though b is the oldest";
  EXPECT_EQ(ring->blocks(), 4u);
  EXPECT_EQ(ring->used(), 64u * P);
  ring->clear();

  // Ring of 32 pages and a zone of 32: p 20..40 and q 40..50 (in the zone), r 0..12 the newest.
  auto zr = BlockRing::create(32 * P, MemoryKind::kHost, true, 0, 32 * P);
  char* w = static_cast<char*>(zr->push(20 * P, 64 * P));
  char* p = static_cast<char*>(zr->push(20 * P, 64 * P));
  char* q = static_cast<char*>(zr->push(10 * P, 64 * P));
  zr->pop();  // w
  char* r = static_cast<char*>(zr->push(12 * P, 32 * P));
  ASSERT_EQ(w, zr->base());
  ASSERT_EQ(p, w + 20 * P);
  ASSERT_EQ(q, w + 40 * P);
  ASSERT_EQ(r, w);
  // 24 pages: from the start it would wait for r, the newest; after r it waits for p only.
  char* s = static_cast<char*>(zr->push_streamed(24 * P, 64 * P));
  ASSERT_EQ(s, r + 12 * P);
  EXPECT_TRUE(zr->range_free(s, 8 * P));
  EXPECT_FALSE(zr->range_free(s + 8 * P, P)) << "p holds it";
  zr->pop();  // p
  EXPECT_TRUE(zr->range_free(s, 24 * P)) << "whole once p is gone, before q and r";
  EXPECT_FALSE(zr->streaming());
  EXPECT_EQ(zr->lent_bytes(), 4u * P + 10 * P) << "s's last 4 pages and q lie in the zone";
  zr->clear();
  EXPECT_EQ(zr->used(), 0u);
}

// Random FIFO use never overlaps blocks held at the same time, every block lies within the
// ring, and a block that fits with one largest block to spare is always accepted (what
// wrap-around may lose is at most one block).
TEST(BlockRing, RandomUseNeverOverlapsAndLosesAtMostOneBlock) {
  const std::uint64_t cap = 97 * 4096, largest = 40;
  auto ring = BlockRing::create(cap, MemoryKind::kHost);
  std::mt19937 rng(7);
  std::deque<std::pair<std::uint64_t, std::uint64_t>> held;  // ring offset, pages
  std::uint64_t used = 0;
  int pushed = 0, refused = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::uint64_t pages = std::uniform_int_distribution<std::uint64_t>(1, largest)(rng);
    const bool fits = ring->fits(pages * 4096);
    if (used + (pages + largest) * 4096 <= cap) EXPECT_TRUE(fits) << i;
    if (used + pages * 4096 > cap) EXPECT_FALSE(fits) << i;
    if (fits && rng() % 3 != 0) {
      char* p = static_cast<char*>(ring->push(pages * 4096));
      ASSERT_NE(p, nullptr);
      const std::uint64_t off = static_cast<std::uint64_t>(p - ring->base());
      ASSERT_LE(off + pages * 4096, cap);
      for (const auto& [o, n] : held) {
        EXPECT_TRUE(off + pages * 4096 <= o || o + n * 4096 <= off) << i;
      }
      held.emplace_back(off, pages);
      used += pages * 4096;
      ++pushed;
    } else if (!held.empty()) {
      refused += !fits;
      ring->pop();
      used -= held.front().second * 4096;
      held.pop_front();
    }
    EXPECT_EQ(ring->used(), used);
  }
  EXPECT_GT(pushed, 1000);
  EXPECT_GT(refused, 100) << "full rings were exercised";
}

// A block that does not fit yet is pushed streamed: where it will be once the blocks it overlaps
// are gone; its bytes become free as they are popped; nothing else fits meanwhile; the bytes
// held are counted once.
TEST(BlockRing, AStreamedBlockTakesItsPlaceAsOlderBlocksGo) {
  const std::uint64_t P = 4096, cap = 64 * P;
  auto ring = BlockRing::create(cap, MemoryKind::kHost);
  const MemoryStats before = memory_stats();
  char* a = static_cast<char*>(ring->push(20 * P));
  char* b = static_cast<char*>(ring->push(30 * P));
  ASSERT_EQ(b, a + 20 * P);
  EXPECT_EQ(ring->push_streamed(65 * P), nullptr) << "larger than the ring";
  EXPECT_FALSE(ring->streaming());
  // 60 pages: not before the end (14 left), not before the oldest: over a and b, ending at the
  // ring's end, where it overlaps the fewest held bytes (46 pages, from the start 50).
  char* s = static_cast<char*>(ring->push_streamed(60 * P));
  ASSERT_EQ(s, ring->base() + 4 * P);
  EXPECT_TRUE(ring->streaming());
  EXPECT_EQ(ring->used(), 64u * P) << "a, b and the part of s they do not hold";
  EXPECT_EQ(memory_stats().current - before.current, 64u * P);
  EXPECT_FALSE(ring->fits(P)) << "every page is held, the streamed block's too";
  EXPECT_EQ(ring->push(P), nullptr);
  EXPECT_EQ(ring->push_streamed(P), nullptr) << "no room, and one streamed block at a time";
  EXPECT_FALSE(ring->range_free(s, P)) << "a holds it";
  EXPECT_TRUE(ring->range_free(s + 46 * P, 14 * P)) << "after b";
  EXPECT_FALSE(ring->range_free(s + 45 * P, 2 * P));
  ring->pop();  // a
  EXPECT_TRUE(ring->range_free(s, 16 * P));
  EXPECT_FALSE(ring->range_free(s + 16 * P, P));
  EXPECT_TRUE(ring->streaming());
  EXPECT_EQ(ring->used(), 60u * P);
  ring->pop();  // b: s is whole, the oldest; the pages before it are free
  EXPECT_FALSE(ring->streaming());
  EXPECT_TRUE(ring->range_free(s, 60 * P));
  EXPECT_EQ(ring->used(), 60u * P);
  EXPECT_EQ(ring->blocks(), 1u);
  EXPECT_EQ(ring->push(4 * P), ring->base());
  EXPECT_FALSE(ring->fits(P));
  ring->pop();  // s
  ring->pop();  // s
  // Wrapped: c at 10.., d at 40.., e at 0..8; a streamed block waits for the oldest ones, c and d,
  // not for e.
  ring->clear();
  EXPECT_EQ(memory_stats().current, before.current);
  char* c0 = static_cast<char*>(ring->push(10 * P));
  char* c = static_cast<char*>(ring->push(30 * P));  // 10..40
  char* d = static_cast<char*>(ring->push(20 * P));  // 40..60
  ring->pop();                                        // c0
  char* e = static_cast<char*>(ring->push(8 * P));   // 0..8: wrapped
  ASSERT_EQ(c, c0 + 10 * P);
  ASSERT_EQ(d, c + 30 * P);
  ASSERT_EQ(e, ring->base());
  // 24..64 waits for c and d as 8..48 would, over fewer of their bytes (36 pages, not 38).
  char* t = static_cast<char*>(ring->push_streamed(40 * P));
  ASSERT_EQ(t, e + 24 * P);
  EXPECT_TRUE(ring->range_free(t + 36 * P, 4 * P));
  EXPECT_FALSE(ring->range_free(t + 35 * P, 2 * P));
  EXPECT_EQ(ring->used(), 8u * P + 30 * P + 20 * P + 4 * P);
  ring->pop();  // c
  EXPECT_TRUE(ring->range_free(t, 16 * P));
  EXPECT_TRUE(ring->streaming());
  ring->pop();  // d
  EXPECT_FALSE(ring->streaming());
  EXPECT_EQ(ring->used(), 48u * P);
  EXPECT_EQ(ring->push(16 * P), e + 8 * P) << "the hole between e and the streamed block";
  ring->clear();
  EXPECT_EQ(ring->used(), 0u);
  EXPECT_EQ(memory_stats().current, before.current);
}

// Note [Keeping part of a block]: kept bytes just before the ring, counted from the start; a
// block pushed at the ring's first byte waits for (or streams over) the blocks there, and lies
// contiguous with the kept bytes.
TEST(BlockRing, KeptBytesPrecedeTheRingAndABlockFollowsThemAtItsStart) {
  const std::uint64_t P = 4096, cap = 32 * P;
  const MemoryStats before = memory_stats();
  {
    auto ring = BlockRing::create(cap, MemoryKind::kHost, true, 10 * P);
    ASSERT_EQ(ring->kept(), 10u * P);
    ASSERT_EQ(ring->kept_begin() + 10 * P, ring->base());
    EXPECT_EQ(ring->capacity(), cap);
    EXPECT_EQ(ring->used(), 10u * P);
    EXPECT_EQ(memory_stats().current - before.current, 10u * P);
    std::memset(ring->kept_begin(), 7, 10 * P);  // the kept part, written once
    char* f = static_cast<char*>(ring->push_first(12 * P));
    ASSERT_EQ(f, ring->base());
    char* a = static_cast<char*>(ring->push(12 * P));
    ASSERT_EQ(a, f + 12 * P);
    EXPECT_EQ(ring->push_first(4 * P), nullptr) << "f holds the start";
    ring->pop();  // f
    EXPECT_EQ(ring->push_first(13 * P), nullptr) << "a holds page 12";
    char* g = static_cast<char*>(ring->push_first(12 * P));
    ASSERT_EQ(g, ring->base()) << "room before a";
    EXPECT_EQ(ring->push(10 * P), nullptr) << "wrapped: only [12, 12) is free before a";
    ring->pop();  // a
    char* b = static_cast<char*>(ring->push(16 * P));
    ASSERT_EQ(b, g + 12 * P);
    // Streamed at the start over g and b: its pieces free as they go.
    EXPECT_EQ(ring->push_first(20 * P), nullptr);
    char* s = static_cast<char*>(ring->push_first_streamed(20 * P));
    ASSERT_EQ(s, ring->base());
    EXPECT_TRUE(ring->streaming());
    EXPECT_EQ(ring->used(), 10u * P + 28 * P) << "kept, g, b; s's bytes only where they hold none";
    EXPECT_FALSE(ring->range_free(s, P));
    ring->pop();  // g
    EXPECT_TRUE(ring->range_free(s, 12 * P));
    EXPECT_FALSE(ring->range_free(s + 12 * P, P));
    ring->pop();  // b
    EXPECT_FALSE(ring->streaming());
    EXPECT_EQ(ring->used(), 10u * P + 20 * P);
    for (std::uint64_t i = 0; i < 10 * P; ++i) ASSERT_EQ(ring->kept_begin()[i], 7) << "kept bytes untouched";
    // discard_except gives back the kept bytes too, but for what is kept.
    ring->discard_except({{ring->kept_begin(), 4 * P}});
    EXPECT_EQ(ring->kept_begin()[0], 7);
    EXPECT_EQ(ring->kept_begin()[5 * P], 0) << "given back";
    ring->clear();
    EXPECT_EQ(ring->used(), 10u * P);
  }
  EXPECT_EQ(memory_stats().current, before.current);
  EXPECT_THROW(BlockRing::create(cap, MemoryKind::kHost, false, P), Error) << "two ends keep nothing";
}

// Random FIFO use with streamed pushes: blocks never overlap once whole, a streamed block's free
// ranges are never held by another, and used() is the union of the bytes held.
// Random pushes, streamed pushes, pops and (with `release_fronts`) fronts given back page by
// page: used() is the union of what the blocks hold, range_free() says exactly where older
// blocks hold nothing, and blocks never overlap while none streams.
void random_streamed_use(bool release_fronts, std::uint64_t zone_pages = 0) {
  const std::uint64_t P = 4096, cap = 61 * P;
  // zone_pages: Note [Lending the activation reserve]: every push may end up to a random limit
  // in the zone; zone bytes held count as lent, not used.
  auto ring = BlockRing::create(cap, MemoryKind::kHost, true, 0, zone_pages * P);
  const MemoryStats before = memory_stats();
  std::mt19937 rng(11);
  std::deque<std::pair<std::uint64_t, std::uint64_t>> held;  // offset, pages
  int streamed = 0, released = 0;
  bool lent_any = false;
  int lent_streamed = 0;  // streamed blocks ending in the zone
  int pushed_while_streaming = 0;
  size_t popped = 0, streaming_block = ~size_t{0};  // blocks popped; the streaming one (pushes counted)
  for (int i = 0; i < 5000; ++i) {
    const std::uint64_t pages = std::uniform_int_distribution<std::uint64_t>(1, 61)(rng);
    if (release_fronts && rng() % 3 == 0 && !held.empty() && held.front().second > 1) {
      const std::uint64_t k = std::uniform_int_distribution<std::uint64_t>(1, held.front().second - 1)(rng);
      // Any address inside the k-th page rounds down to it.
      const char* p = ring->base() + held.front().first + k * P + rng() % P;
      ASSERT_EQ(ring->release_front_until(p), k * P) << i;
      held.front().first += k * P;
      held.front().second -= k * P / P;
      ++released;
    } else if (rng() % 2 == 0) {
      // While a block streams, only blocks that fit next to everything held (its whole range
      // too) go after it.
      const std::uint64_t limit = cap + (zone_pages ? rng() % (zone_pages + 1) : 0) * P;
      const bool fits = ring->fits(pages * P, limit);
      const bool was_streaming = ring->streaming();
      char* p = static_cast<char*>(fits ? ring->push(pages * P, limit) : ring->push_streamed(pages * P, limit));
      if (was_streaming && !fits) {
        EXPECT_EQ(p, nullptr) << i << ": a second block streamed";
      }
      if (p != nullptr) {
        streamed += !fits;
        pushed_while_streaming += was_streaming;
        if (!fits) streaming_block = held.size() + popped;
        held.emplace_back(static_cast<std::uint64_t>(p - ring->base()), pages);
        ASSERT_LE(held.back().first + pages * P, limit) << i << ": a block ends past its limit";
        lent_any |= held.back().first + pages * P > cap;
        lent_streamed += !fits && held.back().first + pages * P > cap;
      }
    } else if (!held.empty()) {
      ring->pop();
      held.pop_front();
      ++popped;
    }
    if (!ring->streaming()) streaming_block = ~size_t{0};
    std::vector<char> page(61 + zone_pages, 0);
    for (const auto& [o, n] : held) {
      ASSERT_LE(o + n * P, cap + zone_pages * P);
      for (std::uint64_t k = 0; k < n; ++k) page[o / P + k] = 1;
    }
    EXPECT_EQ(ring->used(), static_cast<std::uint64_t>(std::count(page.begin(), page.begin() + 61, 1)) * P) << i;
    EXPECT_EQ(ring->lent_bytes(), static_cast<std::uint64_t>(std::count(page.begin() + 61, page.end(), 1)) * P) << i;
    std::uint64_t end = 0;
    for (const auto& [o, n] : held) end = std::max(end, o + n * P);
    EXPECT_EQ(ring->held_end(), end) << i;
    EXPECT_EQ(memory_stats().current - before.current, ring->used()) << i;
    // The streamed block's pages are free where no older block holds them; no other two blocks
    // share a page.
    const size_t si = streaming_block == ~size_t{0} ? held.size() : streaming_block - popped;
    if (si < held.size()) {
      const auto [o, n] = held[si];
      for (std::uint64_t k = 0; k < n; ++k) {
        bool older = false;
        for (size_t j = 0; j < si; ++j) {
          older |= held[j].first <= o + k * P && o + k * P < held[j].first + held[j].second * P;
        }
        EXPECT_EQ(ring->range_free(ring->base() + o + k * P, P), !older) << i;
      }
    }
    for (size_t j = 0; j < held.size(); ++j) {
      for (size_t l = j + 1; l < held.size(); ++l) {
        if (l == si) continue;
        EXPECT_TRUE(held[j].first + held[j].second * P <= held[l].first ||
                    held[l].first + held[l].second * P <= held[j].first)
            << i;
      }
    }
  }
  EXPECT_GT(streamed, 200);
  EXPECT_GT(pushed_while_streaming, 10);
  if (release_fronts) EXPECT_GT(released, 500);
  EXPECT_EQ(lent_any, zone_pages > 0);
  if (zone_pages > 0) EXPECT_GT(lent_streamed, 20);
}

TEST(BlockRing, RandomStreamedUseCountsEveryByteOnce) { random_streamed_use(false); }

TEST(BlockRing, RandomUseWithFrontsGivenBackCountsEveryByteOnce) { random_streamed_use(true); }

TEST(BlockRing, RandomUseLendingAZoneCountsEveryByteOnceAndKeepsEachLimit) { random_streamed_use(true, 23); }

TEST(BlockRing, TheOldestBlockGivesBackItsFrontForTheBlockStreamingOverIt) {
  const std::uint64_t P = 4096;
  auto ring = BlockRing::create(40 * P, MemoryKind::kHost);
  char* a = static_cast<char*>(ring->push(30 * P));
  EXPECT_EQ(ring->release_front_until(a), 0u) << "nothing before its first byte";
  EXPECT_EQ(ring->release_front_until(a + 30 * P), 0u) << "not inside it";
  char* s = static_cast<char*>(ring->push_streamed(36 * P));
  ASSERT_EQ(s, a + 4 * P) << "over a's last 26 pages, ending at the ring's end";
  EXPECT_FALSE(ring->range_free(s, P));
  EXPECT_EQ(ring->used(), 40u * P);
  EXPECT_EQ(ring->release_front_until(a + 12 * P + 100), 12u * P) << "a's first 12 pages ran";
  EXPECT_TRUE(ring->range_free(s, 8 * P));
  EXPECT_FALSE(ring->range_free(s + 8 * P, P));
  EXPECT_TRUE(ring->streaming());
  EXPECT_EQ(ring->used(), 36u * P) << "s holds what a gave back but its first 4 pages";
  EXPECT_EQ(ring->release_front_until(a + 12 * P), 0u) << "already given back";
  ring->pop();  // the rest of a
  EXPECT_FALSE(ring->streaming());
  EXPECT_EQ(ring->used(), 36u * P);
  // Not deep: nothing is given back early.
  auto two = BlockRing::create(40 * P, MemoryKind::kHost, false);
  char* b = static_cast<char*>(two->push(10 * P));
  EXPECT_EQ(two->release_front_until(b + 5 * P), 0u);
}

// A ring asked not to be deep holds two blocks at opposite ends; memory the GPU reads in place
// is a deep ring where asked, as host memory is.
TEST(BlockRing, TwoEndedWhereNotDeep) {
  auto two_ended = [](BlockRing& ring) {
    EXPECT_FALSE(ring.deep());
    char* a = static_cast<char*>(ring.push(4 * 4096));
    char* b = static_cast<char*>(ring.push(4 * 4096));
    ASSERT_TRUE(a && b);
    EXPECT_EQ(b, ring.base() + 12 * 4096) << "the high end";
    EXPECT_EQ(ring.push(4096), nullptr) << "two blocks at most";
  };
  two_ended(*BlockRing::create(16 * 4096, MemoryKind::kHost, false));
  if (!cuda_device().usable) {
    EXPECT_THROW(BlockRing::create(1 << 20, MemoryKind::kRegistered), Error) << "registered memory needs a GPU";
    return;
  }
  two_ended(*BlockRing::create(16 * 4096, MemoryKind::kManaged, false));
  auto deep = BlockRing::create(16 * 4096, MemoryKind::kManaged, true, 4 * 4096);
  EXPECT_TRUE(deep->deep());
  char* a = static_cast<char*>(deep->push(4 * 4096));
  char* b = static_cast<char*>(deep->push(4 * 4096));
  char* c = static_cast<char*>(deep->push(4 * 4096));
  ASSERT_TRUE(a && b && c) << "three blocks in a deep ring of GPU memory";
  EXPECT_EQ(b, a + 4 * 4096);
  EXPECT_EQ(deep->kept_begin() + 4 * 4096, deep->base()) << "kept bytes before it";
}

}  // namespace
}  // namespace swapnet
