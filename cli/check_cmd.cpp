#include "check_cmd.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

int check_image_command(const std::string& image, bool as_json) {
  ImageInfo info;
  const Status read = read_image_info(image, &info);
  if (!read.ok()) {
    std::fprintf(stderr, "swapnet: error: %s\n", read.message().c_str());
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = check_image(image, info);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (as_json) {
    nlohmann::json j = {{"image", image}, {"ok", s.ok()}, {"layers", info.layers.size()}, {"check_ms", ms}};
    if (!s.ok()) j["error"] = s.message();
    std::cout << j.dump() << "\n";
  } else if (s.ok()) {
    std::printf("%s: ok, %zu layer checksums verified (%s in %.0f ms)\n", image.c_str(), info.layers.size(),
                format_bytes(info.data_size).c_str(), ms);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "swapnet: error: %s\n", s.message().c_str());
    return s.code() == -1 ? 1 : 2;  // a checksum verdict vs an I/O error
  }
  return 0;
}

}  // namespace cli
}  // namespace swapnet
