// swapnet/allocator.h — memory that both processors can address, and what the machine offers.
//
// This is the one place where CUDA is touched (the "CUDA shim"): everything above asks
// cuda_device() and never writes #ifdef CUDA. On a machine without a driver or GPU the probe
// reports "no device" with the reason, once, in the log; that is a normal state, not an error.
// (The budgeted unified-memory arena arrives with issue #4.)
#pragma once

#include <string>

#include "swapnet/swapcore.h"

namespace swapnet {

struct DeviceInfo {
  bool built_with_cuda = false;  // compiled against the CUDA runtime (SWAPNET_WITH_CUDA)
  bool usable = false;           // a GPU answered and can be used
  int count = 0;                 // number of CUDA devices visible
  std::string name;              // device 0's name, when usable
  bool integrated = false;       // shares DRAM with the CPU (Jetson)
  bool concurrent_managed_access = false;  // CPU may touch managed memory while kernels run
  std::string reason;            // why not usable, e.g. "CUDA driver not found (cudaErrorInsufficientDriver)"
};

// Probes CUDA once per process (thread-safe) and logs the outcome once at info level.
SWAPNET_API const DeviceInfo& cuda_device();

}  // namespace swapnet
