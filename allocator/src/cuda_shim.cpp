// The CUDA shim: the only translation unit that includes the CUDA runtime. Built without CUDA
// (SWAPNET_WITH_CUDA=OFF) it reports "built without CUDA"; built with it on a machine without a
// driver it reports cudaErrorInsufficientDriver. Only cudart is linked: linking libcuda would
// stop the program from starting where no driver is installed.
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

void gpu_prefetch(const void* p, std::uint64_t bytes) {
#if SWAPNET_WITH_CUDA
  const DeviceInfo& d = cuda_device();
  if (!d.usable || d.integrated || !d.concurrent_managed_access || bytes == 0) return;
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) s = nullptr;
    return s;
  }();
#if CUDART_VERSION >= 13000
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = 0;
  cudaError_t err = cudaMemPrefetchAsync(p, bytes, loc, 0, stream);
#else
  cudaError_t err = cudaMemPrefetchAsync(p, bytes, 0, stream);
#endif
  if (err != cudaSuccess) {
    cudaGetLastError();
    log_once(LogLevel::kWarn, "gpu_prefetch", std::string("cudaMemPrefetchAsync failed (") + cudaGetErrorString(err) +
                                                  "); pages migrate on first touch instead");
  }
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace swapnet
