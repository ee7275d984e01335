// `swapnet ctl [--socket PATH] budget SIZE | status`: the arguments parsed here (no CLI11, no
// libtorch: the launcher answers it in milliseconds), the line sent with control_request, the
// answer printed. swapnet-cli hands `ctl` here too, before its own parsing.
#include "ctl.h"

#include <cstdio>
#include <exception>
#include <string>

#include "control_wire.h"

namespace swapnet {
namespace cli {

namespace {

constexpr const char* kCtlUsage =
    "send a command to a running swapnet serve\n"
    "Usage: swapnet ctl [--socket PATH] budget SIZE | status\n"
    "  --socket PATH  the serve's control socket (default $XDG_RUNTIME_DIR/swapnet/serve.sock or\n"
    "                 /tmp/swapnet-UID/serve.sock)\n";

}  // namespace

int ctl_main(int argc, char** argv) {
  std::string socket, line;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kCtlUsage, stdout);
      return 0;
    }
    if (a == "--socket") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "swapnet: error: ctl: --socket needs a path\n");
        return 2;
      }
      socket = argv[++i];
    } else if (a.rfind("--socket=", 0) == 0) {
      socket = a.substr(9);
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "swapnet: error: ctl: unknown option '%s'\n%s", a.c_str(), kCtlUsage);
      return 2;
    } else {
      line += (line.empty() ? "" : " ") + a;
    }
  }
  if (line.empty()) {
    std::fprintf(stderr, "swapnet: error: ctl: give a command: budget SIZE | status\n");
    return 2;
  }
  try {
    const std::string answer = control_request(socket.empty() ? default_control_path() : socket, line);
    std::printf("%s\n", answer.c_str());
    return answer.rfind("error", 0) == 0 ? 2 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swapnet: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace cli
}  // namespace swapnet
