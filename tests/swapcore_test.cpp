// Tests of swapnet/swapcore.h: sizes, the logger.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace swapnet
