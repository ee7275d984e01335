// Byte-count parsing and formatting shared by every CLI flag and config file that takes a size.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "swapnet/swapcore.h"

namespace swapnet {

std::uint64_t parse_size(std::string_view text) {
  auto bad = [&](const char* why) {
    return Error("size '" + std::string(text) + "' " + why +
                 " (expected e.g. 1048576, 512KiB, 600MiB, 1.5GiB, 2GB)");
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) throw bad("does not start with a number");
  std::string number(text.substr(0, i));
  std::string unit(text.substr(i));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else throw bad("has an unknown unit");
  char* end = nullptr;
  double v = std::strtod(number.c_str(), &end);
  if (end == nullptr || *end != '\0' || !std::isfinite(v)) throw bad("is not a number");
  double bytes = std::floor(v * mult);
  if (bytes >= 1.8e19) throw bad("is too large");
  if (unit.empty() && number.find('.') != std::string::npos) throw bad("is a fraction of a byte");
  return static_cast<std::uint64_t>(bytes);
}

std::string format_bytes(std::uint64_t bytes) {
  char buf[64];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < 1024ull * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  } else if (bytes < 1024ull * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  }
  return buf;
}

}  // namespace swapnet
