// swapnet/swapcore.h — the bottom of swapnet: errors, the one logger, and (issue #3) block I/O.
//
// swapcore knows nothing of torch. Every other module depends on it, never the reverse.
//
// Policies:
//  - Errors carry their context in the message ("FILE: what failed: value vs limit"); the
//    torch-facing modules throw swapnet::Error, swapcore's I/O paths will return status values.
//  - The library never writes to stdout. It logs through swapnet::log(), which is silent unless
//    the application raises the level (set_log_level) or SWAPNET_LOG is set
//    (off|error|warn|info|debug), read once at first use.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(SWAPNET_BUILDING)
#define SWAPNET_API __attribute__((visibility("default")))
#else
#define SWAPNET_API
#endif

namespace swapnet {

// The one exception type of the torch-facing API. what() is a complete, user-facing sentence
// that names the file, the value and the limit involved.
class SWAPNET_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// ---- logging ------------------------------------------------------------------------------

enum class LogLevel : int { kOff = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

// Receives every message at or above the current level. The default sink writes
// "swapnet: <level>: <message>" to stderr.
using LogSink = std::function<void(LogLevel, std::string_view)>;

SWAPNET_API void set_log_level(LogLevel level);
SWAPNET_API LogLevel log_level();
SWAPNET_API void set_log_sink(LogSink sink);  // nullptr restores the default sink
SWAPNET_API void log(LogLevel level, std::string_view message);
// Logs `message` at `level` only the first time `key` is seen in this process (fallbacks and
// advisory failures are said once, not per call).
SWAPNET_API void log_once(LogLevel level, std::string_view key, std::string_view message);
// Parses "off|error|warn|info|debug" (case-sensitive); throws Error naming the accepted values.
SWAPNET_API LogLevel parse_log_level(std::string_view text);

// ---- sizes --------------------------------------------------------------------------------

// Parses a byte count: "1048576", "512KiB", "600MiB", "1.5GiB", "2GB" (KB/MB/GB are powers of
// 1000, KiB/MiB/GiB of 1024; "K"/"M"/"G" alone mean KiB/MiB/GiB). Throws Error naming the text.
SWAPNET_API std::uint64_t parse_size(std::string_view text);
// "178.6 MB (170.3 MiB)"-style human text for a byte count; exact bytes are in JSON output.
SWAPNET_API std::string format_bytes(std::uint64_t bytes);

}  // namespace swapnet
