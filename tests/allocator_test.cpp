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

// The mirrored ring: any block up to the capacity is contiguous, wherever it starts, and a byte
// written through one view is seen through the other; FIFO order; accounting.
TEST(BlockRing, MirroredBlocksAreContiguousAcrossTheSeam) {
  const std::uint64_t cap = 64 * 4096;
  auto ring = BlockRing::create(cap, MemoryKind::kHost);
  ASSERT_TRUE(ring->mirrored());
  EXPECT_EQ(ring->capacity(), cap);
  EXPECT_EQ(ring->mapped_bytes(), 2 * cap);
  const MemoryStats before = memory_stats();
  char* a = static_cast<char*>(ring->push(40 * 4096));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a, ring->base());
  char* b = static_cast<char*>(ring->push(20 * 4096));
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b, a + 40 * 4096);
  EXPECT_FALSE(ring->fits(5 * 4096)) << "60 of 64 pages used";
  EXPECT_EQ(ring->push(5 * 4096), nullptr);
  EXPECT_EQ(memory_stats().current - before.current, 60u * 4096);
  ring->pop();  // a goes
  EXPECT_EQ(ring->used(), 20u * 4096);
  // 30 pages from page 60: wraps around the end, yet contiguous through the second mapping.
  char* c = static_cast<char*>(ring->push(30 * 4096));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c, ring->base() + 60 * 4096);
  std::memset(c, 0x5A, 30 * 4096);
  EXPECT_EQ(ring->base()[0], 0x5A) << "the wrapped part is the start of the ring";
  EXPECT_EQ(ring->base()[26 * 4096 - 1], 0x5A);
  EXPECT_EQ(ring->blocks(), 2u);
  ring->clear();
  EXPECT_EQ(ring->used(), 0u);
  EXPECT_EQ(memory_stats().current, before.current);
}

// Random FIFO use never overlaps blocks held at the same time, and a block that fits next to
// the others is always accepted (no space lost to wrap-around).
TEST(BlockRing, RandomUseNeverOverlapsAndNeverWastesSpace) {
  const std::uint64_t cap = 97 * 4096;
  auto ring = BlockRing::create(cap, MemoryKind::kHost);
  std::mt19937 rng(7);
  std::deque<std::pair<std::uint64_t, std::uint64_t>> held;  // ring offset, pages
  std::uint64_t used = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::uint64_t pages = std::uniform_int_distribution<std::uint64_t>(1, 40)(rng);
    const bool fits = used + pages * 4096 <= cap;
    EXPECT_EQ(ring->fits(pages * 4096), fits);
    if (fits && rng() % 3 != 0) {
      char* p = static_cast<char*>(ring->push(pages * 4096));
      ASSERT_NE(p, nullptr);
      const std::uint64_t off = static_cast<std::uint64_t>(p - ring->base());
      ASSERT_LT(off, cap);
      for (const auto& [o, n] : held) {
        // Disjoint on the circle of `cap` bytes.
        const std::uint64_t d = (o + cap - off) % cap;  // from the new block to the old one
        EXPECT_TRUE(d >= pages * 4096 && (off + cap - o) % cap >= n * 4096) << i;
      }
      held.emplace_back(off, pages);
      used += pages * 4096;
    } else if (!held.empty()) {
      ring->pop();
      used -= held.front().second * 4096;
      held.pop_front();
    }
    EXPECT_EQ(ring->used(), used);
  }
}

// Kinds that cannot be mirrored hold two blocks at opposite ends.
TEST(BlockRing, TwoEndedWhereNotMirrored) {
  if (!cuda_device().usable) {
    EXPECT_THROW(BlockRing::create(1 << 20, MemoryKind::kRegistered), Error) << "registered memory needs a GPU";
    return;
  }
  auto ring = BlockRing::create(16 * 4096, MemoryKind::kManaged);
  EXPECT_FALSE(ring->mirrored());
  char* a = static_cast<char*>(ring->push(4 * 4096));
  char* b = static_cast<char*>(ring->push(4 * 4096));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b, ring->base() + 12 * 4096) << "the high end";
  EXPECT_EQ(ring->push(4096), nullptr) << "two blocks at most";
}

}  // namespace
}  // namespace swapnet
