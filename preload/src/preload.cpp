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
#include "swapnet/preload.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

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
  GetDeviceCount get_device_count = nullptr;
  MallocManaged malloc_managed = nullptr;
  Free free = nullptr;
  MemGetInfo mem_get_info = nullptr;
  GetErrorString error_string = nullptr;
  std::string why_not;  // empty when usable
  size_t limit = 0;     // bytes of managed memory it may hand out

  void load() {
    void* h = nullptr;
    const char* names[] = {getenv("SWAPNET_CUDART"), "libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    for (const char* n : names) {
      if (n == nullptr || *n == 0) continue;
      h = dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
      if (h == nullptr) h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) break;
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
  void* (*real_alloc)(size_t) = nullptr;
  void (*real_free)(void*) = nullptr;
  std::atomic<uint64_t> allocations{0}, frees{0}, bytes{0}, current{0}, peak{0}, managed_current{0};
  std::atomic<bool> said_overflow{false};
  static constexpr int kShards = 64;
  Shard shards[kShards];

  Shard& shard(const void* p) { return shards[(reinterpret_cast<uintptr_t>(p) >> 6) % kShards]; }
};

// Never destroyed: allocations and frees can arrive during and after static destruction.
State& state() {
  static State* s = new State;
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
}

void resolve_real(State& s) {
  if (s.real_alloc == nullptr) {
    s.real_alloc = reinterpret_cast<void* (*)(size_t)>(dlsym(RTLD_NEXT, "_ZN3c109alloc_cpuEm"));
    s.real_free = reinterpret_cast<void (*)(void*)>(dlsym(RTLD_NEXT, "_ZN3c108free_cpuEPv"));
  }
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
  if (s.real_alloc == nullptr || s.real_free == nullptr) b = Backend::kOff;  // not a libtorch process
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

namespace c10 {

void* alloc_cpu(size_t nbytes) {
  State& s = state();
  if (nbytes == 0) {
    resolve_real(s);
    return nullptr;  // as c10 does
  }
  std::call_once(s.decided, [&] { decide(s); });
  const Backend b = s.backend.load(std::memory_order_relaxed);
  if (b == Backend::kOff) return s.real_alloc(nbytes);
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
      return s.real_alloc(nbytes);
    }
  } else if (posix_memalign(&p, kAlign, nbytes) != 0) {
    return s.real_alloc(nbytes);  // c10's allocator reports the failure its own way
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
    resolve_real(s);
    if (s.real_free) s.real_free(data);
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
