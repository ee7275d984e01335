// swapnet — the command a user types. It answers `swapnet ctl` itself (cli/ctl.cpp), without
// loading libtorch (a control line to a running serve in milliseconds: the budget cut may be the
// kernel's last warning before the OOM killer), and `swapnet check IMAGE [--json]` too
// (cli/check_cmd.cpp: an image's checksums need no libtorch), and executes the full command-line tool
// (swapnet-cli, which links libtorch: ~0.9 s to start) for every other command, with the same
// arguments.
//
// The full tool is looked for beside this executable (a build tree), then at
// SWAPNET_CLI_FROM_BINDIR relative to it (an install: ../libexec/swapnet/swapnet-cli).
//
// Note [OpenBLAS's idle spin]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Debian's libtorch runs GEMMs (fully connected layers, some convolutions) on openblas-pthread,
// whose worker threads, after each GEMM, poll for the next one calling sched_yield() for 2^28
// cycles (~0.1 s) before they sleep. Beside libtorch's OpenMP threads that is one thread more
// than cores, and the poll is not free: measured with perf on vgg19 at 429 MiB (emulated
// 400 MB/s disk), inferences whose first layers ran while the worker still polled after the
// last inference's fully connected layers spent 57-80 ms of system time in sched_yield during
// layers 0-4, which took 94-130 ms instead of 46-48 (the inference 640-690 ms instead of
// 570-600, in about a third of the inferences). With OPENBLAS_THREAD_TIMEOUT=4 (2^4 cycles:
// the worker sleeps at once and is woken for the next GEMM) 0 of 24 inferences were slow
// against 6 of 24 (3 interleaved rounds), and direct inference of resnet101 lost its 160-210 ms
// outliers (max 88-98 ms against 179-213, medians alike). OpenBLAS reads the variable once,
// when it is loaded, so the command sets it here, before libtorch is: only where the user set
// neither it nor GOTO_THREAD_TIMEOUT. A library cannot do this for the program it is loaded into
// (docs/executor.md says how).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check_cmd.h"
#include "ctl.h"

#ifndef SWAPNET_CLI_FROM_BINDIR
#define SWAPNET_CLI_FROM_BINDIR "../libexec/swapnet/swapnet-cli"
#endif

namespace {

std::string self_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// `swapnet check IMAGE [--json]`, answered here (cli/check_cmd.cpp: no libtorch, milliseconds);
// any other option goes to the full tool. -1: not this form.
int quick_check(int argc, char** argv) {
  if (argc < 3 || argc > 4 || std::strcmp(argv[1], "check") != 0) return -1;
  const char* image = nullptr;
  bool json = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (argv[i][0] != '-' && image == nullptr) {
      image = argv[i];
    } else {
      return -1;
    }
  }
  return image == nullptr ? -1 : swapnet::cli::check_image_command(image, json);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "ctl") == 0) return swapnet::cli::ctl_main(argc, argv);
  const int checked = quick_check(argc, argv);
  if (checked >= 0) return checked;
  const std::string dir = self_dir();
  // Note [OpenBLAS's idle spin]; overwrite 0: a value the user set stays.
  if (std::getenv("GOTO_THREAD_TIMEOUT") == nullptr) ::setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
  const std::vector<std::string> candidates = {dir + "/swapnet-cli", dir + "/" + SWAPNET_CLI_FROM_BINDIR};
  for (const auto& c : candidates) {
    if (::access(c.c_str(), X_OK) == 0) {
      ::execv(c.c_str(), argv);  // argv[0] stays: usage and errors say "swapnet"
      std::fprintf(stderr, "swapnet: error: cannot execute %s: %s\n", c.c_str(), std::strerror(errno));
      return 2;
    }
  }
  std::fprintf(stderr, "swapnet: error: the full command-line tool is not installed: looked for %s and %s\n",
               candidates[0].c_str(), candidates[1].c_str());
  return 2;
}
