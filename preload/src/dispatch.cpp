// libswapnet_dispatch.so: copy-free .to(cuda) for tensors in managed memory (swapnet/preload.h).
//
// Note [Copy-free dispatch]
// Tensor::to(kCUDA) on a CPU tensor reaches aten::_to_copy, whose BackendSelect kernel picks the
// dispatch key of the *target* (CUDA), below autograd (which records the usual ToCopyBackward
// around it). PyTorch serves that key with its CompositeExplicitAutograd kernel
// (at::native::_to_copy); a kernel registered for CUDA itself takes precedence, so this library
// registers one (TORCH_LIBRARY_IMPL: the documented route, no patched PyTorch):
//  - a strided CPU tensor whose storage is CUDA managed memory served by libswapnet_preload.so,
//    asked for a CUDA device with no change of dtype or layout, in a memory format it already
//    has, without lazy conj/neg bits: the result is a CUDA tensor over the same bytes (from_blob
//    with a deleter that holds the CPU storage, so the memory lives as long as either tensor).
//    No allocation, no copy. On a discrete GPU the pages are prefetched to it (the preload's
//    swapnet_preload_prefetch: nothing on integrated GPUs, where there is nothing to move).
//  - anything else: at::native::_to_copy, exactly what PyTorch would have run.
// Like Tensor::to on the same device, the result aliases its source: a write through one is
// seen through the other. That holds for .to(kCUDA, /*non_blocking=*/false, /*copy=*/true) as
// well: the copy flag is decided above _to_copy and cannot be seen here; SWAPNET_DISPATCH=off
// restores copies for a program that needs them. On integrated GPUs (concurrentManagedAccess == 0) the host must not
// touch that memory while kernels run; PyTorch's synchronising calls (.cpu(), .item()) are safe.
//
// SWAPNET_DISPATCH=alias-host (a test hook): host memory served by the preload counts as
// aliasable, so the aliasing path runs on a machine without a GPU. The CUDA tensor it makes on a
// CPU-only libtorch cannot compute; the test checks pointer, device and lifetime only.
#include <ATen/ATen.h>
#include <ATen/ops/_to_copy_native.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>

#include "swapnet/preload.h"

extern "C" {
int swapnet_preload_alias_host(void);
int swapnet_preload_cuda_device(void);
int swapnet_preload_prefetch(const void* p, size_t bytes, int device);
}

namespace {

std::atomic<std::uint64_t> g_calls{0}, g_to_cuda{0}, g_aliased{0}, g_copied{0};

bool aliasable(const at::Tensor& self, c10::optional<at::ScalarType> dtype, c10::optional<at::Layout> layout,
               c10::optional<at::MemoryFormat> memory_format) {
  if (self.layout() != at::kStrided || (layout && *layout != at::kStrided)) return false;
  if (dtype && *dtype != self.scalar_type()) return false;
  if (self.is_conj() || self.is_neg() || self.is_quantized() || !self.has_storage()) return false;
  const void* base = self.storage().data();
  if (base == nullptr) return false;
  const bool ours = swapnet_preload_alias_host() ? swapnet_preload_owns(base) : swapnet_preload_is_managed(base);
  if (!ours) return false;
  const at::MemoryFormat f = memory_format.value_or(at::MemoryFormat::Preserve);
  switch (f) {
    case at::MemoryFormat::Preserve: return self.is_non_overlapping_and_dense();
    case at::MemoryFormat::Contiguous: return self.is_contiguous();
    case at::MemoryFormat::ChannelsLast:
    case at::MemoryFormat::ChannelsLast3d: return self.is_contiguous(f);
    default: return false;
  }
}

at::Tensor to_copy(const at::Tensor& self, c10::optional<at::ScalarType> dtype, c10::optional<at::Layout> layout,
                   c10::optional<at::Device> device, c10::optional<bool> pin_memory, bool non_blocking,
                   c10::optional<at::MemoryFormat> memory_format) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (device && device->is_cuda() && self.is_cpu()) {
    g_to_cuda.fetch_add(1, std::memory_order_relaxed);
    if (aliasable(self, dtype, layout, memory_format)) {
      int index = device->has_index() ? device->index() : swapnet_preload_cuda_device();
      if (index < 0) index = 0;
      const at::Device target(at::kCUDA, static_cast<c10::DeviceIndex>(index));
      c10::Storage keep = self.storage();
      swapnet_preload_prefetch(keep.data(), keep.nbytes(), index);  // a hint: failure changes nothing
      at::Tensor out = at::from_blob(
          self.data_ptr(), self.sizes(), self.strides(), [keep](void*) mutable { keep = c10::Storage(); },
          self.options().device(target), target);
      g_aliased.fetch_add(1, std::memory_order_relaxed);
      return out;
    }
    g_copied.fetch_add(1, std::memory_order_relaxed);
  }
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, CUDA, m) { m.impl("_to_copy", TORCH_FN(to_copy)); }

extern "C" __attribute__((visibility("default"))) void swapnet_dispatch_stats(std::uint64_t out[4]) {
  out[0] = g_calls.load();
  out[1] = g_to_cuda.load();
  out[2] = g_aliased.load();
  out[3] = g_copied.load();
}
