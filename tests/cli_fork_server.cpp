// The tests' fork server for swapnet-cli: the CLI tests run ~250 commands, and each swapnet-cli
// process spends ~0.75 s of CPU loading libtorch before its command starts.
//
// Note [The CLI's fork server]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `cli_fork_server --fork-server SOCKET` loads libtorch once (it links what swapnet-cli links)
// and listens on a Unix socket. Per connection it reads one request, a JSON line
// {"argv": [...], "env": ["K=V", ...], "cwd": "..."} sent with two file descriptors (the
// command's stdout and stderr), forks a handler (requests from tests running side by side are
// served side by side), which forks the command: swapnet-cli's own command line (cli_main,
// cli/main.cpp) in that environment and directory with stdin on /dev/null, its output flushed
// at the end and static destructors skipped (below). The handler answers the command's status
// ("exit N" or "signal N"), or stops the command (its process group) when the test that asked
// goes away first, as a test's own process is stopped with it. tests/cli_test_util.py's run() uses the server where ctest's fixture
// started it (SWAPNET_TEST_FORK_SERVER names the socket) and runs a process of its own
// otherwise, and always for `ctl` and `check` (the launcher answers those itself), for other
// programs than swapnet, and for an environment that differs in what libraries read when they
// load (OpenBLAS's, OpenMP's, the loader's and malloc's variables: a fork keeps the server's).
// What a fork does not repeat is libtorch's loading, static initialisation and teardown: the
// launcher, process start-up and exit keep their own tests (every test that runs swapnet some
// other way: serve's and ctl's, the preload's, package.*), and SWAPNET_TEST_NO_FORK_SERVER=1
// in ctest's environment runs every command as its own process. Measured (2026-11-27, 2 cores): a command's start and
// end cost 0.37 s through the server with std::exit, 0.04 s with _exit, 0.72 s as a process.
// Forking is safe here because the server starts no thread and runs no tensor operation before
// it forks (OpenBLAS's threads, started when it loads, are shut down around fork() by its own
// pthread_atfork handler and started again when needed). Run any other way (no --fork-server),
// the binary is swapnet-cli: `run --compare` executes /proc/self/exe for its child runs.
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"

namespace {

struct Request {
  std::vector<std::string> argv, env;
  std::string cwd;
  int out = -1, err = -1;
};

// Reads one request (a JSON line and two descriptors) from connection `c`. false: malformed.
bool receive(int c, Request* r) {
  std::string line;
  std::vector<int> fds;
  char buf[65536];
  while (line.find('\n') == std::string::npos) {
    char control[CMSG_SPACE(sizeof(int) * 2)];
    iovec iov{buf, sizeof buf};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(c, &m, 0);
    if (n <= 0) return false;
    for (cmsghdr* h = CMSG_FIRSTHDR(&m); h != nullptr; h = CMSG_NXTHDR(&m, h)) {
      if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
        const size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
          fds.push_back(fd);
        }
      }
    }
    line.append(buf, static_cast<size_t>(n));
  }
  if (fds.size() != 2) return false;
  r->out = fds[0];
  r->err = fds[1];
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.contains("argv") || !j.contains("env") || !j.contains("cwd")) return false;
  r->argv = j["argv"].get<std::vector<std::string>>();
  r->env = j["env"].get<std::vector<std::string>>();
  r->cwd = j["cwd"].get<std::string>();
  return !r->argv.empty();
}

// In the child: the command, as its own swapnet-cli process would run it.
[[noreturn]] void run_command(const Request& r) {
  const int null = ::open("/dev/null", O_RDONLY);
  if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(r.out, 1) < 0 || ::dup2(r.err, 2) < 0) _exit(127);
  ::close(null);
  ::close(r.out);
  ::close(r.err);
  if (::chdir(r.cwd.c_str()) != 0) {
    std::fprintf(stderr, "cli_fork_server: cannot enter %s: %s\n", r.cwd.c_str(), std::strerror(errno));
    _exit(127);
  }
  ::clearenv();
  for (const std::string& kv : r.env) ::putenv(::strdup(kv.c_str()));
  std::vector<char*> argv;
  for (const std::string& a : r.argv) argv.push_back(::strdup(a.c_str()));
  argv.push_back(nullptr);
  const int rc = swapnet::cli::cli_main(static_cast<int>(r.argv.size()), argv.data());
  // Not std::exit: libtorch's static destructors free what the server allocated, and in a fork
  // every page they write is copied first (0.34 s a command, against 0.07 s in a process of its
  // own). What the command wrote is flushed; the commands leave nothing to static destructors.
  std::fflush(nullptr);
  _exit(rc);
}

// Waits for command `pid`; if the test that asked for it goes away first (its connection `c`
// closes: killed at its timeout, say), stops the command and what it started, as a process of
// the test's own would have been stopped. Its wait status.
int wait_or_stop(pid_t pid, int c) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  int status = 0;
  short watch = POLLIN;  // the connection: readable means closed (the test sends nothing more)
  while (pidfd >= 0) {
    pollfd p[2] = {{pidfd, POLLIN, 0}, {c, watch, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[0].revents != 0) break;  // the command ended
    if (p[1].revents == 0) continue;
    char byte;
    const ssize_t n = ::recv(c, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      ::kill(-pid, SIGKILL);
      break;
    }
    if (n > 0) watch = 0;  // unexpected bytes: stop watching rather than spin
  }
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (pidfd >= 0) ::close(pidfd);
  return status;
}

// Connection `c`, in a process of its own: the request, the command's child, its status.
[[noreturn]] void handle(int c) {
  Request r;
  std::string answer = "error malformed request\n";
  if (receive(c, &r)) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // its own group, so that it and what it started can be stopped together
      ::close(c);
      run_command(r);
    }
    int status = 0;
    if (pid > 0) status = wait_or_stop(pid, c);
    if (pid < 0) {
      answer = std::string("error fork: ") + std::strerror(errno) + "\n";
    } else if (WIFSIGNALED(status)) {
      answer = "signal " + std::to_string(WTERMSIG(status)) + "\n";
    } else {
      answer = "exit " + std::to_string(WEXITSTATUS(status)) + "\n";
    }
  }
  (void)!::write(c, answer.data(), answer.size());
  _exit(0);
}

// Serves until `idle_s` seconds pass without a request (a test run that died without stopping
// it leaves no server behind for long).
int serve(const char* path, int idle_s) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (s < 0 || std::strlen(path) >= sizeof a.sun_path) return 2;
  std::strcpy(a.sun_path, path);
  ::unlink(path);
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 16) != 0) {
    std::fprintf(stderr, "cli_fork_server: cannot listen on %s: %s\n", path, std::strerror(errno));
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGCHLD, SIG_IGN);  // the handlers reap themselves
  while (true) {
    pollfd p{s, POLLIN, 0};
    const int ready = ::poll(&p, 1, idle_s * 1000);
    if (ready == 0) break;
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const int c = ::accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    std::fflush(nullptr);
    const pid_t h = ::fork();  // requests from tests running side by side are served side by side
    if (h == 0) {
      ::close(s);
      std::signal(SIGCHLD, SIG_DFL);  // the handler waits for its command
      handle(c);
    }
    ::close(c);
  }
  ::unlink(path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--fork-server") == 0) return serve(argv[2], std::atoi(argv[3]));
  return swapnet::cli::cli_main(argc, argv);
}
