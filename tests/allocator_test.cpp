// Tests of swapnet/allocator.h: the CUDA probe answers, never fails, and explains itself.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
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

// Memory the GPU reads in place, or a ring asked not to be deep, holds two blocks at opposite ends.
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
  two_ended(*BlockRing::create(16 * 4096, MemoryKind::kManaged));
}

}  // namespace
}  // namespace swapnet
