// Between the preload's two translation units (preload.cpp, jit_load.cpp); not installed.
#pragma once

namespace swapnet_preload {
// The definition of `symbol` (mangled) in the loaded object that defines it, other than this
// library: RTLD_NEXT, else every loaded object (libtorch dlopened with RTLD_LOCAL, as by Python).
void* find_real(const char* symbol);
// libswapnet_torch.so ($SWAPNET_TORCH_LIB, else next to this library), loaded once, if the
// program's libtorch_cpu is the one it was built with; nullptr (said once) otherwise.
void* load_torch_helper();
}  // namespace swapnet_preload
