// The intra-op (OpenMP) threads of the threads that run torch ops beside a Runtime.
//
// Note [One OpenMP pool per core]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every thread that runs a parallel torch op keeps an OpenMP pool of its own: helper threads
// that stay after the op, waiting for the next. libgomp counts the helpers of every pool in the
// process, and when they outnumber the CPUs it stops spinning at its barriers (100 spins, then a
// futex sleep, instead of ~3 ms of spinning): each parallel op then wakes its helpers through the
// kernel, and an inference of many short ops slows down. On this 2-core VM (2026-11-28) serve
// ran resnet101 alone at 174-202 ms where `swapnet run` took 92-139 ms; `run` with
// OMP_WAIT_POLICY=passive took 176-185 ms. gdb showed why: beside the model worker's pool (one
// helper), a client thread that only cloned the inputs kept a pool with one idle helper, so three
// threads counted against two CPUs.
//
// So the threads meant to compute in parallel are the runtime's; a thread that only prepares
// inputs (serve's clients, a caller's thread after Runtime::open) keeps no pool: its helpers are
// freed (omp_pause_resource_all, OpenMP 5.0, which frees the calling thread's pool and takes its
// helpers off libgomp's count) and it runs torch ops on itself alone from then on. The OpenMP
// runtime is the one libtorch itself links (pip's torch carries a libgomp of its own), found
// through libtorch's own dependency tree; where it has neither call, this does nothing.
#include <ATen/Parallel.h>

#include <dlfcn.h>

#include "intra_op.h"
#include "swapnet/scheduler.h"

namespace swapnet {

namespace {

struct OpenMp {
  int (*pause_all)(int) = nullptr;  // omp_pause_resource_all(omp_pause_soft = 1)
  void (*set_threads)(int) = nullptr;
};

// The OpenMP runtime libtorch calls: looked up from libtorch's own library and its dependencies.
const OpenMp& openmp() {
  static const OpenMp o = [] {
    OpenMp r;
    Dl_info info{};
    void* lib = nullptr;
    if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) != 0 && info.dli_fname != nullptr) {
      lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    }
    void* from = lib != nullptr ? lib : RTLD_DEFAULT;
    r.pause_all = reinterpret_cast<int (*)(int)>(dlsym(from, "omp_pause_resource_all"));
    r.set_threads = reinterpret_cast<void (*)(int)>(dlsym(from, "omp_set_num_threads"));
    // The handle stays open: the library was loaded already, and is not unloaded with it.
    return r;
  }();
  return o;
}

}  // namespace

namespace runtime_detail {

void set_intra_op_threads_here(int n) {
  at::internal::lazy_init_num_threads();  // else the thread's first parallel op would set it again
  if (n < 1 || at::get_num_threads() == n) return;
  const OpenMp& o = openmp();
  if (o.set_threads != nullptr) {
    o.set_threads(n);
  } else {
    at::set_num_threads(n);  // no OpenMP runtime of its own found: libtorch's own call
  }
}

}  // namespace runtime_detail

void release_intra_op_threads(bool serial) {
  if (serial) runtime_detail::set_intra_op_threads_here(1);
  const OpenMp& o = openmp();
  if (o.pause_all != nullptr && !at::in_parallel_region()) (void)o.pause_all(1);
}

}  // namespace swapnet
