// swapnet/preload.h — the LD_PRELOAD library (libswapnet_preload.so) that routes PyTorch's CPU
// tensor allocations to unified memory, so that an unmodified libtorch program needs no second
// copy when a tensor moves to the GPU of a shared-memory board.
//
//   LD_PRELOAD=/path/to/libswapnet_preload.so ./their_program
//
// How: libc10 exports c10::alloc_cpu(size_t) and c10::free_cpu(void*) and calls them through the
// PLT (Debian's 1.13 and the pip wheels alike), so the preloaded definitions win for every CPU
// tensor — made by torch::jit::load, by ops, or by torch::nn modules. Nothing is linked into the
// program and the library does not load libtorch itself: a program without libtorch is unaffected.
//
// Configuration (environment, read once at the first allocation):
//   SWAPNET_ALLOC=managed|host|off   default: managed when a usable GPU exists, else host.
//                                    managed: cudaMallocManaged (CUDA runtime found by dlopen);
//                                    host: 64-byte aligned anonymous memory; off: c10's own.
//   SWAPNET_ALLOC_STATS=1            one line on stderr at exit:
//     swapnet-preload: backend=<managed|host|off> allocations=<n> frees=<n> bytes=<n> peak_bytes=<n>
//   (allocations/frees count non-empty requests served by swapnet; bytes is their total; zero-byte
//   requests — about half of all calls — return nullptr as c10 does and are not counted.)
// A request it cannot serve (managed memory exhausted or beyond what the GPU has free) goes to
// c10's own allocator; a free of memory it did not allocate goes to c10's free_cpu.
//
// Copy-free .to(kCUDA): the preload loads libswapnet_dispatch.so (from its own directory, or
// $SWAPNET_DISPATCH_LIB) after the first allocation, if the program's libtorch is the one it was
// built with. Its kernel for aten::_to_copy makes a CPU tensor in managed memory a CUDA tensor
// over the same bytes (no allocation, no copy; the CPU storage lives as long as the alias).
//   SWAPNET_DISPATCH=auto|on|off|alias-host   default auto: loaded where it can alias (managed
//                                    memory); on: whenever swapnet serves; off: never;
//                                    alias-host: a test hook that aliases host memory too.
//   With SWAPNET_ALLOC_STATS=1, a second line when it is loaded:
//     swapnet-dispatch: calls=<n> to_cuda=<n> aliased=<n> copied=<n>
//
// The functions below let a program (or a test) ask the preloaded library, without linking it:
// look them up with dlsym(RTLD_DEFAULT, "swapnet_preload_owns") — absent when not preloaded.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// 1 if `p` points into memory this library allocated for a tensor (and not freed since).
int swapnet_preload_owns(const void* p);
// 1 if that memory is CUDA managed memory.
int swapnet_preload_is_managed(const void* p);

struct swapnet_preload_stats {
  const char* backend;  // "managed", "host" or "off"
  uint64_t allocations, frees, bytes, peak_bytes, current_bytes;
};
void swapnet_preload_get_stats(struct swapnet_preload_stats* out);

#ifdef __cplusplus
}
#endif
