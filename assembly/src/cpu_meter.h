// The CPU meter's internals the executor uses: per-account limits and the calling thread's
// account. The public side (accounts, stats, the activation cache) is in swapnet/assembly.h.
#pragma once

#include <cstdint>
#include <memory>

namespace swapnet {
namespace detail {

// The limit of an account (0: none) and whether it refused an allocation since it was set.
void set_cpu_account_limit(int account, std::uint64_t limit);
bool cpu_account_refused(int account);
int thread_cpu_account();

// Installs the meter; whether libtorch's CPU allocations go through it (a host program may have
// set an allocator of higher priority: then nothing is placed in zones).
bool cpu_meter_active();
// Note [Lending the activation reserve] (zone_lender.cpp): makes [base, base + bytes), a ring's
// zone, the account's region (the region before retires, as a new cache cap retires it), kept
// mapped by `owner` while chunks live in it. Returns the zone's id (0: no such account).
std::uint64_t set_cpu_account_zone(int account, char* base, std::uint64_t bytes, std::shared_ptr<void> owner);
// A scratch zone for measuring how activations place (measure_activation_bytes, the executor's
// measuring inference): `bytes` of address space only (MAP_NORESERVE: pages are touched where
// chunks land), made the account's region by set_cpu_account_zone and unmapped with its last
// chunk once detached. Returns its id and sets *base (0 and nullptr when it cannot be mapped).
std::uint64_t set_cpu_account_scratch_zone(int account, std::uint64_t bytes, char** base);
// The zone's floors (offsets from its start): chunks are never placed below `floor` (the ring
// lends those bytes) and at or above `prefer` when a hole there fits; `lent`: the bytes the ring
// lends now (for the zone's peak). Nothing when zone `id` is not the account's region.
void set_cpu_zone(int account, std::uint64_t id, std::uint64_t floor, std::uint64_t prefer, std::uint64_t lent);
struct ZoneUse {
  bool attached = false;           // zone `id` is the account's region
  std::uint64_t extent = 0;        // bytes from the lowest live chunk to the zone's end
  std::uint64_t low_extent = 0;    // the most `extent` reached since the last reset
  std::uint64_t misses = 0;        // allocations that did not fit above the floor, since attached
  std::uint64_t peak = 0;          // the most live + lent bytes since the last reset
  std::uint64_t retired_live = 0;  // bytes live in the account's retired regions
  std::uint64_t unzoned = 0;       // the account's bytes outside its zone now (small ones, misses)
  std::uint64_t unzoned_peak = 0;  // the most of those since the last reset
};
// `reset`: low_extent and peak start over from now.
ZoneUse cpu_zone_use(int account, std::uint64_t id, bool reset);
// What a zone's activations reached since the last reset (ZoneUse with `reset`): the lowest
// extent plus the account's bytes outside the zone at their peak, less `unzoned_before` (those
// it held before measuring began).
std::uint64_t zone_reach(const ZoneUse& u, std::uint64_t unzoned_before = 0);
// Gives back the pages of the zone's holes (its ring is going: nothing is lent or read there).
// Nothing when zone `id` is not the account's region.
void cpu_zone_give_back(int account, std::uint64_t id);
// An account an executor took for itself goes back to the pool for new_cpu_account(), when
// nothing is charged to it and it has no region (else it stays taken).
void release_cpu_account(int account);

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
