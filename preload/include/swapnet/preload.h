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
// Transparent swapping (SWAPNET_BUDGET): a model the program loads from a file with
// torch::jit::load (C++) or torch.jit.load (Python) runs swapped within the budget, its weights
// never loaded into the program (Note [Transparent swapping] in src/jit_load.cpp; the work is in
// libswapnet_torch.so, loaded from this library's directory or $SWAPNET_TORCH_LIB):
//   SWAPNET_BUDGET=SIZE|N%           per model: bytes, "60MiB", or a percentage of its weights +
//                                    activations. Unset: loads go straight to libtorch.
//   The swap image is made once (`swapnet pack` in a child process: the weights are read there),
//   beside the model if writable, else in $SWAPNET_CACHE_DIR or ~/.cache/swapnet, keyed by the
//   file's content, written atomically, reused; an image MODEL-stem.swapnet beside the model,
//   not older than it, is used as is. It is made when the model loads if
//   SWAPNET_INPUT_SHAPE=1,3,224,224  gives forward's input shape(s) (';' between inputs), else at
//                                    the first forward, from its inputs' shapes (forward's
//                                    signature is read by `swapnet signature` in a child).
//   SWAPNET_BUDGET_SOURCE=file:PATH|meminfo:RESERVE|cgroup:PATH, SWAPNET_BUDGET_PERIOD_MS,
//   SWAPNET_CONTROL=PATH|default     the budget at run time, as `swapnet serve` takes it
//                                    (`swapnet ctl --socket PATH budget 40MiB`); several swapped
//                                    models share a new total in proportion to their budgets
//                                    (one that runs as loaded normally has no share: its
//                                    memory is the whole model's, outside the total; `ctl
//                                    status` says "loaded_normally" and "unswapped_requests").
//   SWAPNET_LEARN=N                  every N inferences (default 3; 0: never) the layer times and
//                                    read rate measured are compared with the image's and the
//                                    device profile's, and the model re-planned with them when its
//                                    predicted time is more than 10 % off (Note [Learning the
//                                    costs in service] in assembly/src/cost_learner.cpp); a value
//                                    other than 0 or 3..1000 is said once and 3 is used.
//   SWAPNET_ALLOC_STATS=1            adds per swapped model, at exit:
//     swapnet-model: MODEL image=IMAGE budget=N blocks=N resident_blocks=N peak_model_bytes=N
//                    bytes_read=N inferences=N device=cpu|cuda|none unswapped=N
//     (inferences: run swapped; unswapped: run as loaded normally, device=none, where the model
//     could not run swapped or its inputs went where it cannot; such a model has no share of a
//     budget set at run time)
// What the program gets is a module with the model's forward (same arguments, same outputs bit
// for bit) and nothing else: parameters(), buffers(), named_modules() and state_dict() are empty,
// other methods of the model are absent, .train() changes nothing, and save() writes the
// wrapper, not the model. Whatever needs the weights must use the model file.
// On the GPU (Note [Transparent swapping on the GPU] in python/src/transparent.cpp): a model
// loaded with map_location "cuda" (or cuda:0) runs swapped there; .to(device) changes nothing
// on the module itself, but the model follows forward's inputs: inputs on the first CUDA
// device move its executor there (and back to the CPU with CPU inputs), outputs where the
// inputs are. Inputs on another device send it to the model loaded normally, said once.
// Declined and loaded normally, said once on stderr: a pack that fails (at the first forward:
// the model is then loaded normally and runs as such), a budget below the model's minimum or
// one it fits in anyway, a malformed budget, a map_location other than the CPU or the first
// CUDA device (or that device where swapnet cannot run: a CPU-only libtorch, no usable GPU),
// extra files asked for, a libtorch other than the one swapnet was built with.
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
