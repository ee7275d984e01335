// Transparent swapping's swap images (Note [Transparent swapping] in preload/src/jit_load.cpp;
// transparent.cpp says where they are found or made): the notices, the paths, the content key,
// the swapnet CLI run in a child process, and SWAPNET_BUDGET's text.
#include "transparent_image.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "swapnet/swapcore.h"

extern char** environ;

namespace swapnet {
namespace transparent {

// Through the one logger, once per key. Transparent swapping is asked for by the environment,
// so its notices are on (warn) unless SWAPNET_LOG says otherwise: "said once on stderr".
void notices_on() {
  static std::once_flag level;
  std::call_once(level, [] {
    if (std::getenv("SWAPNET_LOG") == nullptr) set_log_level(LogLevel::kWarn);
  });
}
void say(const std::string& key, const std::string& message) {
  notices_on();
  log_once(LogLevel::kWarn, key, message);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

static std::string dir_of(const std::string& p) {
  const auto slash = p.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
}
std::string stem_of(const std::string& p) {
  std::string base = p.substr(p.find_last_of('/') + 1);
  const auto dot = base.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
}
bool is_file(const std::string& p, struct stat* st) {
  struct stat s {};
  if (::stat(p.c_str(), &s) != 0 || !S_ISREG(s.st_mode)) return false;
  if (st) *st = s;
  return true;
}

// XXH3-64 of the file's bytes, 16 hex digits ("" when it cannot be read).
static std::string content_key(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(4 << 20);
  ssize_t n = 0;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) XXH3_64bits_update(st, buf.data(), static_cast<size_t>(n));
  ::close(fd);
  const unsigned long long h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (n < 0) return "";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", h);
  return hex;
}

static std::string cache_dir() {
  if (std::string d = env("SWAPNET_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/swapnet";
  return env("HOME").empty() ? "/tmp/swapnet-cache" : env("HOME") + "/.cache/swapnet";
}

static bool make_dirs(const std::string& d) {
  if (d.empty() || is_file(d)) return false;
  struct stat s {};
  if (::stat(d.c_str(), &s) == 0) return S_ISDIR(s.st_mode);
  if (!make_dirs(dir_of(d)) && dir_of(d) != d) return false;
  return ::mkdir(d.c_str(), 0755) == 0 || errno == EEXIST;
}

// The swapnet CLI: $SWAPNET_CLI, else beside this library (the build tree), else ../bin.
static std::string find_cli() {
  if (std::string c = env("SWAPNET_CLI"); !c.empty()) return c;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&find_cli), &info) != 0 && info.dli_fname != nullptr) {
    const std::string d = dir_of(info.dli_fname);
    for (const std::string& c : {d + "/swapnet", d + "/../bin/swapnet"}) {
      if (::access(c.c_str(), X_OK) == 0) return c;
    }
  }
  return "swapnet";  // on PATH
}

// Runs the swapnet CLI with `args` in a child process without the preload; its stdout goes to
// *captured when given, else to stderr (the program's stdout is the program's). "" on success,
// else why.
std::string run_cli(std::vector<std::string> args, std::string* captured) {
  const std::string cli = find_cli();
  args.insert(args.begin(), cli);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child must not inherit the preload (it would swap the model it reads).
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0 && std::strncmp(*e, "SWAPNET_BUDGET=", 15) != 0) envs.push_back(*e);
  }
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  int pipefd[2] = {-1, -1};
  if (captured && ::pipe2(pipefd, O_CLOEXEC) != 0) return "cannot make a pipe: " + errno_name(errno);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, captured ? pipefd[1] : 2, 1);
  pid_t pid = 0;
  int rc = cli.find('/') == std::string::npos ? posix_spawnp(&pid, cli.c_str(), &fa, nullptr, argv.data(), envp.data())
                                               : posix_spawn(&pid, cli.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (captured) {
    ::close(pipefd[1]);
    if (rc == 0) {
      char buf[4096];
      ssize_t n = 0;
      while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
        if (n > 0) captured->append(buf, static_cast<size_t>(n));
      }
    }
    ::close(pipefd[0]);
  }
  if (rc != 0) return "cannot run " + cli + ": " + errno_name(rc);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (size_t i = 0; i + 1 < argv.size(); ++i) cmd += (i ? " " : "") + std::string(argv[i]);
    return cmd + " failed (status " + std::to_string(status) + ")";
  }
  return "";
}

// `swapnet pack MODEL -o OUT --input-shape ...` into OUT.tmp.PID, renamed to OUT.
static std::string pack_in_child(const std::string& model, const std::string& out, const std::string& shapes) {
  const std::string tmp = out + ".tmp." + std::to_string(::getpid());
  std::vector<std::string> args = {"pack", model, "-o", tmp, "--input-shape"};
  std::stringstream ss(shapes);
  for (std::string s; std::getline(ss, s, ';');) {
    if (!s.empty()) args.push_back(s);
  }
  if (std::string err = run_cli(args); !err.empty()) {
    ::unlink(tmp.c_str());
    return err;
  }
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return "cannot rename " + tmp + " to " + out + ": " + errno_name(e);
  }
  return "";
}

// Where the image for `model` is or goes: an existing image (MODEL-stem.swapnet beside it, not
// older, or the content-keyed one beside it or in the cache), else `*make_at` says where to
// make one (beside the model if writable, else the cache). "" and *why on failure.
std::string find_image(const std::string& model, std::string* make_at, std::string* why) {
  struct stat ms {};
  is_file(model, &ms);
  const std::string dir = dir_of(model), stem = stem_of(model);
  struct stat is {};
  if (const std::string beside = dir + "/" + stem + ".swapnet"; is_file(beside, &is)) {
    if (is.st_mtime >= ms.st_mtime) return beside;
    say("stale:" + beside, beside + " is older than " + model + "; not used (a content-keyed image is looked for)");
  }
  const std::string key = content_key(model);
  if (key.empty()) {
    *why = "cannot read " + model + " to key its image";
    return "";
  }
  const std::string name = stem + "." + key + ".swapnet";
  const std::string near = dir + "/" + name, cached = cache_dir() + "/" + name;
  if (is_file(near)) return near;
  if (is_file(cached)) return cached;
  *make_at = ::access(dir.c_str(), W_OK) == 0 ? near : cached;
  return "";
}

// Makes the image at `out` for inputs of these shapes ("" or why).
std::string make_image(const std::string& model, const std::string& out, const std::string& shapes) {
  if (dir_of(out) == cache_dir() && !make_dirs(cache_dir())) return "cannot create the cache directory " + cache_dir();
  say("pack:" + model, "making the swap image of " + model + " at " + out + " (once)");
  return pack_in_child(model, out, shapes);
}

std::uint64_t parse_budget(const std::string& text, std::uint64_t full) {
  if (!text.empty() && text.back() == '%') {
    char* end = nullptr;
    const double pct = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() - 1 || !(pct > 0 && pct <= 100)) {
      throw Error("SWAPNET_BUDGET='" + text + "' is not a percentage in (0, 100]");
    }
    return static_cast<std::uint64_t>(static_cast<double>(full) * pct / 100);
  }
  try {
    return parse_size(text);
  } catch (const std::exception& e) {
    throw Error("SWAPNET_BUDGET='" + text + "': " + e.what());
  }
}

}  // namespace transparent
}  // namespace swapnet
