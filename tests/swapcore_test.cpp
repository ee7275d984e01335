// Tests of swapnet/swapcore.h: sizes, the logger, the tracer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace {

TEST(ParseSize, AcceptsBytesAndUnits) {
  EXPECT_EQ(parse_size("1048576"), 1048576u);
  EXPECT_EQ(parse_size("512KiB"), 512u * 1024);
  EXPECT_EQ(parse_size("600MiB"), 600ull << 20);
  EXPECT_EQ(parse_size("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_size("2GB"), 2000000000ull);
  EXPECT_EQ(parse_size("64M"), 64ull << 20);
  EXPECT_EQ(parse_size("10 MB"), 10000000ull);
}

TEST(ParseSize, RejectsGarbageNamingTheText) {
  for (const char* bad : {"", "MiB", "12XB", "1.2.3MiB", "0.5", "-3MiB", "1e30GiB"}) {
    try {
      parse_size(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(FormatBytes, PicksAUnit) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(178618848), "170.3 MiB");
}

TEST(Log, LevelsSinkAndOnce) {
  std::vector<std::string> seen;
  set_log_sink([&](LogLevel, std::string_view m) { seen.emplace_back(m); });
  set_log_level(LogLevel::kWarn);
  log(LogLevel::kInfo, "hidden");
  log(LogLevel::kWarn, "shown");
  log_once(LogLevel::kWarn, "key", "once");
  log_once(LogLevel::kWarn, "key", "once again");
  set_log_level(LogLevel::kOff);
  log(LogLevel::kError, "silenced");
  set_log_sink(nullptr);
  EXPECT_EQ(seen, (std::vector<std::string>{"shown", "once"}));
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_THROW(parse_log_level("loud"), Error);
}

// Note [Tracing]: spans, instants and counters come back as the Chrome trace format has them
// (reads as async begin/end pairs, the others as complete events), named by name and number, in
// the group they were given; past its buffer events are dropped and counted; off, nothing is
// recorded; a file that cannot be written is an error naming it.
TEST(Trace, WritesAChromeTraceAndCountsWhatItDropped) {
  const std::string path = "/tmp/swapnet_trace_test_" + std::to_string(::getpid()) + ".json";
  const std::uint32_t g = trace_group("model \"a\".swapnet");
  trace_span(g, TraceLane::kCompute, "layer", 1, TraceClock::now(), TraceClock::now());  // off: not recorded
  EXPECT_FALSE(tracing());
  trace_start(5);
  EXPECT_TRUE(tracing());
  const auto t0 = TraceClock::now();
  const auto t1 = t0 + std::chrono::milliseconds(2);
  trace_span(g, TraceLane::kCompute, "layer", 7, t0, t1, "block", 3);
  trace_span(g, TraceLane::kReads, "read", 4, t0, t1, "bytes", 4096);
  trace_span(g, TraceLane::kReads, "read", 5, t0, t1, "bytes", 8192);  // overlaps the one before
  trace_instant(g, TraceLane::kCursor, "held: no room", 9);
  trace_counter(g, "weights held", 12345);
  trace_span(g, TraceLane::kCompute, "never begun", -1, TraceClock::time_point{}, t1);  // no begin: not recorded
  trace_span(g, TraceLane::kDisk, "busy", -1, t0, t1);  // past the buffer
  trace_span(g, TraceLane::kDisk, "busy", -1, t0, t1);
  ASSERT_TRUE(trace_write(path).ok());
  EXPECT_FALSE(tracing());
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["otherData"]["dropped_events"], 2);
  std::map<std::string, int> seen;
  std::string group_name;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M") {
      if (e["name"] == "process_name" && e["pid"] == g) group_name = e["args"]["name"];
      continue;
    }
    EXPECT_EQ(e["pid"], g) << e.dump();
    seen[ph + " " + e["name"].get<std::string>()]++;
    if (ph == "X") {
      EXPECT_EQ(e["args"]["block"], 3);
      EXPECT_NEAR(e["dur"].get<double>(), 2000.0, 1.0);  // microseconds
    }
    if (ph != "M") EXPECT_GE(e["ts"].get<double>(), 0.0) << "nothing before the trace began";
    if (ph == "C") EXPECT_EQ(e["args"]["value"], 12345);
  }
  EXPECT_EQ(group_name, "model \"a\".swapnet");
  EXPECT_EQ(seen, (std::map<std::string, int>{{"X layer 7", 1}, {"b read 4", 1}, {"e read 4", 1}, {"b read 5", 1},
                                              {"e read 5", 1}, {"i held: no room 9", 1}, {"C weights held", 1}}));
  std::remove(path.c_str());
  // A span begun before trace_start (a read issued before it) starts at the trace's origin.
  const auto before = TraceClock::now();
  trace_start(4);
  trace_span(g, TraceLane::kReads, "read", 1, before - std::chrono::seconds(5), TraceClock::now(), "bytes", 4096);
  ASSERT_TRUE(trace_write(path).ok());
  std::ifstream in2(path);
  const nlohmann::json j2 = nlohmann::json::parse(in2);
  for (const auto& e : j2["traceEvents"]) {
    if (e["ph"] == "b") EXPECT_EQ(e["ts"].get<double>(), 0.0) << e.dump();
  }
  std::remove(path.c_str());
  trace_start(4);
  const Status bad = trace_write("/nonexistent-dir/trace.json");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("/nonexistent-dir/trace.json"), std::string::npos) << bad.message();
  EXPECT_FALSE(tracing());
}

}  // namespace
}  // namespace swapnet
