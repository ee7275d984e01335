// Where budget changes come from besides the API (scheduler.h): a polled budget source and a
// control socket. Plain POSIX; the Runtime does the rest.
#include <nlohmann/json.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "swapnet/scheduler.h"
#include "control_wire.h"

namespace swapnet {

// ---- budget sources ---------------------------------------------------------------------------

BudgetSource::BudgetSource(const std::string& spec) : spec_(spec) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) {
    throw Error("budget source '" + spec + "': expected file:PATH, meminfo:RESERVE or cgroup:PATH");
  }
  kind_ = spec.substr(0, colon);
  path_ = spec.substr(colon + 1);
  if (kind_ == "meminfo") {
    reserve_ = path_.empty() ? 0 : parse_size(path_);
    path_ = "/proc/meminfo";
  } else if (kind_ == "cgroup") {
    struct stat sb;
    if (::stat(path_.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) path_ += "/memory.limit_in_bytes";
  } else if (kind_ != "file") {
    throw Error("budget source '" + spec + "': '" + kind_ + "' is not one of file, meminfo, cgroup");
  }
  if (path_.empty()) throw Error("budget source '" + spec + "': no path");
}

std::uint64_t BudgetSource::read() const {
  std::ifstream f(path_);
  if (!f) throw Error(path_ + ": cannot read: " + std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  if (kind_ == "meminfo") {
    const auto at = text.find("MemAvailable:");
    if (at == std::string::npos) throw Error(path_ + ": no MemAvailable line");
    std::istringstream line(text.substr(at + 13));
    std::uint64_t kib = 0;
    if (!(line >> kib)) throw Error(path_ + ": MemAvailable is not a number");
    const std::uint64_t avail = kib * 1024;
    return avail > reserve_ ? avail - reserve_ : 0;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  while (!text.empty() && (text.front() == ' ' || text.front() == '\n')) text.erase(text.begin());
  try {
    return parse_size(text);
  } catch (const std::exception& e) {
    throw Error(path_ + ": '" + text.substr(0, 40) + "' is not a size: " + e.what());
  }
}

struct BudgetWatcher::Impl {
  BudgetTarget* rt;
  BudgetSource src;
  std::chrono::milliseconds period;
  std::uint64_t hysteresis;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread t;
  Impl(BudgetTarget* r, BudgetSource s, std::chrono::milliseconds p, std::uint64_t h)
      : rt(r), src(std::move(s)), period(p), hysteresis(h) {}
  void loop() {
    std::uint64_t last = rt->total_budget();
    std::string last_error;
    std::unique_lock<std::mutex> lk(mu);
    while (!cv.wait_for(lk, period, [&] { return stop; })) {
      try {
        // meminfo: the target's own budgets are memory it may use
        const std::uint64_t held = src.spec().rfind("meminfo:", 0) == 0 ? rt->held_bytes() : 0;
        const std::uint64_t now = src.read() + held;
        last_error.clear();
        const std::uint64_t diff = now > last ? now - last : last - now;
        if (diff > hysteresis) {
          log(LogLevel::kInfo, src.spec() + ": budget " + format_bytes(last) + " -> " + format_bytes(now));
          rt->set_budget(now);
          last = now;
        }
      } catch (const std::exception& e) {
        if (e.what() != last_error) log(LogLevel::kWarn, std::string("budget source: ") + e.what());
        last_error = e.what();
      }
    }
  }
};

BudgetWatcher::BudgetWatcher(BudgetTarget* runtime, BudgetSource source, std::chrono::milliseconds period,
                             std::uint64_t hysteresis)
    : impl_(std::make_unique<Impl>(runtime, std::move(source), period, hysteresis)) {
  impl_->t = std::thread([this] { impl_->loop(); });
}

BudgetWatcher::~BudgetWatcher() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->t.join();
}

// ---- control socket ---------------------------------------------------------------------------


struct ControlServer::Impl {
  BudgetTarget* rt;
  std::string path;
  int fd = -1;
  int wake[2] = {-1, -1};
  std::thread t;

  std::string answer(const std::string& line) {
    std::istringstream in(line);
    std::string cmd, arg;
    in >> cmd;
    std::getline(in >> std::ws, arg);  // "600 MiB" is one size
    try {
      if (cmd == "budget") {
        if (arg.empty()) return "error: budget needs a size, e.g. 'budget 600MiB'";
        const std::uint64_t bytes = parse_size(arg);
        rt->set_budget(bytes);
        return "ok " + std::to_string(bytes);
      }
      if (cmd == "status") return rt->status_json();
      return "error: unknown command '" + cmd + "' (budget SIZE | status)";
    } catch (const std::exception& e) {
      return std::string("error: ") + e.what();
    }
  }
  // Note [Control clients]
  // ~~~~~~~~~~~~~~~~~~~~~~~
  // A budget cut may be the kernel's last warning before the OOM killer, so no client may delay
  // another: the socket and every client are polled together, non-blocking; a client's bytes
  // are gathered until its line ends, and answered then. A client that has not sent its line
  // within kClientDeadline, sends more than kMaxLine bytes without one, or is the oldest when
  // kMaxClients are connected is closed (with an error line where it sent something). One
  // blocking read per client with a 2 s timeout used to delay every later client by 2 s per
  // stalled one.
  static constexpr auto kClientDeadline = std::chrono::seconds(2);
  static constexpr size_t kMaxLine = 4096;
  static constexpr size_t kMaxClients = 64;
  struct Client {
    int fd;
    std::string line;
    std::chrono::steady_clock::time_point deadline;
  };
  // Answers and closes a client with its line (empty: a probe, or gone: closed silently). Bytes
  // it sent that were not read (a line over kMaxLine) are read and dropped first, up to 64 KiB:
  // a socket closed with unread input resets the peer, which then loses the answer.
  void finish(Client& c, const std::string& reply) {
    if (!reply.empty()) wire::write_all(c.fd, reply + "\n");
    ::shutdown(c.fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 16; ++i) {
      const ssize_t n = ::recv(c.fd, sink, sizeof sink, MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    ::close(c.fd);
    c.fd = -1;
  }
  void loop() {
    std::vector<Client> clients;
    while (true) {
      std::vector<pollfd> p = {{fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      for (const auto& c : clients) p.push_back({c.fd, POLLIN, 0});
      const auto now = std::chrono::steady_clock::now();
      int timeout = -1;
      for (const auto& c : clients) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
        timeout = timeout < 0 ? static_cast<int>(std::max<long long>(left, 0))
                              : std::min(timeout, static_cast<int>(std::max<long long>(left, 0)));
      }
      if (::poll(p.data(), p.size(), timeout) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (p[1].revents) break;
      for (size_t i = 0; i < clients.size(); ++i) {
        Client& c = clients[i];
        if (!(p[2 + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[512];
        ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) {  // gone; a line without its newline still counts
          finish(c, c.line.empty() ? std::string() : answer_logged(c.line));
          continue;
        }
        const char* end = static_cast<const char*>(std::memchr(buf, '\n', static_cast<size_t>(n)));
        c.line.append(buf, end ? static_cast<size_t>(end - buf) : static_cast<size_t>(n));
        if (c.line.size() > kMaxLine) {
          finish(c, "error: a command is one line of at most " + std::to_string(kMaxLine) + " bytes");
        } else if (end != nullptr) {
          finish(c, c.line.empty() ? std::string() : answer_logged(c.line));
        }
      }
      const auto after = std::chrono::steady_clock::now();
      for (auto& c : clients) {
        if (c.fd >= 0 && after >= c.deadline) {
          finish(c, c.line.empty() ? std::string() : "error: no end of line within 2 s");
        }
      }
      clients.erase(std::remove_if(clients.begin(), clients.end(), [](const Client& c) { return c.fd < 0; }),
                    clients.end());
      if (p[0].revents & POLLIN) {
        // Every connection waiting, so that a burst of them costs one wake-up.
        while (true) {
          int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (c < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {  // e.g. EMFILE: do not spin
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
            break;
          }
          if (clients.size() >= kMaxClients) {
            finish(clients.front(), "error: too many control clients; the oldest goes");
            clients.erase(clients.begin());
          }
          clients.push_back({c, std::string(), std::chrono::steady_clock::now() + kClientDeadline});
        }
      }
    }
    for (auto& c : clients) ::close(c.fd);
  }
  std::string answer_logged(const std::string& line) {
    log(LogLevel::kInfo, path + ": control: " + line.substr(0, 200));
    return answer(line);
  }
};

ControlServer::ControlServer(BudgetTarget* runtime, const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rt = runtime;
  m.path = path;
  const sockaddr_un addr = wire::socket_address(path);
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      throw Error(dir + ": cannot create the control socket's directory: " + std::strerror(errno));
    }
    // One we did not make must still be ours and closed to others (else someone could put
    // their own socket in our place).
    // (A sticky directory such as /tmp is fine: others cannot remove what is ours there.)
    struct stat ds;
    const bool ok = ::stat(dir.c_str(), &ds) == 0 && S_ISDIR(ds.st_mode) &&
                    ((ds.st_mode & S_ISVTX) || (ds.st_uid == ::getuid() && (ds.st_mode & 022) == 0));
    if (!ok) {
      throw Error(dir + ": the control socket's directory must be owned by this user and not writable by others "
                        "(or sticky, like /tmp)");
    }
  }
  // A socket file left by a server that died: remove it if nobody answers there. Anything else
  // at that path is not ours to remove.
  struct stat ss;
  if (::lstat(path.c_str(), &ss) == 0) {
    if (!S_ISSOCK(ss.st_mode)) throw Error(path + ": exists and is not a socket; give --socket another path");
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = probe >= 0 && ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) ::close(probe);
    if (live) throw Error(path + ": another swapnet serve is listening there");
    ::unlink(path.c_str());
  }
  m.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (m.fd < 0) throw Error(path + ": socket: " + std::strerror(errno));
  const mode_t old = ::umask(0177);  // the socket is created owner-only (0600)
  const int rc = ::bind(m.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  const int err = errno;
  ::umask(old);
  if (rc != 0 || ::chmod(path.c_str(), 0600) != 0 || ::listen(m.fd, SOMAXCONN) != 0) {
    const std::string why = std::strerror(rc != 0 ? err : errno);
    ::close(m.fd);
    throw Error(path + ": cannot listen: " + why);
  }
  if (::pipe2(m.wake, O_CLOEXEC) != 0) {
    ::close(m.fd);
    throw Error(path + ": pipe: " + std::strerror(errno));
  }
  m.t = std::thread([&m] { m.loop(); });
  log(LogLevel::kInfo, path + ": listening for control commands");
}

ControlServer::~ControlServer() {
  Impl& m = *impl_;
  (void)!::write(m.wake[1], "x", 1);
  m.t.join();
  ::close(m.fd);
  ::close(m.wake[0]);
  ::close(m.wake[1]);
  ::unlink(m.path.c_str());
}

const std::string& ControlServer::path() const { return impl_->path; }


}  // namespace swapnet
