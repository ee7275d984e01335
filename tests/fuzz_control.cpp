// libFuzzer target for the control socket (issue 18): any mix of clients -- connecting, sending
// garbage, half lines, oversized lines, several commands at once, stalling, hanging up -- must
// neither crash the server nor delay the next client. Each input is a script of client actions
// against one ControlServer (kept across inputs, as a serve keeps it for months) with a fake
// runtime; after it, a fresh client's `budget` line must be answered, correctly, within 1 s
// (the tests' bound for a loaded machine under ASan; serve.small checks 50 ms with stalled clients).
//
// Script bytes: op = byte % 6, then its arguments:
//   0 connect a client (at most 8 open)      1 N I BYTES..: client I sends the next N bytes
//   2 I: client I hangs up                    3 I: client I sends "\n"
//   4 I: client I shuts down its writing side 5 I K: client I sends a known command K % 4
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "swapnet/scheduler.h"

namespace {

class FakeTarget : public swapnet::BudgetTarget {
 public:
  void set_budget(std::uint64_t total) override {
    if (total < 4096) throw swapnet::Error("total budget " + std::to_string(total) + " bytes is below the minimum 4096");
    total_ = total;
  }
  std::uint64_t total_budget() const override { return total_; }
  std::string status_json() const override {
    return "{\"total_budget_bytes\":" + std::to_string(total_) + ",\"models\":[]}";
  }

 private:
  std::atomic<std::uint64_t> total_{1 << 20};  // set on the server's thread
};

struct Server {
  FakeTarget target;
  std::string dir, path;
  std::unique_ptr<swapnet::ControlServer> server;
  Server() {
    char tmpl[] = "/tmp/swapnet-fuzz-control-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    dir = tmpl;
    path = dir + "/ctl.sock";
    swapnet::set_log_level(swapnet::LogLevel::kOff);
    server = std::make_unique<swapnet::ControlServer>(&target, path);
  }
  ~Server() {
    server.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

int connect_to(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_some(int fd, const void* p, std::size_t n) {
  if (fd >= 0 && n > 0) (void)::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Server* s = new Server();  // one server for the whole run, as in a serve
  // Its directory goes at exit (the server itself is left running to the end, as in a serve).
  static const struct RemoveAtExit {
    std::string dir;
    ~RemoveAtExit() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove_at_exit{s->dir};
  static const char* known[] = {"status\n", "budget 64 MiB\n", "budget 0\n", "budget\n"};
  std::vector<int> clients;
  std::size_t i = 0;
  auto next = [&]() -> int { return i < size ? data[i++] : -1; };
  auto pick = [&]() -> int {
    const int b = next();
    return clients.empty() || b < 0 ? -1 : clients[static_cast<std::size_t>(b) % clients.size()];
  };
  while (i < size) {
    switch (next() % 6) {
      case 0:
        if (clients.size() < 8) clients.push_back(connect_to(s->path));
        break;
      case 1: {
        const int n = next();
        const int fd = pick();
        const std::size_t len = n < 0 ? 0 : std::min<std::size_t>(static_cast<std::size_t>(n) * 32, size - i);
        send_some(fd, data + i, len);
        i += len;
        break;
      }
      case 2: {
        const int fd = pick();
        for (auto& c : clients) {
          if (c == fd && fd >= 0) {
            ::close(c);
            c = -1;
          }
        }
        break;
      }
      case 3: send_some(pick(), "\n", 1); break;
      case 4: {
        const int fd = pick();
        if (fd >= 0) ::shutdown(fd, SHUT_WR);
        break;
      }
      case 5: {
        const int fd = pick();
        const int k = next();
        const char* cmd = known[(k < 0 ? 0 : k) % 4];
        send_some(fd, cmd, std::strlen(cmd));
        break;
      }
    }
  }
  // The clients above may be stalled mid-line: a new one is answered at once all the same.
  const std::uint64_t want = 4096 + size;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string answer = swapnet::control_request(s->path, "budget " + std::to_string(want));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (answer != "ok " + std::to_string(want) || s->target.total_budget() != want) {
    std::fprintf(stderr, "fuzz_control: 'budget %llu' answered '%s'\n", static_cast<unsigned long long>(want),
                 answer.c_str());
    __builtin_trap();
  }
  if (ms > 1000) {
    std::fprintf(stderr, "fuzz_control: 'budget' answered after %.0f ms\n", ms);
    __builtin_trap();
  }
  for (int c : clients) {
    if (c >= 0) ::close(c);
  }
  return 0;
}
