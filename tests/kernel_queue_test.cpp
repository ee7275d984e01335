// The assembly module's KernelQueue alone (Note [Ring space behind the kernels] in
// kernel_queue.cpp), on a host ring, with marks of a fake device whose queue the test advances:
// the CUDA backend runs this code with CUDA events, on a GPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "kernel_queue.h"

namespace swapnet {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// A device that does its queue in order: a mark put at position n is passed once `done` reaches n.
struct Device {
  int queued = 0;
  int done = 0;
  int made = 0;
};

class QueueMark final : public Mark {
 public:
  explicit QueueMark(Device* d) : d_(d) {}
  void put() override { at_ = ++d_->queued; }
  bool passed() override { return at_ <= d_->done; }
  void wait() override { d_->done = std::max(d_->done, at_); }  // the device catches up
  double ms_since(Mark&) override { return 0; }

 private:
  Device* d_;
  int at_ = 0;
};

// A queue on that device and an 8 MiB host ring.
class KernelQueueOnARing : public ::testing::Test {
 protected:
  Device d;
  KernelQueue q{[this] {
    ++d.made;
    return std::make_unique<QueueMark>(&d);
  }};
  std::unique_ptr<BlockRing> ring = BlockRing::create(8 * kMiB, MemoryKind::kHost);
};

// A block's bytes go back as the device passes the work queued before each release, not as it is
// queued; its ring entry once its last kernels are done. A block streaming over it reads on.
TEST_F(KernelQueueOnARing, BytesGoBackOnlyBehindTheDevicesWork) {
  char* a = static_cast<char*>(ring->push(6 * kMiB));
  ASSERT_NE(a, nullptr);
  char* b = static_cast<char*>(ring->push_streamed(6 * kMiB));
  ASSERT_EQ(b, a + 2 * kMiB) << "streamed to the ring's end, over a's last 4 MiB";

  q.release(a + 2 * kMiB);  // after a's first layers: its first 2 MiB are dead once they are done
  q.release(a + 4 * kMiB);
  EXPECT_EQ(q.size(), 2u);
  KernelQueue::Freed f = q.reclaim(*ring, false, false);
  EXPECT_EQ(f.early, 0u) << "nothing the device has not done";

  d.done = 1;  // the device did the work queued before the first release
  f = q.reclaim(*ring, false, false);
  EXPECT_EQ(f.early, 2 * kMiB);
  EXPECT_EQ(f.blocks, 0u);
  EXPECT_FALSE(ring->range_free(b, 2 * kMiB));
  EXPECT_EQ(q.size(), 1u);

  q.block_done();
  EXPECT_EQ(q.blocks(), 1u);
  d.done = 2;
  f = q.reclaim(*ring, false, false);
  EXPECT_EQ(f.early, 2 * kMiB);
  EXPECT_TRUE(ring->range_free(b, 2 * kMiB)) << "b's first piece may be read while a's last kernels run";
  EXPECT_FALSE(ring->range_free(b + 2 * kMiB, 2 * kMiB));
  EXPECT_EQ(ring->blocks(), 2u);

  d.done = 3;
  f = q.reclaim(*ring, false, false);
  EXPECT_EQ(f.early, 0u);
  EXPECT_EQ(f.blocks, 1u);
  EXPECT_EQ(q.blocks(), 0u);
  EXPECT_EQ(ring->blocks(), 1u) << "block a is gone, b stays";
  EXPECT_TRUE(ring->range_free(b, 6 * kMiB));
  EXPECT_EQ(d.made, 2) << "the first release's mark, passed, was put again for the block's end";
}

// A release no further than the last one of its block puts no mark; block_done starts anew, so
// the next block's releases count even where it lies below the last one (the ring wrapped).
TEST_F(KernelQueueOnARing, AReleaseThatGivesNothingMorePutsNoMark) {
  char* a = static_cast<char*>(ring->push(4 * kMiB));
  q.release(a + 2 * kMiB);
  q.release(a + 2 * kMiB);
  q.release(a + kMiB);
  q.release(nullptr);
  EXPECT_EQ(q.size(), 1u);
  q.block_done();
  d.done = d.queued;
  q.reclaim(*ring, false, false);
  ASSERT_EQ(ring->blocks(), 0u);
  char* b = static_cast<char*>(ring->push(4 * kMiB));
  ASSERT_EQ(b, a) << "an empty ring starts over at its first byte";
  q.release(b + kMiB);
  EXPECT_EQ(q.size(), 1u) << "below a's last release, yet b's first";
  q.release(b + 3 * kMiB);
  EXPECT_EQ(q.size(), 2u);
}

// A block's release queued behind the end of the block before it waits for that end: applied
// first, it would have been given to the older block (release_front_until works on the oldest).
TEST_F(KernelQueueOnARing, AReleaseWaitsForTheBlocksBeforeItsOwn) {
  ASSERT_NE(ring->push(2 * kMiB), nullptr);
  q.block_done();  // a's kernels queued, not done
  char* b = static_cast<char*>(ring->push(4 * kMiB));
  ASSERT_NE(b, nullptr);
  q.release(b + 2 * kMiB);
  KernelQueue::Freed f = q.reclaim(*ring, false, false);
  EXPECT_EQ(f.blocks + f.early, 0u);
  d.done = 1;
  f = q.reclaim(*ring, false, false);
  EXPECT_EQ(f.blocks, 1u);
  EXPECT_EQ(f.early, 0u);
  d.done = 2;
  f = q.reclaim(*ring, false, false);
  EXPECT_EQ(f.early, 2 * kMiB) << "b's first 2 MiB, once a is gone and b's first layers are done";
  EXPECT_EQ(ring->blocks(), 1u);
}

// Waiting: for everything, or for the oldest block only (`one`: what the device has passed
// besides goes too, without waiting); marks are put again.
TEST_F(KernelQueueOnARing, AWaitAppliesInOrderAndOneStopsAfterABlock) {
  char* a = static_cast<char*>(ring->push(4 * kMiB));
  q.release(a + 2 * kMiB);
  q.block_done();
  ASSERT_NE(ring->push(2 * kMiB), nullptr);
  q.block_done();
  ASSERT_NE(ring->push(kMiB), nullptr);
  KernelQueue::Freed f = q.reclaim(*ring, true, true);
  EXPECT_EQ(f.early, 2 * kMiB);
  EXPECT_EQ(f.blocks, 1u);
  EXPECT_EQ(q.blocks(), 1u);
  EXPECT_EQ(ring->blocks(), 2u);
  f = q.reclaim(*ring, true, false);
  EXPECT_EQ(f.blocks, 1u);
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(ring->blocks(), 1u);
  q.block_done();
  q.reclaim(*ring, true, false);
  EXPECT_EQ(ring->blocks(), 0u);
  EXPECT_EQ(d.made, 3) << "passed marks are put again";

  // Two blocks, both done by the device: one wait pops both.
  ASSERT_NE(ring->push(kMiB), nullptr);
  q.block_done();
  ASSERT_NE(ring->push(kMiB), nullptr);
  q.block_done();
  d.done = d.queued;
  f = q.reclaim(*ring, true, true);
  EXPECT_EQ(f.blocks, 2u);
  EXPECT_EQ(ring->blocks(), 0u);
}

}  // namespace
}  // namespace swapnet
