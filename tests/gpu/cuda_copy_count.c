/* libcuda_copy_count.so: an LD_PRELOAD hook on the CUDA runtime's copy calls, for
 * scripts/gpu-check.sh. Counts host-to-device copies (cudaMemcpy/cudaMemcpyAsync with
 * cudaMemcpyHostToDevice, and cudaMemcpyDefault copies whose source the runtime says is host
 * memory) and prints one line on stderr at exit:
 *   cuda-copies: h2d=<n> h2d_bytes=<n> other=<n>
 * It only sees a libtorch that calls a shared libcudart through its PLT (the pip wheels do);
 * the check therefore runs a positive control (direct GPU inference, whose .to(kCUDA) copies
 * every weight) and fails if that shows no copies. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

enum { kHostToDevice = 1, kDefault = 4 };
struct Attributes { int type; int device; void* device_pointer; void* host_pointer; };  /* cudaPointerAttributes */

static atomic_ullong h2d, h2d_bytes, other;
static atomic_int registered;

static void report(void) {
  fprintf(stderr, "cuda-copies: h2d=%llu h2d_bytes=%llu other=%llu\n", (unsigned long long)h2d,
          (unsigned long long)h2d_bytes, (unsigned long long)other);
}

static void count(const void* src, size_t bytes, int kind) {
  if (!atomic_exchange(&registered, 1)) atexit(report);
  int host = kind == kHostToDevice;
  if (kind == kDefault) {
    int (*attrs)(struct Attributes*, const void*) =
        (int (*)(struct Attributes*, const void*))dlsym(RTLD_NEXT, "cudaPointerGetAttributes");
    struct Attributes a = {0, 0, 0, 0};
    /* cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1 */
    host = attrs != NULL && attrs(&a, src) == 0 && (a.type == 0 || a.type == 1);
  }
  if (host) {
    atomic_fetch_add(&h2d, 1);
    atomic_fetch_add(&h2d_bytes, bytes);
  } else {
    atomic_fetch_add(&other, 1);
  }
}

int cudaMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  static int (*real)(void*, const void*, size_t, int);
  if (!real) real = (int (*)(void*, const void*, size_t, int))dlsym(RTLD_NEXT, "cudaMemcpy");
  count(src, bytes, kind);
  return real(dst, src, bytes, kind);
}

int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  static int (*real)(void*, const void*, size_t, int, void*);
  if (!real) real = (int (*)(void*, const void*, size_t, int, void*))dlsym(RTLD_NEXT, "cudaMemcpyAsync");
  count(src, bytes, kind);
  return real(dst, src, bytes, kind, stream);
}
