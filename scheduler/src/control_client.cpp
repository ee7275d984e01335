// The control socket's client side and wire (control_wire.h): plain POSIX, no libtorch, so that
// the `swapnet` launcher (cli/launcher.cpp) can send `swapnet ctl` lines without loading it.
#include "control_wire.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace swapnet {

std::string default_control_path() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg) return std::string(xdg) + "/swapnet/serve.sock";
  return "/tmp/swapnet-" + std::to_string(::getuid()) + "/serve.sock";
}

namespace wire {

sockaddr_un socket_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    throw Error(path + ": socket path is " + std::to_string(path.size()) + " bytes; the limit is " +
                std::to_string(sizeof a.sun_path - 1));
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

std::string read_line(int fd) {
  std::string line;
  char c;
  while (line.size() < 4096) {
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    line.push_back(c);
  }
  return line;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);  // a gone peer: no SIGPIPE
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace wire

std::string control_request(const std::string& path, const std::string& line) {
  const sockaddr_un addr = wire::socket_address(path);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(path + ": socket: " + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw Error(path + ": no swapnet serve answers there (" + why + ")");
  }
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  wire::write_all(fd, line + "\n");
  std::string answer = wire::read_line(fd);
  ::close(fd);
  if (answer.empty()) throw Error(path + ": no answer");
  return answer;
}

}  // namespace swapnet
