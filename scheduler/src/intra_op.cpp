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
//
// Note [BLAS beside the OpenMP pool]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// libtorch's linear layers call BLAS; Debian's default OpenBLAS is its pthread build, with a
// thread pool of its own beside the OpenMP one. Once the OpenMP helpers spin again (above),
// they hold the cores for a few ms after a parallel op, and OpenBLAS's threads wait behind them:
// self_driving_slo at load 0.9 (2026-11-28), vgg19's linear blocks took a median 4.5 ms more
// (0.7 -> 5-6 ms) when the compute thread had just run another model's convolutions, and only
// then; its estimates were off by 0.46 per block. OpenBLAS's OpenMP build runs on the calling
// thread's pool instead (the extra -0.08 ms, 0.23 per block, slo_met 0.775 -> 0.899 in the same
// hour), but with libgomp a process that forks after threads ran matrix products hangs in the
// child's first product (tests/preload/torch_program.py did, in a fresh clone): not a choice a
// library may make for its host. One OpenBLAS thread removed the extra too (0.3 ms), but made
// the linear blocks 1.6x slower. So where OpenBLAS has threads of its own, a compute thread frees its
// OpenMP helpers before a step whose first layer calls BLAS, unless the step before it was the
// same model's and began with BLAS too: the helpers of the last convolutions (another model's,
// or vgg19's own features before its classifier) no longer spin on the cores the linear layers
// need (ComputeThreads::loop). Only then: freeing them before every other model's
// step (9a897e1) made the convolution models' blocks 13-25 % slower, not only the first after
// a switch (self_driving_slo at load 0.9, 2026-11-28, three interleaved rounds against the
// commit before: slo_met 0.600/0.701/0.594 against 0.808/0.883/0.835), more than the 4.3 ms
// it saved on each of vgg19's linear blocks after a switch.
#include <ATen/Parallel.h>

#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "intra_op.h"
#include "swapnet/scheduler.h"

namespace swapnet {

namespace {

struct OpenMp {
  int (*pause_all)(int) = nullptr;  // omp_pause_resource_all(omp_pause_soft = 1)
  void (*set_threads)(int) = nullptr;
  int (*blas_parallel)() = nullptr;  // openblas_get_parallel: 0 serial, 1 pthreads, 2 OpenMP
  int (*blas_threads)() = nullptr;   // openblas_get_num_threads
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
    r.blas_parallel = reinterpret_cast<int (*)()>(dlsym(from, "openblas_get_parallel"));
    r.blas_threads = reinterpret_cast<int (*)()>(dlsym(from, "openblas_get_num_threads"));
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

bool blas_has_own_threads() {
  const OpenMp& o = openmp();
  return o.blas_parallel != nullptr && o.blas_threads != nullptr && o.blas_parallel() == 1 && o.blas_threads() > 1;
}

bool calls_blas(const std::string& ops) {
  static constexpr std::string_view kBlas[] = {"aten::linear", "aten::addmm", "aten::matmul", "aten::mm",
                                               "aten::bmm",    "aten::baddbmm", "aten::addmv", "aten::mv"};
  const std::string_view all(ops);
  for (std::size_t at = 0; at <= all.size();) {
    const std::size_t end = std::min(all.find(',', at), all.size());
    const std::string_view op = all.substr(at, end - at);
    for (std::string_view b : kBlas) {
      if (op == b) return true;
    }
    at = end + 1;
  }
  return false;
}

}  // namespace runtime_detail

void release_intra_op_threads(bool serial) {
  if (serial) runtime_detail::set_intra_op_threads_here(1);
  const OpenMp& o = openmp();
  if (o.pause_all != nullptr && !at::in_parallel_region()) (void)o.pause_all(1);
}

}  // namespace swapnet
