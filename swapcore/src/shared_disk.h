// Internal to swapcore/: the state behind SharedDisk, the turns several block readers take on
// one disk (Note [One disk, read by urgency] in shared_disk.cpp). Every member takes `mu`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "swapnet/swapcore.h"

namespace swapnet {

struct SharedDisk::State {
  struct Member {
    double priority = 0;
    bool wants = false;  // has a piece to issue (asked, and has not said it is idle since)
    std::function<void()> wake;
  };
  mutable std::mutex mu;
  unsigned cap = 0;  // 0: none
  unsigned in_flight = 0;
  std::map<int, Member> members;
  int next_id = 1;
  std::uint64_t granted = 0, deferred = 0;

  // Wakes are called under mu: a reader leaving (under mu) then knows none is running into it.
  void wake_wanting_locked(int except);
  // A reader joins with the call that wakes it; returns its id.
  int join(std::function<void()> wake);
  void leave(int id);
  void set_priority(int id, double p);
  double priority(int id) const;
  // A reader with a piece to issue asks for a slot on the disk.
  bool acquire(int id);
  // A reader has nothing (more) to issue: it no longer holds others back.
  void idle(int id);
  // Requests ended (see shared_disk.cpp for whom that wakes).
  void release(unsigned n);
};

}  // namespace swapnet
