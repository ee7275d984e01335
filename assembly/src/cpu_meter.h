// The CPU meter's internals the executor uses: per-account limits and the calling thread's
// account. The public side (accounts, stats, the activation cache) is in swapnet/assembly.h.
#pragma once

#include <cstdint>

namespace swapnet {
namespace detail {

// The limit of an account (0: none) and whether it refused an allocation since it was set.
void set_cpu_account_limit(int account, std::uint64_t limit);
bool cpu_account_refused(int account);
int thread_cpu_account();

// Charges the calling thread's allocations to `account` while in scope (0: leaves it as is).
class AccountScope {
 public:
  explicit AccountScope(int account);
  ~AccountScope();
  AccountScope(const AccountScope&) = delete;
  AccountScope& operator=(const AccountScope&) = delete;

 private:
  bool on_;
  int before_;
};

}  // namespace detail
}  // namespace swapnet
