// The emulated disk (SWAPNET_EMULATE_READ, ReaderOptions::emulate_bytes_per_s): one per process,
// serving reads at one rate, for benchmarks that must not get a throttle's burst after idling.
#include "emulated_disk.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "swapnet/swapcore.h"

namespace swapnet {

// Note [An emulated disk]
// ~~~~~~~~~~~~~~~~~~~~~~~
// bench/throttle.sh's blkio throttle grants a slice of bytes at once after a group idled, so a
// pipeline that leaves the disk idle gets part of that time back as a burst: the throttled
// disk read 440-620 MB/s while busy at a 400 MB/s setting, and hid idle gaps a real disk would
// charge for. ReaderOptions::emulate_bytes_per_s models a disk of one rate instead: one per
// process (shared by its readers), serving each request's bytes after those before it (from
// the time the read was submitted), holding the completion until then. Nothing accrues while it
// idles.
namespace {
std::mutex g_emulated_mu;
std::chrono::steady_clock::time_point g_emulated_free;  // when the emulated disk is next idle
}  // namespace

namespace detail {

std::chrono::steady_clock::time_point emulated_disk_serves(std::chrono::steady_clock::time_point queued,
                                                           std::uint64_t bytes, double rate, double credit) {
  std::lock_guard<std::mutex> lk(g_emulated_mu);
  const auto start = std::max(g_emulated_free, queued - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                 std::chrono::duration<double>(credit)));
  g_emulated_free = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(static_cast<double>(bytes) / rate));
  return g_emulated_free;
}

double emulated_rate_from_env() {
  const char* e = std::getenv("SWAPNET_EMULATE_READ");
  if (e == nullptr || *e == '\0') return 0;
  char* end = nullptr;
  double v = std::strtod(e, &end);
  std::string unit(end ? end : "");
  if (unit.size() >= 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) unit.resize(unit.size() - 2);
  const std::pair<const char*, double> units[] = {{"", 1},      {"B", 1},          {"KB", 1e3},  {"MB", 1e6},
                                                  {"GB", 1e9},  {"KiB", 1024.0},   {"MiB", 1048576.0},
                                                  {"GiB", 1073741824.0}};
  for (const auto& [u, f] : units) {
    if (unit == u && v > 0) return v * f;
  }
  log_once(LogLevel::kWarn, "emulated_disk_env",
           std::string("SWAPNET_EMULATE_READ='") + e + "' is not a rate (e.g. 400MB/s or bytes per second): no disk emulated");
  return 0;
}

}  // namespace detail

double emulated_read_bytes_per_s() { return detail::emulated_rate_from_env(); }

void emulated_read_wait(std::chrono::steady_clock::time_point queued, std::uint64_t bytes) {
  static const double rate = detail::emulated_rate_from_env();
  if (rate <= 0 || bytes == 0) return;
  std::this_thread::sleep_until(detail::emulated_disk_serves(queued, bytes, rate));
}

}  // namespace swapnet
