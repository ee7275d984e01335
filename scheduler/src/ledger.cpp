// The memory ledger (ledger.h).
//
// Note [The memory ledger]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A budget is a promise over time, not only per inference (ModelStatus::over_budget): the
// ledger integrates what the models use against the budget. Each model's use is what its worker
// measures after each block (weights held: the ring, resident blocks and pinned slots; plus its
// activations' peak since the inference began, lent zone bytes included: an upper bound of
// the block's use), after each move and shed (weights held, activations in use), and after each
// inference (weights held); between two such points it counts as constant. The promise
// (Runtime::set_budget): during a change memory never exceeds the larger of the old and new
// totals, and once the change has taken effect it stays within the new one. So:
//   over_byte_s      = integral of max(0, used - limit) dt, limit = the total in force, or during
//                      a change not yet in effect the largest total since the last one in
//                      effect: the promise broken (must be 0);
//   complying_byte_s = integral of max(0, used - total) dt while a lower total takes effect:
//                      what a cut costs while models shed, beside its time to comply
//                      (Adaptation::took_ms);
//   peak_bytes       = the most used at once.
#include "ledger.h"

#include <algorithm>

namespace swapnet {
namespace runtime_detail {

MemoryLedger::MemoryLedger(size_t models, std::uint64_t total, Clock::time_point now)
    : used_(models, 0), total_(total), limit_(total), at_(now) {}

void MemoryLedger::advance(Clock::time_point now) {
  if (now <= at_) return;
  const double s = std::chrono::duration<double>(now - at_).count();
  if (sum_ > limit_) {
    u_.over_byte_s += static_cast<double>(sum_ - limit_) * s;
    u_.over_s += s;
  }
  if (limit_ > total_ && sum_ > total_) u_.complying_byte_s += static_cast<double>(sum_ - total_) * s;
  at_ = now;
}

void MemoryLedger::announce(std::uint64_t total, Clock::time_point now) {
  advance(now);
  limit_ = std::max(limit_, total);
  total_ = total;
}

void MemoryLedger::in_effect(Clock::time_point now) {
  advance(now);
  limit_ = total_;
}

void MemoryLedger::use(size_t model, std::uint64_t bytes, Clock::time_point now) {
  if (model >= used_.size()) return;
  advance(now);
  sum_ = sum_ - used_[model] + bytes;
  used_[model] = bytes;
  u_.peak_bytes = std::max(u_.peak_bytes, sum_);
}

MemoryUse MemoryLedger::totals(Clock::time_point now) const {
  MemoryLedger copy = *this;
  copy.advance(now);
  return copy.u_;
}

}  // namespace runtime_detail
}  // namespace swapnet
