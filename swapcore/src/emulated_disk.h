// Internal to swapcore/: the emulated disk block readers pace their reads by (Note [An emulated
// disk] in emulated_disk.cpp), one per process.
#pragma once

#include <chrono>
#include <cstdint>

namespace swapnet {
namespace detail {

// A read of `bytes` queued at `queued` is served when this returns. With `credit` seconds, the
// disk also serves at once what it could have in the time it idled before, up to that long: a
// token bucket, as blkio's throttle slice (ReaderOptions::emulate_idle_credit_s).
std::chrono::steady_clock::time_point emulated_disk_serves(std::chrono::steady_clock::time_point queued,
                                                           std::uint64_t bytes, double rate, double credit = 0);
// $SWAPNET_EMULATE_READ: bytes per second, or a rate such as 400MB/s, 2GB/s, 1.5GiB/s; 0 when
// unset or unreadable (said once).
double emulated_rate_from_env();

}  // namespace detail
}  // namespace swapnet
