// Ring space behind the device's queued work (kernel_queue.h).
#include "kernel_queue.h"

#include <utility>

#include "swapnet/swapcore.h"

namespace swapnet {

// Note [Ring space behind the kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On the host a layer's work is done when its call returns, so after each layer the ring gets
// back at once the bytes before the lowest layer the rest of its block still reads (Note [Layer
// by layer] in read_ahead.cpp), and a block streaming over them reads on while the block
// computes. A GPU's kernels run after the call that queued them, and until 2026-11-29 its ring
// got a block's bytes back only whole, once an event behind the block's last kernel had passed:
// where the ring holds few blocks (low budgets, large blocks) the next reads waited for the whole
// block's kernels, and the disk idled meanwhile. On the host twin (Note [The CUDA backend's host
// twin]) at 50 MB/s, resnet101 at 1/3 kept the disk busy 80 % of the time against the host's
// 96 %, all of the idle time "held: no room" while a block computed.
//
// So the GPU gives bytes back layer by layer too, behind its kernels: after a layer is queued,
// the bytes the rest of its block no longer reads are released with a mark put behind that
// layer's work, and the release is applied to the ring once the device has passed the mark. A
// block's end is a mark too, and its ring entry goes when that passes. The device does its queue
// in order, so the marks pass in the order they were put, and one queue holds both: releases are
// applied to the ring's oldest block, which by then is the block they were made for (the blocks
// before it were popped first). The queue is applied without waiting after each layer and as the
// cursor reads on; the cursor waits for it only where the next read has no other room (pump's
// KernelWait, take()). Nothing is released that queued work still reads, which is the rule the
// GPU's ring kept before; what changed is that "queued work" is counted per layer.
void KernelQueue::push(char* until) {
  Entry e;
  if (!spare_.empty()) {  // marks are put again, not made per layer
    e.mark = std::move(spare_.back());
    spare_.pop_back();
  } else {
    e.mark = make_();
    if (!e.mark) throw Error("internal: no mark to put behind the device's work");
  }
  e.mark->put();
  e.until = until;
  q_.push_back(std::move(e));
}

void KernelQueue::release(char* until) {
  if (until == nullptr || (released_ != nullptr && until <= released_)) return;
  push(until);
  released_ = until;
}

void KernelQueue::block_done() {
  push(nullptr);
  ++blocks_;
  released_ = nullptr;
}

KernelQueue::Freed KernelQueue::reclaim(BlockRing& ring, bool wait, bool one) {
  Freed freed;
  const bool all = wait && !one;
  while (!q_.empty()) {
    if (!q_.front().mark->passed()) {  // a device error throws here, the entry still queued
      if (!wait) break;
      q_.front().mark->wait();
    }
    // Off the queue before the ring changes: nothing after this throws with the ring changed
    // and the entry still queued (it would be applied twice).
    Entry e = std::move(q_.front());
    q_.pop_front();
    if (e.until == nullptr) {
      ring.pop();
      --blocks_;
      ++freed.blocks;
      if (one) wait = false;  // one block waited for; what the device has passed besides goes too
    } else {
      freed.early += ring.release_front_until(e.until);
    }
    spare_.push_back(std::move(e.mark));
  }
  // All applied: the next release starts anew (after a drain, an aborted block's last release
  // says nothing of the next block's addresses).
  if (all) released_ = nullptr;
  return freed;
}

}  // namespace swapnet
