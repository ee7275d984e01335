// Ring space the device's queued work still reads (internal to the assembly module; Note [Ring
// space behind the kernels] in kernel_queue.cpp). A backend whose layers run after the call that
// queued them (a GPU's kernels) gives a swapped block's ring bytes back only once the device has
// done the work reading them: the KernelQueue puts a mark behind that work and applies the
// release to the ring once the device passed it, oldest first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "layer_clock.h"
#include "swapnet/allocator.h"

namespace swapnet {

class KernelQueue {
 public:
  explicit KernelQueue(LayerClock::MakeMark make) : make_(std::move(make)) {}

  // The work queued so far no longer reads the bytes of the ring's oldest block before `until`
  // (the block executing, once the blocks before it are gone): given back once the device has
  // passed it. A release no further than the last one of this block is none.
  void release(char* until);
  // A swapped block's work is all queued: its ring entry goes once the device has passed it.
  void block_done();

  struct Freed {
    std::uint64_t early = 0;  // bytes of blocks still executing given back
    std::size_t blocks = 0;   // ring entries popped
  };
  // Applies to `ring` what the device has passed, oldest first; waits for the device where
  // `wait` (only until one block is popped, where `one`; then what it has passed besides).
  Freed reclaim(BlockRing& ring, bool wait, bool one);
  // Executed blocks whose ring entries wait for the device.
  std::size_t blocks() const { return blocks_; }
  // Releases and blocks waiting for the device (for tests).
  std::size_t size() const { return q_.size(); }

 private:
  struct Entry {
    std::unique_ptr<Mark> mark;
    char* until = nullptr;  // nullptr: the oldest block's ring entry goes
  };
  void push(char* until);

  LayerClock::MakeMark make_;
  std::deque<Entry> q_;
  std::vector<std::unique_ptr<Mark>> spare_;  // passed, to be put again
  std::size_t blocks_ = 0;
  char* released_ = nullptr;  // the executing block's last release (nullptr: none since block_done)
};

}  // namespace swapnet
