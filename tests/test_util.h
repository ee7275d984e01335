// Helpers shared by the torch-facing tests: model paths and error messages.
#pragma once

#include <dirent.h>
#include <dlfcn.h>
#include <ftw.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace test_util {

// A model written by models/export.py into $SWAPNET_MODELS (scripts/test.sh sets it up).
inline std::string model(const std::string& name) {
  const char* dir = std::getenv("SWAPNET_MODELS");
  return std::string(dir ? dir : ".cache/models") + "/" + name + ".pt";
}

// Note [Long test runs]
// ~~~~~~~~~~~~~~~~~~~~~
// The default test run is sized to what each test must show (docs/testing.md): a stress test
// provokes its race in a few hundred requests, a fuzzer runs for seconds. `scripts/test.sh
// --long` (and scripts/sanitize.sh) set SWAPNET_LONG_TESTS=1 for the long versions: the same
// checks over more requests, mutants and fuzzing time.
inline bool long_tests() {
  const char* v = std::getenv("SWAPNET_LONG_TESTS");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}
// `usual` in the default run, `long_run` under SWAPNET_LONG_TESTS.
inline int sized(int usual, int long_run) { return long_tests() ? long_run : usual; }

// A file's bytes, and a file written with `bytes`.
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Rewrites a swap image's header and metadata checksums after a deliberate edit, so that the
// parser's own checks (not the checksums) see it.
inline void reseal(std::string& b) {
  std::uint64_t meta_size = 0;
  std::memcpy(&meta_size, &b[40], 8);
  const std::uint64_t meta_sum = checksum(&b[4096], meta_size);
  std::memcpy(&b[48], &meta_sum, 8);
  const std::uint64_t head_sum = checksum(b.data(), 4088);
  std::memcpy(&b[4088], &head_sum, 8);
}

// No std::filesystem in the tests: pip's libtorch (2.5 and later, pytorch/pytorch#133437)
// exports the std::filesystem of the libstdc++ it was linked with statically, which a test
// binary then calls instead of its own: on the GPU machine (torch 2.11) every test that removed
// its temporary directory at exit crashed there. POSIX calls instead.

// Removes `path` and everything under it; errors are ignored (a cleanup).
inline void remove_tree(const std::string& path) {
  (void)::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { (void)::remove(p); return 0; }, 16,
      FTW_DEPTH | FTW_PHYS);
}

// The names of the entries of directory `dir` (not . and ..).
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  return names;
}

// A directory made under /tmp (`prefix` + a unique suffix) and removed with everything in it
// when the object goes. Tests run ~200 processes a run; leaving their files behind filled /tmp.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix = "swapnet-test") {
    std::string t = "/tmp/" + prefix + "-XXXXXX";
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp " + t + " failed");
    path_ = t;
  }
  ~ScopedTempDir() { remove_tree(path_); }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One directory per process, removed at exit (each test runs in its own process under ctest).
inline const std::string& process_temp_dir() {
  static ScopedTempDir dir;
  return dir.path();
}

// The message of the swapnet::Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// OpenBLAS's threads and the variables that choose them, put back as they were at the end of a
// test whatever it did (Note [BLAS on the compute thread] in scheduler/src/intra_op.cpp). The
// variables are unset meanwhile.
class BlasStateGuard {
 public:
  BlasStateGuard()
      : get(reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))),
        set(reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    const auto parallel = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
    pthreads = parallel != nullptr && get != nullptr && set != nullptr && parallel() == 1;
    if (pthreads) was_ = get();
    for (int k = 0; k < 2; ++k) {
      const char* v = std::getenv(kVars[k]);
      had_[k] = v != nullptr;
      env_[k] = v != nullptr ? v : "";
      ::unsetenv(kVars[k]);
    }
  }
  ~BlasStateGuard() {
    if (pthreads) set(was_);
    for (int k = 0; k < 2; ++k) {
      if (had_[k]) ::setenv(kVars[k], env_[k].c_str(), 1);
    }
  }
  BlasStateGuard(const BlasStateGuard&) = delete;
  BlasStateGuard& operator=(const BlasStateGuard&) = delete;
  int (*const get)();
  void (*const set)(int);
  bool pthreads = false;  // OpenBLAS's pthread build is libtorch's BLAS here

 private:
  static constexpr const char* kVars[2] = {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS"};
  int was_ = 0;
  bool had_[2] = {false, false};
  std::string env_[2];
};

}  // namespace test_util
}  // namespace swapnet
