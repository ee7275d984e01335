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
// library may make for its host. So where OpenBLAS keeps threads of its own, a compute thread
// frees its OpenMP helpers before a step whose first layer calls BLAS, unless the step before it
// was the same model's and began with BLAS too (ComputeThreads::loop). Only then: freeing them
// before every other model's step (9a897e1) made the convolution models' blocks 13-25 % slower.
// That is now the fallback, for a runtime told to keep OpenBLAS's threads (next note).
//
// Note [BLAS on the compute thread]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Freeing the helpers did not end it. serve's block log (2026-11-29, self_driving_slo at load 0.9,
// one worker on both cores): a small block right after the end of a resnet101 inference (a linear
// layer, so the helpers were freed before it and made anew after it) ran a median 8.6x its usual
// time, after the other models' ends 1.4-1.5x; vgg19's linear blocks (4 MiB parts of 0.4-2 ms)
// right after a step of resnet101 a median 7.7x (p90 56x), after yolov3's 1.0x. perf, aligned with
// the log: the compute thread and its OpenMP helper spent ~90 % of those blocks spinning in
// libgomp, each waiting for the other, with OpenBLAS's thread and helpers made anew after each
// freeing. These switches made vgg19's estimates 0.19-0.24 off per step, the last of issue 48's
// criteria left. With OpenBLAS on one thread (the compute thread, which calls it) the slow switches
// were gone: three rounds interleaved, vgg19's step error 0.114-0.149 against 0.194-0.242, slo_met
// (median) 0.819 against 0.783, the XRBench score 0.632 against 0.564; in the day's sweep every
// model of the 8 runs under the defaults within 0.150 per step (bench/results/blas_threads.md). A
// linear layer's part of vgg19 takes ~1.6x as long on one thread there (0.40-0.43 -> 0.66-0.71 ms),
// yet on this 2-vCPU VM a model of nothing but 2048x2048 linear layers ran faster on one BLAS
// thread than on two (batch 32: 46 against 49 ms; batch 1: 29 against 32), the second competing
// with the OpenMP helpers. So under a central scheduler the runtime sets OpenBLAS to one thread
// while it is open (RuntimeOptions::blas_threads, BlasThreads: process-wide, as OpenBLAS has one
// setting, put back by the last runtime to close where nobody changed it meanwhile), unless the
// user chose OpenBLAS's threads in the environment; the helpers are then not freed before BLAS
// (blas_has_own_threads() is false). Under "threads" every model's thread computes at once and
// nothing is changed. Measured on this 2-vCPU VM only: on more cores one thread may cost a model
// whose time is in products (blas_threads chooses). serve measures its load's direct latencies
// before the runtime opens, with OpenBLAS's own threads. OpenBLAS's setting changes while other
// threads of the host may be inside it: their calls run with the old or the new number.
#include <ATen/Parallel.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "intra_op.h"
#include "swapnet/scheduler.h"

namespace swapnet {

namespace {

struct OpenMp {
  int (*pause_all)(int) = nullptr;  // omp_pause_resource_all(omp_pause_soft = 1)
  void (*set_threads)(int) = nullptr;
  int (*blas_parallel)() = nullptr;  // openblas_get_parallel: 0 serial, 1 pthreads, 2 OpenMP
  int (*blas_threads)() = nullptr;   // openblas_get_num_threads
  void (*blas_set_threads)(int) = nullptr;  // openblas_set_num_threads
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
    r.blas_set_threads = reinterpret_cast<void (*)(int)>(dlsym(from, "openblas_set_num_threads"));
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

namespace {
// libtorch's BLAS is OpenBLAS's pthread build, whose threads can be read and set.
bool pthread_blas(const OpenMp& o) {
  return o.blas_parallel != nullptr && o.blas_threads != nullptr && o.blas_set_threads != nullptr &&
         o.blas_parallel() == 1;
}

// Who holds OpenBLAS's threads (BlasThreads): the first holder sets them and remembers what they
// were; holders asking the same join it; the last one out puts them back. Two runtimes open at
// once: the first one closed leaves them to the second.
struct BlasHold {
  std::mutex mu;
  int holders = 0;
  int before = 0, set = 0;
};
BlasHold& blas_hold() {
  static BlasHold h;
  return h;
}

bool set_in_environment(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';  // OpenBLAS takes an empty value as unset
}

// What BlasThreads(n) holds OpenBLAS's threads at (0: it leaves them).
int blas_target(int n) {
  if (n == 0 || !pthread_blas(openmp())) return 0;  // left as they are: asked to, or nothing to set
  // < 0: one, unless the user chose OpenBLAS's threads (OpenBLAS reads these when it is loaded;
  // OMP_NUM_THREADS, which it reads too where neither is set, is taken as libtorch's setting).
  if (n < 0 && (set_in_environment("OPENBLAS_NUM_THREADS") || set_in_environment("GOTO_NUM_THREADS"))) return 0;
  return n < 0 ? 1 : n;
}
}  // namespace

bool blas_has_own_threads() {
  const OpenMp& o = openmp();
  return pthread_blas(o) && o.blas_threads() > 1;
}

BlasThreads::BlasThreads(int n) {
  const int target = blas_target(n);
  if (target == 0) return;
  const OpenMp& o = openmp();
  BlasHold& h = blas_hold();
  std::lock_guard<std::mutex> lk(h.mu);
  if (h.holders > 0) {
    if (h.set != target) {  // held at another number: not fought over
      log(LogLevel::kInfo, "runtime: OpenBLAS's threads stay at " + std::to_string(h.set) +
                               " (another runtime holds them); this one asked for " + std::to_string(target));
      return;
    }
  } else {
    const int now = o.blas_threads();  // under the lock: a runtime closing meanwhile put them back
    if (now == target) return;
    o.blas_set_threads(target);
    h.before = now;
    h.set = o.blas_threads();  // what OpenBLAS took (it caps the number at its build's limit)
  }
  ++h.holders;
  before_ = h.before;
  set_ = h.set;
}

BlasThreads::~BlasThreads() {
  if (set_ == 0) return;
  const OpenMp& o = openmp();
  BlasHold& h = blas_hold();
  std::lock_guard<std::mutex> lk(h.mu);
  // The last holder puts them back, unless someone else changed them meanwhile (theirs stays).
  if (--h.holders == 0 && o.blas_threads() == h.set) o.blas_set_threads(h.before);
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

std::pair<int, int> runtime_blas_threads(const RuntimeOptions& options) {
  if (options.scheduler == "threads") return {0, 0};
  const int target = runtime_detail::blas_target(options.blas_threads);
  const int now = target == 0 ? 0 : openmp().blas_threads();
  return target == now ? std::pair<int, int>{0, 0} : std::pair<int, int>{target, now};
}

void release_intra_op_threads(bool serial) {
  if (serial) runtime_detail::set_intra_op_threads_here(1);
  const OpenMp& o = openmp();
  if (o.pause_all != nullptr && !at::in_parallel_region()) (void)o.pause_all(1);
}

}  // namespace swapnet
