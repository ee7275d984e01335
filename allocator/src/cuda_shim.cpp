// The CUDA shim: the only translation unit that includes the CUDA runtime. Built without CUDA
// (SWAPNET_WITH_CUDA=OFF) it reports "built without CUDA"; built with it on a machine without a
// driver it reports cudaErrorInsufficientDriver. Only cudart is linked: linking libcuda would
// stop the program from starting where no driver is installed.
#include <cstdlib>
#include <string>

#include "swapnet/allocator.h"

#if SWAPNET_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace swapnet {
namespace {

DeviceInfo probe() {
  DeviceInfo info;
#if SWAPNET_WITH_CUDA
  info.built_with_cuda = true;
  int count = 0;  // cudaGetDeviceCount leaves it untouched on failure
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.reason = std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) + ")";
    cudaGetLastError();  // clear what can be cleared; a missing driver stays sticky
    return info;
  }
  info.count = count;
  if (count == 0) {
    info.reason = "no CUDA device visible";
    return info;
  }
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, 0);
  if (err != cudaSuccess) {
    info.reason = std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorString(err);
    return info;
  }
  info.usable = true;
  info.name = prop.name;
  info.integrated = prop.integrated != 0;
  info.concurrent_managed_access = prop.concurrentManagedAccess != 0;
#else
  info.reason = "built without CUDA (SWAPNET_WITH_CUDA=OFF)";
#endif
  return info;
}

}  // namespace

const DeviceInfo& cuda_device() {
  static const DeviceInfo info = [] {
    DeviceInfo i = probe();
    if (i.usable) {
      log(LogLevel::kInfo, "CUDA device 0: " + i.name + (i.integrated ? " (integrated)" : " (discrete)"));
    } else {
      log(LogLevel::kInfo, "no usable CUDA device: " + i.reason + "; running on the CPU");
    }
    return i;
  }();
  return info;
}

// Note [Managed memory on a discrete GPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Blocks are read with O_DIRECT into managed memory. On a Jetson the CPU and GPU share the
// DRAM: nothing moves. On a discrete GPU (H100) the driver migrates managed pages to the GPU
// when its kernels touch them, in chunks of up to 2 MiB, and back when the CPU does. Measured on
// an H100 (bench/results/gpu/): with pages left to migrate ("none") or prefetched to the GPU as
// each block lands ("prefetch"), a block read into ring bytes next to pages the GPU was reading
// lost its data (checksum mismatch on the first fetch): the migration moved pages under a read in
// flight, whose DMA went to the page left behind. So how a discrete GPU sees the blocks is a
// policy, SWAPNET_GPU_PREFETCH:
//   host      (default) every managed arena is advised, when it is made, to live in host memory
//             and be mapped for device 0 (cudaMemAdviseSetPreferredLocation host +
//             SetAccessedBy device): nothing migrates, kernels read the blocks over the bus,
//             and O_DIRECT always writes the pages' only copy;
//   advise    read-mostly: the GPU reads duplicates, and a write to a page drops them;
//   prefetch  migrate each landed block to device 0 on the shim's own stream;
//   none      pages migrate on first touch.
// Another value is said once, and the default is used. Integrated GPUs and machines without a
// usable GPU ignore it.
namespace {
enum class Handover { kHost, kNone, kPrefetch, kAdvise };
Handover handover() {
  static const Handover h = [] {
    const char* v = std::getenv("SWAPNET_GPU_PREFETCH");
    const std::string s = v ? v : "";
    if (s.empty() || s == "host") return Handover::kHost;
    if (s == "prefetch") return Handover::kPrefetch;
    if (s == "none") return Handover::kNone;
    if (s == "advise") return Handover::kAdvise;
    log(LogLevel::kWarn, "SWAPNET_GPU_PREFETCH=" + s + " is not host, advise, prefetch or none: host is used");
    return Handover::kHost;
  }();
  return h;
}

bool discrete_with_managed_access() {
  const DeviceInfo& d = cuda_device();
  return d.usable && !d.integrated && d.concurrent_managed_access;
}

#if SWAPNET_WITH_CUDA
#if CUDART_VERSION >= 13000
cudaMemLocation location(cudaMemLocationType type) {  // device 0, or the host
  cudaMemLocation l{};
  l.type = type;
  l.id = 0;
  return l;
}
#endif

void advise_failed(const char* what, cudaError_t err) {
  cudaGetLastError();
  log_once(LogLevel::kWarn, "gpu_advise", std::string(what) + " failed (" + cudaGetErrorString(err) +
                                              "); pages migrate on first touch instead");
}
#endif
}  // namespace

void gpu_managed_made(void* p, std::uint64_t bytes) {
#if SWAPNET_WITH_CUDA
  if (!discrete_with_managed_access() || bytes == 0 || handover() != Handover::kHost) return;
#if CUDART_VERSION >= 13000
  cudaError_t err = cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, location(cudaMemLocationTypeHost));
  if (err == cudaSuccess) err = cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, location(cudaMemLocationTypeDevice));
#else
  cudaError_t err = cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId);
  if (err == cudaSuccess) err = cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, 0);
#endif
  if (err != cudaSuccess) advise_failed("cudaMemAdvise(preferred location host, accessed by device 0)", err);
#else
  (void)p;
  (void)bytes;
#endif
}

void gpu_prefetch(const void* p, std::uint64_t bytes) {
#if SWAPNET_WITH_CUDA
  if (!discrete_with_managed_access() || bytes == 0) return;
  const Handover how = handover();
  if (how == Handover::kNone || how == Handover::kHost) return;
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) s = nullptr;
    return s;
  }();
  cudaError_t err = cudaSuccess;
#if CUDART_VERSION >= 13000
  const cudaMemLocation loc = location(cudaMemLocationTypeDevice);
  if (how == Handover::kAdvise) err = cudaMemAdvise(p, bytes, cudaMemAdviseSetReadMostly, loc);
  if (err == cudaSuccess) err = cudaMemPrefetchAsync(p, bytes, loc, 0, stream);
#else
  if (how == Handover::kAdvise) err = cudaMemAdvise(p, bytes, cudaMemAdviseSetReadMostly, 0);
  if (err == cudaSuccess) err = cudaMemPrefetchAsync(p, bytes, 0, stream);
#endif
  if (err != cudaSuccess) advise_failed("cudaMemAdvise/cudaMemPrefetchAsync", err);
#else
  (void)p;
  (void)bytes;
#endif
}

bool gpu_handover_moves_pages() {
#if SWAPNET_WITH_CUDA
  return discrete_with_managed_access() && handover() != Handover::kHost;
#else
  return false;
#endif
}

bool gpu_handover_may_lose_reads() {
#if SWAPNET_WITH_CUDA
  if (!discrete_with_managed_access()) return false;
  const Handover how = handover();
  return how == Handover::kNone || how == Handover::kPrefetch;
#else
  return false;
#endif
}

}  // namespace swapnet
