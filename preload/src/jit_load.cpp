// Transparent swapping: the preload's definitions of torch::jit::load (C++ programs) and
// torch::jit::import_ir_module (what Python's torch.jit.load calls).
//
// Note [Transparent swapping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With SWAPNET_BUDGET set, a model the program loads from a file is handed to
// libswapnet_torch.so (swapnet_transparent_load, python/src/transparent.cpp), which returns a
// module whose forward runs the model swapped within the budget from its swap image, without
// ever loading its weights into the program (on the GPU where the program puts the model there:
// Note [Transparent swapping on the GPU] in python/src/transparent.cpp); when it declines (no
// image and no way to make one, a map_location other than the CPU or the first CUDA device,
// extra files asked for, a budget the model fits anyway or
// cannot run in: each said once on stderr) the model loads normally. Without SWAPNET_BUDGET the
// calls go straight to libtorch.
//
// These functions are declared by libtorch's own header, so their mangled names and calling
// convention are libtorch's on every architecture; the preload still links nothing of libtorch:
// only the header's types are used (no libtorch function is called but through the pointers
// found at run time, and the module is returned without being copied). The real definitions
// are found by their own symbol names (dladdr on these functions), in whatever object defines
// them (RTLD_NEXT, or libtorch dlopened with RTLD_LOCAL by Python). While the helper runs,
// loads it makes itself go straight to libtorch (a thread-local guard).
#include <dlfcn.h>
#include <stdlib.h>

#include <torch/csrc/jit/serialization/import.h>

#include "torch_compat.h"

#include <cstdio>

#include "internal.h"

namespace {

using torch::jit::CompilationUnit;
using torch::jit::ExtraFilesMap;
using torch::jit::Module;

// The helper decides and returns the module: swapped, or what `real` (the interposed libtorch
// function, of the form `kind` names, called with `flags`) returns. The module is only ever
// returned, never held here: constructing or destroying one would make this library need
// libtorch's symbols.
enum Kind : int { kLoad3 = 0, kLoad2 = 1, kImport4 = 2 };
using Hook = Module (*)(void* real, int kind, std::shared_ptr<CompilationUnit> cu, const std::string& file,
                        c10::optional<c10::Device> device, ExtraFilesMap* extra, const swapnet::compat::JitFlags* flags);

// The definitions below stand in front of these declarations of libtorch's header: each must
// have their exact parameters (torch_compat.h), or it would interpose nothing.
// (Unevaluated: a signature libtorch does not declare fails to compile.)
static_assert(sizeof(static_cast<swapnet::compat::Load3>(&torch::jit::load)) > 0, "torch::jit::load(file, device, extra)");
static_assert(sizeof(static_cast<swapnet::compat::Load2>(&torch::jit::load)) > 0, "torch::jit::load(file, device)");
static_assert(sizeof(static_cast<swapnet::compat::Import4>(&torch::jit::import_ir_module)) > 0,
              "torch::jit::import_ir_module(cu, file, device, extra)");

thread_local bool inside = false;

struct Guard {
  Guard() { inside = true; }
  ~Guard() { inside = false; }
};

// The definition that this interposer stands in front of (found once, by its own name).
void* real_of(void* self) {
  Dl_info info{};
  if (dladdr(self, &info) == 0 || info.dli_sname == nullptr) return nullptr;
  return swapnet_preload::find_real(info.dli_sname);
}

[[noreturn]] void missing(const char* what) {
  std::fprintf(stderr, "swapnet-preload: %s: libtorch's definition was not found in this process\n", what);
  abort();  // unreachable in practice: libtorch called us because it is loaded
}

// The helper's entry point when SWAPNET_BUDGET is set and it could be loaded (nullptr otherwise).
Hook hook() {
  static Hook h = [] () -> Hook {
    const char* budget = getenv("SWAPNET_BUDGET");
    if (budget == nullptr || *budget == 0) return nullptr;
    void* lib = swapnet_preload::load_torch_helper();
    return lib ? reinterpret_cast<Hook>(dlsym(lib, "swapnet_transparent_load")) : nullptr;
  }();
  return h;
}

}  // namespace

namespace torch {
namespace jit {

__attribute__((visibility("default"))) Module load(const std::string& filename, c10::optional<c10::Device> device,
                                                   ExtraFilesMap& extra_files SWAPNET_LOAD_FLAG_PARAMS) {
  using Fn = swapnet::compat::Load3;
  static Fn real = reinterpret_cast<Fn>(real_of(reinterpret_cast<void*>(static_cast<Fn>(&load))));
  if (real == nullptr) missing("torch::jit::load");
  const swapnet::compat::JitFlags flags = SWAPNET_LOAD_FLAGS;
  if (!inside) {
    if (Hook h = hook()) {
      Guard g;
      return h(reinterpret_cast<void*>(real), kLoad3, nullptr, filename, device, &extra_files, &flags);
    }
  }
  return swapnet::compat::call_load3(reinterpret_cast<void*>(real), filename, device, extra_files, flags);
}

__attribute__((visibility("default"))) Module load(const std::string& filename,
                                                   c10::optional<c10::Device> device SWAPNET_LOAD_FLAG_PARAMS) {
  using Fn = swapnet::compat::Load2;
  static Fn real = reinterpret_cast<Fn>(real_of(reinterpret_cast<void*>(static_cast<Fn>(&load))));
  if (real == nullptr) missing("torch::jit::load");
  const swapnet::compat::JitFlags flags = SWAPNET_LOAD_FLAGS;
  if (!inside) {
    if (Hook h = hook()) {
      Guard g;
      return h(reinterpret_cast<void*>(real), kLoad2, nullptr, filename, device, nullptr, &flags);
    }
  }
  return swapnet::compat::call_load2(reinterpret_cast<void*>(real), filename, device, flags);
}

__attribute__((visibility("default"))) Module import_ir_module(std::shared_ptr<CompilationUnit> cu,
                                                               const std::string& filename,
                                                               c10::optional<c10::Device> device,
                                                               ExtraFilesMap& extra_files SWAPNET_IMPORT_FLAG_PARAMS) {
  using Fn = swapnet::compat::Import4;
  static Fn real = reinterpret_cast<Fn>(real_of(reinterpret_cast<void*>(static_cast<Fn>(&import_ir_module))));
  if (real == nullptr) missing("torch::jit::import_ir_module");
  const swapnet::compat::JitFlags flags = SWAPNET_IMPORT_FLAGS;
  if (!inside) {
    if (Hook h = hook()) {
      Guard g;
      return h(reinterpret_cast<void*>(real), kImport4, std::move(cu), filename, device, &extra_files, &flags);
    }
  }
  return swapnet::compat::call_import4(reinterpret_cast<void*>(real), std::move(cu), filename, device, extra_files,
                                       flags);
}

}  // namespace jit
}  // namespace torch
