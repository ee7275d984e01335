// One disk, several readers: the process-wide turns the block readers of a SharedDisk take on
// their disk, by urgency, and the cap on their requests in flight together.
#include "shared_disk.h"

#include <algorithm>
#include <utility>

namespace swapnet {

// Note [One disk, read by urgency]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The models a Runtime serves read one disk. Each executor reads ahead on its own and each
// reader keeps queue_depth requests in flight, so the kernel (and a throttled cgroup's queue)
// serves the models' reads interleaved in the order they came: the block a request near its
// deadline waits for shares the disk with another model's read-ahead for a frame that has not
// even arrived. Hetero²Pipe orders the stages that contend for a shared resource; here we order
// the reads. A reader of a SharedDisk issues a request only while no more urgent reader (a
// lower priority; equals share) has one to issue; the Runtime sets the priorities from its
// policy's order (Note [The disk as a scheduled resource] in dispatch.cpp). A reader held back
// sleeps until a more urgent one goes idle, a priority changes or, with a cap, a request ends
// (woken; within 1-2 ms if the wake-up raced with its going to sleep). Requests already in flight are never recalled, so a
// reader that becomes the most urgent still finds up to a queue depth of each other reader's
// requests ahead of it. `pieces` > 0 also caps the requests in flight from all readers
// together, which makes that queue shorter: with one queue depth (32 x 256 KiB) four models on
// a disk throttled to 400 MB/s met 46 % fewer deadlines (docs/scheduler.md), so the Runtime
// sets no cap.
void SharedDisk::State::wake_wanting_locked(int except) {
  for (auto& [id, m] : members) {
    if (id != except && m.wants && m.wake) m.wake();
  }
}
int SharedDisk::State::join(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu);
  const int id = next_id++;
  members[id].wake = std::move(wake);
  return id;
}
void SharedDisk::State::leave(int id) {
  std::lock_guard<std::mutex> lock(mu);
  members.erase(id);
  wake_wanting_locked(id);
}
void SharedDisk::State::set_priority(int id, double p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = members.find(id);
  if (it == members.end() || it->second.priority == p) return;
  it->second.priority = p;
  wake_wanting_locked(0);
}
double SharedDisk::State::priority(int id) const {
  std::lock_guard<std::mutex> lock(mu);
  auto it = members.find(id);
  return it == members.end() ? 0.0 : it->second.priority;
}
bool SharedDisk::State::acquire(int id) {
  std::lock_guard<std::mutex> lock(mu);
  Member& me = members[id];
  me.wants = true;
  if (cap > 0 && in_flight >= cap) return false;
  for (const auto& [other, m] : members) {
    if (other != id && m.wants && m.priority < me.priority) {
      ++deferred;
      return false;
    }
  }
  ++in_flight;
  ++granted;
  return true;
}
void SharedDisk::State::idle(int id) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = members.find(id);
  if (it == members.end() || !it->second.wants) return;
  it->second.wants = false;
  wake_wanting_locked(id);
}
// Without a cap nobody waits for a slot (only for more urgent readers to go idle), so nobody is
// woken: this runs once per completed request.
void SharedDisk::State::release(unsigned n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> lock(mu);
  in_flight -= std::min(n, in_flight);
  if (cap > 0) wake_wanting_locked(0);
}

SharedDisk::SharedDisk(unsigned pieces) : state_(std::make_unique<State>()) {
  state_->cap = pieces;
}
SharedDisk::~SharedDisk() = default;
unsigned SharedDisk::pieces() const { return state_->cap; }
SharedDisk::Stats SharedDisk::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return Stats{state_->granted, state_->deferred};
}

}  // namespace swapnet
