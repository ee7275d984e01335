// libswapnet_preload.so: interposes c10::alloc_cpu / c10::free_cpu (swapnet/preload.h).
//
// Note [Preload allocator]
// - Every served block is recorded in a sharded hash map (pointer -> size, kind), so free_cpu
//   recognises its own blocks exactly and hands anything else to c10's free_cpu (found with
//   dlsym(RTLD_NEXT)); no header is read in front of a foreign pointer.
// - The backend is chosen once, at the first non-empty allocation, not in a constructor: that
//   may run before the dynamic loader has finished, and before CUDA can be initialised. Until then
//   (and whenever the CUDA runtime cannot be found or has no usable device) host memory is used.
// - The CUDA runtime is dlopen'ed (RTLD_NOLOAD first, to share the one libtorch loaded), never
//   linked: a program that does not use libtorch never loads it and is unaffected.
// - Managed memory is never asked for beyond what the GPU had free when the backend was chosen
//   (less 10 %); past that, requests go to c10's allocator (said once).
// - No libtorch headers: this file declares the two c10 functions it replaces.
// - Copy-free .to(cuda) lives in libswapnet_dispatch.so (dispatch.cpp), which links libtorch
//   and registers a kernel with the dispatcher. This library dlopens it after the backend is
//   decided (outside the call_once, so the dispatch library's initialisers may allocate), and
//   only when the libtorch_cpu file it was linked with is the one already loaded: a program
//   built against another libtorch keeps the normal path (said once) instead of loading a
//   second one.
#include "swapnet/preload.h"
#include "internal.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#define SWAPNET_PRELOAD_API __attribute__((visibility("default")))

namespace c10 {
SWAPNET_PRELOAD_API void* alloc_cpu(size_t nbytes);
SWAPNET_PRELOAD_API void free_cpu(void* data);
}  // namespace c10

namespace {

enum class Backend { kUndecided, kManaged, kHost, kOff };
constexpr size_t kAlign = 64;  // c10's gAlignment

struct Block {
  size_t bytes;
  bool managed;
};

// ---- the CUDA runtime, by dlopen ----------------------------------------------------------

struct Cuda {
  using GetDeviceCount = int (*)(int*);
  using MallocManaged = int (*)(void**, size_t, unsigned);
  using Free = int (*)(void*);
  using MemGetInfo = int (*)(size_t*, size_t*);
  using GetErrorString = const char* (*)(int);
  using GetDevice = int (*)(int*);
  using DeviceGetAttribute = int (*)(int*, int, int);
  using RuntimeGetVersion = int (*)(int*);
  GetDeviceCount get_device_count = nullptr;
  GetDevice get_device = nullptr;
  DeviceGetAttribute device_get_attribute = nullptr;
  RuntimeGetVersion runtime_get_version = nullptr;
  void* mem_prefetch = nullptr;  // cudaMemPrefetchAsync: its signature changed in CUDA 13
  int version = 0;               // cudaRuntimeGetVersion, e.g. 13000
  MallocManaged malloc_managed = nullptr;
  Free free = nullptr;
  MemGetInfo mem_get_info = nullptr;
  GetErrorString error_string = nullptr;
  std::string why_not;  // empty when usable
  size_t limit = 0;     // bytes of managed memory it may hand out

  void load() {
    void* h = nullptr;
    const char* names[] = {getenv("SWAPNET_CUDART"), "libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    for (const char* n : names) {  // a runtime already loaded (libtorch's) first, of any version
      if (n != nullptr && *n != 0 && (h = dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) != nullptr) break;
    }
    for (const char* n : names) {
      if (h != nullptr) break;
      if (n != nullptr && *n != 0) h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    }
    if (h == nullptr) {
      why_not = "the CUDA runtime (libcudart) was not found";
      return;
    }
    get_device_count = reinterpret_cast<GetDeviceCount>(dlsym(h, "cudaGetDeviceCount"));
    malloc_managed = reinterpret_cast<MallocManaged>(dlsym(h, "cudaMallocManaged"));
    free = reinterpret_cast<Free>(dlsym(h, "cudaFree"));
    mem_get_info = reinterpret_cast<MemGetInfo>(dlsym(h, "cudaMemGetInfo"));
    error_string = reinterpret_cast<GetErrorString>(dlsym(h, "cudaGetErrorString"));
    get_device = reinterpret_cast<GetDevice>(dlsym(h, "cudaGetDevice"));
    device_get_attribute = reinterpret_cast<DeviceGetAttribute>(dlsym(h, "cudaDeviceGetAttribute"));
    runtime_get_version = reinterpret_cast<RuntimeGetVersion>(dlsym(h, "cudaRuntimeGetVersion"));
    mem_prefetch = dlsym(h, "cudaMemPrefetchAsync");
    if (runtime_get_version) runtime_get_version(&version);
    if (!get_device_count || !malloc_managed || !free || !mem_get_info) {
      why_not = "libcudart lacks cudaMallocManaged/cudaFree/cudaMemGetInfo";
      return;
    }
    int count = 0;  // left untouched on failure
    int err = get_device_count(&count);
    if (err != 0) {
      why_not = std::string("cudaGetDeviceCount: ") + (error_string ? error_string(err) : "error") + " (" +
                std::to_string(err) + ")";
      return;
    }
    if (count == 0) {
      why_not = "no CUDA device visible";
      return;
    }
    size_t free_bytes = 0, total = 0;
    err = mem_get_info(&free_bytes, &total);
    if (err != 0) {
      why_not = std::string("cudaMemGetInfo: ") + (error_string ? error_string(err) : "error");
      return;
    }
    limit = free_bytes / 10 * 9;
  }
};

// ---- state ------------------------------------------------------------------------------------

struct Shard {
  std::mutex mu;
  std::unordered_map<void*, Block> blocks;
};

struct State {
  std::once_flag decided;
  std::atomic<Backend> backend{Backend::kUndecided};
  Backend requested = Backend::kUndecided;
  Cuda cuda;
  bool stats = false;
  std::mutex resolve_mu;
  std::atomic<void* (*)(size_t)> real_alloc{nullptr};  // c10's own (resolve_real)
  std::atomic<void (*)(void*)> real_free{nullptr};
  std::atomic<uint64_t> allocations{0}, frees{0}, bytes{0}, current{0}, peak{0}, managed_current{0};
  std::atomic<bool> said_overflow{false};
  // Copy-free dispatch (libswapnet_dispatch.so): SWAPNET_DISPATCH=auto|on|off|alias-host.
  enum class Dispatch { kOff, kAuto, kOn, kAliasHost } dispatch = Dispatch::kAuto;
  std::atomic<bool> dispatch_pending{false};
  void* dispatch_lib = nullptr;
  static constexpr int kShards = 64;
  Shard shards[kShards];

  Shard& shard(const void* p) { return shards[(reinterpret_cast<uintptr_t>(p) >> 6) % kShards]; }
};

void fork_prepare();
void fork_release();

// Never destroyed: allocations and frees can arrive during and after static destruction.
State& state() {
  static State* s = [] {
    auto* st = new State;
    pthread_atfork(fork_prepare, fork_release, fork_release);
    return st;
  }();
  return *s;
}

const char* name(Backend b) {
  switch (b) {
    case Backend::kManaged: return "managed";
    case Backend::kHost: return "host";
    case Backend::kOff: return "off";
    default: return "host";
  }
}

void print_stats() {
  State& s = state();
  std::fprintf(stderr,
               "swapnet-preload: backend=%s allocations=%llu frees=%llu bytes=%llu peak_bytes=%llu\n",
               name(s.backend.load()), static_cast<unsigned long long>(s.allocations.load()),
               static_cast<unsigned long long>(s.frees.load()), static_cast<unsigned long long>(s.bytes.load()),
               static_cast<unsigned long long>(s.peak.load()));
  if (s.dispatch_lib != nullptr) {
    using Stats = void (*)(uint64_t*);
    auto stats = reinterpret_cast<Stats>(dlsym(s.dispatch_lib, "swapnet_dispatch_stats"));
    uint64_t v[4] = {0, 0, 0, 0};
    if (stats) stats(v);
    std::fprintf(stderr, "swapnet-dispatch: calls=%llu to_cuda=%llu aliased=%llu copied=%llu\n",
                 static_cast<unsigned long long>(v[0]), static_cast<unsigned long long>(v[1]),
                 static_cast<unsigned long long>(v[2]), static_cast<unsigned long long>(v[3]));
  }
}

// Loads one of swapnet's libtorch-linked libraries: `env` names it, else `file` next to this
// library; only if the libtorch_cpu it was linked with is the one in the process (a program
// built against another libtorch must not get a second one). Otherwise says why, once per
// `purpose`, and returns nullptr.
void* load_torch_library(const char* env, const char* file, const char* purpose) {
  std::string path;
  if (const char* p = getenv(env); p && *p) {
    path = p;
  } else {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&load_torch_library), &info) == 0 || info.dli_fname == nullptr) return nullptr;
    std::string self = info.dli_fname;
    path = self.substr(0, self.find_last_of('/') + 1) + file;
  }
#ifdef SWAPNET_TORCH_CPU_SONAME
  // The same soname is not enough (pip's is unversioned): the loaded libtorch_cpu must be the
  // very file the library was linked with.
  void* torch = dlopen(SWAPNET_TORCH_CPU_SONAME, RTLD_LAZY | RTLD_NOLOAD);
  std::string loaded = "(none)";
  if (torch != nullptr) {
    struct link_map* lm = nullptr;
    char real[PATH_MAX];
    if (dlinfo(torch, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && realpath(lm->l_name, real) != nullptr) loaded = real;
    dlclose(torch);
  }
  if (loaded != SWAPNET_TORCH_CPU_PATH) {
    std::fprintf(stderr, "swapnet-preload: %s disabled: this program's libtorch_cpu is %s, not %s, "
                         "the one %s was built with\n", purpose, loaded.c_str(), SWAPNET_TORCH_CPU_PATH, path.c_str());
    return nullptr;
  }
#endif
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) std::fprintf(stderr, "swapnet-preload: %s disabled: %s\n", purpose, dlerror());
  return h;
}

void load_dispatch(State& s) {
  s.dispatch_lib = load_torch_library("SWAPNET_DISPATCH_LIB", "libswapnet_dispatch.so", "copy-free .to(cuda)");
}

// The definition of a libtorch symbol (c10's alloc_cpu / free_cpu, torch::jit's load functions)
// in the object that defines it. A program linked with libtorch
// has libc10 in the global scope, where dlsym(RTLD_NEXT) finds it. A program that loads libtorch
// late (Python's torch, a plug-in) dlopens libc10 with RTLD_LOCAL: it is not in the global scope,
// RTLD_NEXT finds nothing, yet libc10's calls still reach this library (its symbols come first).
// Then every loaded object but this one is asked in turn (dlsym on its own handle searches it
// and its dependencies, never the preloaded libraries), and the definition taken only from the
// object it lies in. Objects are listed first and opened after: dlopen inside dl_iterate_phdr
// would take the loader's lock twice.
void* find_definition(const char* symbol) {
  if (void* f = dlsym(RTLD_NEXT, symbol)) return f;
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&load_torch_library), &self);
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != 0) {
          static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name);
        }
        return 0;
      },
      &names);
  // libc10 first: where c10 lives in every libtorch build (pip's and Debian's).
  std::stable_partition(names.begin(), names.end(),
                        [](const std::string& n) { return n.find("libc10") != std::string::npos; });
  for (const std::string& n : names) {
    void* h = dlopen(n.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) continue;
    void* f = dlsym(h, symbol);
    Dl_info where{};
    const bool own = f != nullptr && dladdr(f, &where) != 0 && where.dli_fbase != self.dli_fbase;
    dlclose(h);  // NOLOAD: drops the reference just taken, the object stays
    if (own) return f;
  }
  return nullptr;
}

// Resolved on first need, by whichever thread gets there (the answer is the same for all); a
// program that has not loaded libtorch yet is asked again next time.
void resolve_real(State& s) {
  if (s.real_alloc.load(std::memory_order_acquire) != nullptr) return;
  std::lock_guard<std::mutex> lock(s.resolve_mu);
  if (s.real_alloc.load(std::memory_order_relaxed) != nullptr) return;
  auto* f = reinterpret_cast<void (*)(void*)>(find_definition("_ZN3c108free_cpuEPv"));
  auto* a = reinterpret_cast<void* (*)(size_t)>(find_definition("_ZN3c109alloc_cpuEm"));
  if (a == nullptr || f == nullptr) return;
  s.real_free.store(f, std::memory_order_release);
  s.real_alloc.store(a, std::memory_order_release);
}

// What c10 would do, where c10's functions cannot be found (they always can where c10 calls
// this library; kept so that no path calls through a null pointer).
void* fallback_alloc(size_t n) {
  void* p = nullptr;
  return posix_memalign(&p, kAlign, n) == 0 ? p : nullptr;
}
void* real_alloc(State& s, size_t n) {
  resolve_real(s);
  auto* f = s.real_alloc.load(std::memory_order_acquire);
  return f != nullptr ? f(n) : fallback_alloc(n);
}
void real_free(State& s, void* p) {
  resolve_real(s);
  auto* f = s.real_free.load(std::memory_order_acquire);
  if (f != nullptr) {
    f(p);
  } else {
    ::free(p);  // c10's free_cpu is free() (posix_memalign'ed memory)
  }
}

// fork() while another thread holds a shard's lock would leave the child's lock held forever:
// every shard is locked around fork, so the child starts with consistent, unlocked maps.
void fork_prepare() {
  State& s = state();
  for (auto& sh : s.shards) sh.mu.lock();
}
void fork_release() {
  State& s = state();
  for (int i = State::kShards - 1; i >= 0; --i) s.shards[i].mu.unlock();
}

void decide(State& s) {
  resolve_real(s);
  const char* stats = getenv("SWAPNET_ALLOC_STATS");
  s.stats = stats && *stats && strcmp(stats, "0") != 0;
  const char* want = getenv("SWAPNET_ALLOC");
  std::string w = want ? want : "";
  Backend b = Backend::kUndecided;
  if (w == "off") {
    b = Backend::kOff;
  } else if (w == "host") {
    b = Backend::kHost;
  } else {
    if (!w.empty() && w != "managed") {
      std::fprintf(stderr, "swapnet-preload: SWAPNET_ALLOC='%s' is not one of managed|host|off; using the default\n",
                   w.c_str());
    }
    s.cuda.load();
    if (s.cuda.why_not.empty()) {
      b = Backend::kManaged;
    } else {
      b = Backend::kHost;
      if (w == "managed") {
        std::fprintf(stderr, "swapnet-preload: SWAPNET_ALLOC=managed but %s; using host memory\n",
                     s.cuda.why_not.c_str());
      }
    }
  }
  const char* disp = getenv("SWAPNET_DISPATCH");
  const std::string d = disp ? disp : "";
  if (d == "off") {
    s.dispatch = State::Dispatch::kOff;
  } else if (d == "on") {
    s.dispatch = State::Dispatch::kOn;
  } else if (d == "alias-host") {
    s.dispatch = State::Dispatch::kAliasHost;
  } else if (!d.empty() && d != "auto") {
    std::fprintf(stderr, "swapnet-preload: SWAPNET_DISPATCH='%s' is not one of auto|on|off|alias-host; using auto\n",
                 d.c_str());
  }
  // auto: only where aliasing can happen (managed memory); on/alias-host: whenever swapnet serves.
  const bool load = b != Backend::kOff && (s.dispatch == State::Dispatch::kOn || s.dispatch == State::Dispatch::kAliasHost ||
                                           (s.dispatch == State::Dispatch::kAuto && b == Backend::kManaged));
  s.dispatch_pending.store(load);
  s.backend.store(b);
  if (s.stats) atexit(print_stats);
}

void note_alloc(State& s, size_t n) {
  s.allocations.fetch_add(1, std::memory_order_relaxed);
  s.bytes.fetch_add(n, std::memory_order_relaxed);
  const uint64_t now = s.current.fetch_add(n) + n;
  uint64_t peak = s.peak.load();
  while (now > peak && !s.peak.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

namespace swapnet_preload {
void* find_real(const char* symbol) { return find_definition(symbol); }
void* load_torch_helper() {
  static void* h = load_torch_library("SWAPNET_TORCH_LIB", "libswapnet_torch.so", "transparent swapping (SWAPNET_BUDGET)");
  return h;
}
}  // namespace swapnet_preload

namespace c10 {

void* alloc_cpu(size_t nbytes) {
  State& s = state();
  if (nbytes == 0) return nullptr;  // as c10 does
  std::call_once(s.decided, [&] { decide(s); });
  if (s.dispatch_pending.load(std::memory_order_relaxed) && s.dispatch_pending.exchange(false)) load_dispatch(s);
  const Backend b = s.backend.load(std::memory_order_relaxed);
  if (b == Backend::kOff) return real_alloc(s, nbytes);
  void* p = nullptr;
  bool managed = false;
  if (b == Backend::kManaged) {
    if (s.managed_current.load() + nbytes <= s.cuda.limit &&
        s.cuda.malloc_managed(&p, nbytes, /*cudaMemAttachGlobal=*/1) == 0 && p != nullptr) {
      managed = true;
      s.managed_current.fetch_add(nbytes);
    } else {
      p = nullptr;
      if (!s.said_overflow.exchange(true)) {
        std::fprintf(stderr, "swapnet-preload: managed memory refused or beyond what the GPU had free (%zu bytes); "
                             "such requests go to c10's allocator\n", nbytes);
      }
      return real_alloc(s, nbytes);
    }
  } else if (posix_memalign(&p, kAlign, nbytes) != 0) {
    return real_alloc(s, nbytes);  // c10's allocator reports the failure its own way
  }
  {
    Shard& sh = s.shard(p);
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.blocks.emplace(p, Block{nbytes, managed});
  }
  note_alloc(s, nbytes);
  return p;
}

void free_cpu(void* data) {
  if (data == nullptr) return;
  State& s = state();
  Block blk{0, false};
  bool ours = false;
  {
    Shard& sh = s.shard(data);
    std::lock_guard<std::mutex> lock(sh.mu);
    auto it = sh.blocks.find(data);
    if (it != sh.blocks.end()) {
      blk = it->second;
      sh.blocks.erase(it);
      ours = true;
    }
  }
  if (!ours) {
    real_free(s, data);
    return;
  }
  s.frees.fetch_add(1, std::memory_order_relaxed);
  s.current.fetch_sub(blk.bytes);
  if (blk.managed) {
    s.managed_current.fetch_sub(blk.bytes);
    s.cuda.free(data);
  } else {
    ::free(data);
  }
}

}  // namespace c10

extern "C" {

SWAPNET_PRELOAD_API int swapnet_preload_owns(const void* p) {
  State& s = state();
  Shard& sh = s.shard(p);
  std::lock_guard<std::mutex> lock(sh.mu);
  return sh.blocks.count(const_cast<void*>(p)) ? 1 : 0;
}

SWAPNET_PRELOAD_API int swapnet_preload_is_managed(const void* p) {
  State& s = state();
  Shard& sh = s.shard(p);
  std::lock_guard<std::mutex> lock(sh.mu);
  auto it = sh.blocks.find(const_cast<void*>(p));
  return it != sh.blocks.end() && it->second.managed ? 1 : 0;
}

SWAPNET_PRELOAD_API int swapnet_preload_alias_host(void) {
  return state().dispatch == State::Dispatch::kAliasHost ? 1 : 0;
}

SWAPNET_PRELOAD_API int swapnet_preload_cuda_device(void) {
  State& s = state();
  int d = -1;
  if (s.cuda.get_device == nullptr || s.cuda.get_device(&d) != 0) return -1;
  return d;
}

// Discrete GPUs that access managed memory concurrently (H100/H200): start migrating the pages to
// `device` now, on the legacy default stream, so kernels find them there. Integrated GPUs
// (Jetson, concurrentManagedAccess == 0) refuse prefetches; their memory is the same DRAM, so
// there is nothing to move: returns 0 without a call. Returns the CUDA error, 0 on success.
SWAPNET_PRELOAD_API int swapnet_preload_prefetch(const void* p, size_t bytes, int device) {
  State& s = state();
  Cuda& c = s.cuda;
  if (c.mem_prefetch == nullptr || c.device_get_attribute == nullptr || device < 0) return 0;
  int concurrent = 0;
  if (c.device_get_attribute(&concurrent, /*cudaDevAttrConcurrentManagedAccess=*/89, device) != 0 || !concurrent) return 0;
  if (c.version >= 13000) {
    struct Location {
      int type;  // cudaMemLocationTypeDevice = 1
      int id;
    } loc{1, device};
    using Fn = int (*)(const void*, size_t, Location, unsigned, void*);
    return reinterpret_cast<Fn>(c.mem_prefetch)(p, bytes, loc, 0, nullptr);
  }
  using Fn = int (*)(const void*, size_t, int, void*);
  return reinterpret_cast<Fn>(c.mem_prefetch)(p, bytes, device, nullptr);
}

SWAPNET_PRELOAD_API void swapnet_preload_get_stats(struct swapnet_preload_stats* out) {
  State& s = state();
  out->backend = name(s.backend.load());
  out->allocations = s.allocations.load();
  out->frees = s.frees.load();
  out->bytes = s.bytes.load();
  out->peak_bytes = s.peak.load();
  out->current_bytes = s.current.load();
}

}  // extern "C"
