// What the runtime's models use over time against the budget (Note [The memory ledger] in
// ledger.cpp). Not thread-safe: the runtime calls it under its lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "swapnet/scheduler.h"

namespace swapnet {
namespace runtime_detail {

class MemoryLedger {
 public:
  using Clock = std::chrono::steady_clock;
  MemoryLedger(size_t models, std::uint64_t total, Clock::time_point now);
  void announce(std::uint64_t total, Clock::time_point now);  // a new total, taking effect
  void in_effect(Clock::time_point now);                      // the latest total has taken effect
  void use(size_t model, std::uint64_t bytes, Clock::time_point now);  // model's use from now on
  MemoryUse totals(Clock::time_point now) const;

 private:
  void advance(Clock::time_point now);
  std::vector<std::uint64_t> used_;
  std::uint64_t sum_ = 0;
  std::uint64_t total_ = 0;  // the latest total
  std::uint64_t limit_ = 0;  // what may be used now: total_, or during a change the larger of the totals
  Clock::time_point at_;
  MemoryUse u_;
};

}  // namespace runtime_detail
}  // namespace swapnet
