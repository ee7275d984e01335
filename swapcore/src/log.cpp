// The one logger: level read once from SWAPNET_LOG, silent by default, stderr sink by default.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace {

struct LoggerState {
  std::mutex mu;
  LogSink sink;  // empty: default stderr sink
  std::set<std::string, std::less<>> said_once;
};

LoggerState& state() {
  static LoggerState* s = new LoggerState();  // never destroyed: usable from static destructors
  return *s;
}

LogLevel initial_level() {
  const char* env = std::getenv("SWAPNET_LOG");
  if (env == nullptr || *env == '\0') return LogLevel::kOff;
  try {
    return parse_log_level(env);
  } catch (const Error&) {
    std::fprintf(stderr, "swapnet: warn: SWAPNET_LOG=%s is not one of off|error|warn|info|debug; using warn\n", env);
    return LogLevel::kWarn;
  }
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
    default: return "off";
  }
}

}  // namespace

void set_log_level(LogLevel level) { level_ref().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_ref().load()); }

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().sink = std::move(sink);
}

void log(LogLevel level, std::string_view message) {
  if (level == LogLevel::kOff || static_cast<int>(level) > level_ref().load()) return;
  std::lock_guard<std::mutex> lock(state().mu);
  if (state().sink) {
    state().sink(level, message);
  } else {
    std::fprintf(stderr, "swapnet: %s: %.*s\n", level_name(level), static_cast<int>(message.size()),
                 message.data());
  }
}

void log_once(LogLevel level, std::string_view key, std::string_view message) {
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (!state().said_once.emplace(key).second) return;
  }
  log(level, message);
}

LogLevel parse_log_level(std::string_view t) {
  if (t == "off") return LogLevel::kOff;
  if (t == "error") return LogLevel::kError;
  if (t == "warn") return LogLevel::kWarn;
  if (t == "info") return LogLevel::kInfo;
  if (t == "debug") return LogLevel::kDebug;
  throw Error("log level '" + std::string(t) + "' is not one of off|error|warn|info|debug");
}

}  // namespace swapnet
