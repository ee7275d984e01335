// The differences between the libtorch versions swapnet builds against: Debian's 1.13 (this
// project's CI) and pip's 2.x (the GPU machines, scripts/gpu-check.sh). Every `#if` on the torch
// version lives here; the code uses the names below.
//
// - c10::Allocator: allocate() lost its const, and copy_data() became pure virtual (2.3).
// - c10::Event gained elapsedTime() (2.x): CUDA events time layers where it has (Note [Timing
//   layers on the GPU] in layer_clock.cpp).
// - torch::jit::load gained a trailing `bool load_debug_files` (2.0), and import_ir_module with
//   extra files `bool load_debug_files, bool restore_shapes` (2.1). The preload defines these
//   functions to stand in front of libtorch's, so its definitions must have libtorch's exact
//   parameters: jit_load.cpp checks each one against libtorch's header before defining it.
//
// A file that needs only the allocator part (cpu_meter.cpp, also built against libc10 alone by
// tests/tsan_unit.sh) defines SWAPNET_TORCH_COMPAT_ALLOCATOR_ONLY first.
#pragma once

// (The path from the include root, which Debian's and pip's layouts share: only
// torch/csrc/api/include, which libc10-only builds lack, would make it <torch/version.h>.)
#include <torch/csrc/api/include/torch/version.h>

#include <cstring>

#define SWAPNET_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// ---- c10::Allocator ------------------------------------------------------------------------
#if SWAPNET_TORCH_AT_LEAST(2, 3)
#define SWAPNET_ALLOCATE_CONST
#define SWAPNET_ALLOCATOR_COPY_DATA \
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
#define SWAPNET_ALLOCATE_CONST const
#define SWAPNET_ALLOCATOR_COPY_DATA
#endif

#ifndef SWAPNET_TORCH_COMPAT_ALLOCATOR_ONLY
#include <c10/core/Event.h>
#include <torch/csrc/jit/serialization/import.h>

#include <stdexcept>
#include <type_traits>
#include <utility>

// ---- c10::Event::elapsedTime ---------------------------------------------------------------
// Found by its signature, not a version: kEventsTime says whether this libtorch's events can time
// (created with EventFlag::BACKEND_DEFAULT), event_ms the milliseconds from `a` to `b`.
namespace swapnet {
namespace compat {
template <typename E, typename = void>
struct HasElapsedTime : std::false_type {};
template <typename E>
struct HasElapsedTime<E, std::void_t<decltype(std::declval<const E&>().elapsedTime(std::declval<const E&>()))>>
    : std::true_type {};
inline constexpr bool kEventsTime = HasElapsedTime<c10::Event>::value;
template <typename E>
double event_ms(const E& a, const E& b) {
  if constexpr (HasElapsedTime<E>::value) {
    return a.elapsedTime(b);
  } else {
    throw std::runtime_error("this libtorch's events cannot time (c10::Event::elapsedTime is libtorch 2.x's)");
  }
}
}  // namespace compat
}  // namespace swapnet

#include <memory>
#include <string>

// ---- torch::jit::load and import_ir_module (from a file) -----------------------------------
// SWAPNET_LOAD_FLAG_PARAMS / SWAPNET_IMPORT_FLAG_PARAMS: the trailing parameters of the
// interposed definitions; SWAPNET_LOAD_FLAGS / SWAPNET_IMPORT_FLAGS: their values, as JitFlags.
#if SWAPNET_TORCH_AT_LEAST(2, 0)
#define SWAPNET_LOAD_FLAG_PARAMS , bool load_debug_files
#define SWAPNET_LOAD_FLAGS (::swapnet::compat::JitFlags{load_debug_files, false})
#else
#define SWAPNET_LOAD_FLAG_PARAMS
#define SWAPNET_LOAD_FLAGS (::swapnet::compat::JitFlags{})
#endif
#if SWAPNET_TORCH_AT_LEAST(2, 1)
#define SWAPNET_IMPORT_FLAG_PARAMS , bool load_debug_files, bool restore_shapes
#define SWAPNET_IMPORT_FLAGS (::swapnet::compat::JitFlags{load_debug_files, restore_shapes})
#else
#define SWAPNET_IMPORT_FLAG_PARAMS
#define SWAPNET_IMPORT_FLAGS (::swapnet::compat::JitFlags{})
#endif

namespace swapnet {
namespace compat {

using torch::jit::CompilationUnit;
using torch::jit::ExtraFilesMap;
using torch::jit::Module;
using Device = c10::optional<c10::Device>;

// What a program passed in the trailing flags (the defaults where this libtorch has none).
struct JitFlags {
  bool load_debug_files = true;
  bool restore_shapes = false;
};

// The interposed functions' types: torch::jit::load with and without extra files, and
// torch::jit::import_ir_module with extra files (what Python's torch.jit.load calls).
#if SWAPNET_TORCH_AT_LEAST(2, 0)
using Load3 = Module (*)(const std::string&, Device, ExtraFilesMap&, bool);
using Load2 = Module (*)(const std::string&, Device, bool);
#else
using Load3 = Module (*)(const std::string&, Device, ExtraFilesMap&);
using Load2 = Module (*)(const std::string&, Device);
#endif
#if SWAPNET_TORCH_AT_LEAST(2, 1)
using Import4 = Module (*)(std::shared_ptr<CompilationUnit>, const std::string&, Device, ExtraFilesMap&, bool, bool);
#else
using Import4 = Module (*)(std::shared_ptr<CompilationUnit>, const std::string&, Device, ExtraFilesMap&);
#endif

inline Module call_load3(void* fn, const std::string& file, Device device, ExtraFilesMap& extra, const JitFlags& f) {
#if SWAPNET_TORCH_AT_LEAST(2, 0)
  return reinterpret_cast<Load3>(fn)(file, device, extra, f.load_debug_files);
#else
  (void)f;
  return reinterpret_cast<Load3>(fn)(file, device, extra);
#endif
}

inline Module call_load2(void* fn, const std::string& file, Device device, const JitFlags& f) {
#if SWAPNET_TORCH_AT_LEAST(2, 0)
  return reinterpret_cast<Load2>(fn)(file, device, f.load_debug_files);
#else
  (void)f;
  return reinterpret_cast<Load2>(fn)(file, device);
#endif
}

inline Module call_import4(void* fn, std::shared_ptr<CompilationUnit> cu, const std::string& file, Device device,
                           ExtraFilesMap& extra, const JitFlags& f) {
#if SWAPNET_TORCH_AT_LEAST(2, 1)
  return reinterpret_cast<Import4>(fn)(std::move(cu), file, device, extra, f.load_debug_files, f.restore_shapes);
#else
  (void)f;
  return reinterpret_cast<Import4>(fn)(std::move(cu), file, device, extra);
#endif
}

}  // namespace compat
}  // namespace swapnet
#endif  // SWAPNET_TORCH_COMPAT_ALLOCATOR_ONLY
