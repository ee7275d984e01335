// The per-model budget arena and swapnet's memory accounting.
//
// Note [Two-ended arena]
// ~~~~~~~~~~~~~~~~~~~~~~
// The executor keeps at most two blocks in memory: block i executing and block i+1 arriving.
// Placing even blocks at the low end and odd blocks at the high end means block i+1 never
// overlaps block i as long as s_i + s_{i+1} <= budget, which is exactly the partition
// constraint, and block i+2 reuses block i's end once block i has executed. Nothing is
// allocated per swap; a block "swapped out" is just released (weights are never written back).
// The arena is reserved once at the largest size the model may need (capacity) and used up to
// its budget; shrinking drops the physical pages past the new budget.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "accounting.h"
#include "swapnet/allocator.h"

#if SWAPNET_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace swapnet {
namespace {

constexpr std::uint64_t kAlign = 4096;  // bytes

std::atomic<std::uint64_t> g_current{0};
std::atomic<std::uint64_t> g_peak{0};

}  // namespace

void account_memory(std::int64_t delta) {
  std::uint64_t now = g_current.fetch_add(static_cast<std::uint64_t>(delta)) + static_cast<std::uint64_t>(delta);
  std::uint64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

namespace {

std::uint64_t align_up(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Note [Giving back huge pages]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Host arenas ask for transparent huge pages (MADV_HUGEPAGE). Dropping part of a 2 MiB region
// with MADV_DONTNEED splits it, but khugepaged later collapses any such region with one page
// still present back into a whole huge page (max_ptes_none is 511 by default): measured here,
// 16 MiB of 4 KiB pages kept one per region grew back to 32 MiB within 20 s. So the regions a
// drop cuts through (at most one at each end) lose huge pages for the rest of the arena's life
// (an arena lives one plan); regions dropped whole are empty, and khugepaged skips those.
constexpr std::uintptr_t kHuge = 2u << 20;  // bytes

void give_back(char* arena, std::uint64_t capacity, std::uint64_t from, std::uint64_t to) {
  if (to <= from) return;
  // The regions cut through are marked first: marked after, khugepaged could collapse a region
  // between two drops of it (its other pages still there) and the first drop would grow back
  // (seen once in a CI run: 1 MiB resident where 9 pages were kept).
  if (capacity >= kHuge) {  // else never asked for huge pages
    const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(arena), hi = lo + capacity;
    auto no_huge = [&](std::uintptr_t at) {  // the huge region containing `at`, within the arena
      const std::uintptr_t a = std::max(lo, at / kHuge * kHuge), b = std::min(hi, at / kHuge * kHuge + kHuge);
      (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_NOHUGEPAGE);  // advisory
    };
    const std::uintptr_t a = lo + from, b = lo + to;
    if (a % kHuge != 0) no_huge(a);
    if (b % kHuge != 0) no_huge(b);
  }
  if (::madvise(arena + from, to - from, MADV_DONTNEED) != 0) {
    log_once(LogLevel::kWarn, "arena_discard", std::string("arena: madvise(DONTNEED) failed: ") + std::strerror(errno));
  }
}

}  // namespace

const char* to_string(MemoryKind k) {
  switch (k) {
    case MemoryKind::kManaged: return "managed";
    case MemoryKind::kRegistered: return "registered";
    default: return "host";
  }
}

MemoryStats memory_stats() { return MemoryStats{g_current.load(), g_peak.load()}; }
void reset_memory_peak() { g_peak.store(g_current.load()); }

std::unique_ptr<Arena> Arena::create(std::uint64_t capacity, MemoryKind kind) {
  capacity = align_up(capacity);
  if (capacity == 0) throw Error("arena: capacity must be positive");
  if (kind == MemoryKind::kRegistered && !cuda_device().usable) {
    throw Error("arena: pinned host memory registered with CUDA needs a usable GPU (" + cuda_device().reason + ")");
  }
  if (kind == MemoryKind::kManaged && !cuda_device().usable) {
    log_once(LogLevel::kInfo, "arena_host", "no usable CUDA device (" + cuda_device().reason +
                                                "): block memory is page-aligned host memory");
    kind = MemoryKind::kHost;
  }
  char* base = nullptr;
#if SWAPNET_WITH_CUDA
  if (kind == MemoryKind::kManaged) {
    void* p = nullptr;
    cudaError_t err = cudaMallocManaged(&p, capacity, cudaMemAttachGlobal);
    if (err != cudaSuccess) {
      throw Error("arena: cudaMallocManaged(" + std::to_string(capacity) + " bytes) failed: " + cudaGetErrorString(err));
    }
    base = static_cast<char*>(p);
    gpu_managed_made(base, capacity);
  }
#endif
  char* device_base = nullptr;
  if (base == nullptr) {
    if (kind != MemoryKind::kRegistered) kind = MemoryKind::kHost;
    void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      throw Error("arena: reserving " + std::to_string(capacity) + " bytes failed: " + std::strerror(errno));
    }
    base = static_cast<char*>(p);
    // Transparent huge pages where the system offers them on request: fewer pages to fault in
    // and, on a budget change, to give back. Advisory.
    if (kind == MemoryKind::kHost && capacity >= (2u << 20)) (void)::madvise(base, capacity, MADV_HUGEPAGE);
#if SWAPNET_WITH_CUDA
    if (kind == MemoryKind::kRegistered) {
      cudaError_t err = cudaHostRegister(base, capacity, cudaHostRegisterPortable | cudaHostRegisterMapped);
      void* dev = nullptr;
      if (err == cudaSuccess) err = cudaHostGetDevicePointer(&dev, base, 0);
      if (err != cudaSuccess) {
        cudaHostUnregister(base);
        ::munmap(base, capacity);
        throw Error("arena: cudaHostRegister(" + std::to_string(capacity) + " bytes) failed: " + cudaGetErrorString(err));
      }
      device_base = static_cast<char*>(dev);
    }
#endif
  }
  auto arena = std::unique_ptr<Arena>(new Arena(base, capacity, kind));
  if (device_base != nullptr) arena->device_base_ = device_base;
  return arena;
}

Arena::Arena(char* base, std::uint64_t capacity, MemoryKind kind)
    : base_(base), device_base_(base), capacity_(capacity), budget_(capacity), kind_(kind) {}

Arena::~Arena() {
  account_memory(-static_cast<std::int64_t>(low_ + high_));
#if SWAPNET_WITH_CUDA
  if (kind_ == MemoryKind::kManaged) {
    cudaFree(base_);
    return;
  }
  if (kind_ == MemoryKind::kRegistered) cudaHostUnregister(base_);
#endif
  ::munmap(base_, capacity_);
}

void Arena::set_budget(std::uint64_t bytes) {
  bytes = std::min(align_up(bytes), capacity_);
  if (bytes < budget_ && kind_ == MemoryKind::kHost) give_back(base_, capacity_, bytes, capacity_);
  budget_ = bytes;
}

void* Arena::place(bool high, std::uint64_t bytes) {
  bytes = align_up(bytes);
  const std::uint64_t other = high ? low_ : high_;
  if (bytes > budget_ || other > budget_ - bytes) return nullptr;
  std::uint64_t& mine = high ? high_ : low_;
  account_memory(static_cast<std::int64_t>(bytes) - static_cast<std::int64_t>(mine));
  mine = bytes;
  return high ? base_ + budget_ - bytes : base_;
}

void Arena::release(bool high) {
  std::uint64_t& mine = high ? high_ : low_;
  account_memory(-static_cast<std::int64_t>(mine));
  mine = 0;
}

void Arena::discard(std::uint64_t offset, std::uint64_t bytes) {
  if (kind_ != MemoryKind::kHost || offset >= capacity_) return;
  const std::uint64_t a = align_up(offset), b = std::min(capacity_, (offset + bytes) / kAlign * kAlign);
  if (b > a) give_back(base_, capacity_, a, b);
}

}  // namespace swapnet
