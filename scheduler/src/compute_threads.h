// A central scheduler's compute threads: one per worker, each with its own intra-op (OpenMP)
// pool, running the granted steps of every model (Note [Compute threads] in compute_threads.cpp).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "intra_op.h"

namespace swapnet {
namespace runtime_detail {

// How a step runs on a compute thread: the model's intra-op threads (0: the thread's default),
// the CPU-meter account its allocations are charged to, and the CPUs it is pinned to (none: the
// process's).
struct ComputeSettings {
  int model = -1;  // whose step
  int threads = 0;
  int account = 0;
  const std::vector<int>* cpus = nullptr;
  // Its first layer calls BLAS (a linear layer, a matrix product): a compute thread that comes
  // to it from any other step than the same model's BLAS-first one frees its helpers first
  // (Note [BLAS beside the OpenMP pool]).
  bool blas_first = false;
};

// Pins the calling thread to `cpus`; returns pthread_setaffinity_np's error (0: pinned).
int pin_this_thread(const std::vector<int>& cpus);

class ComputeThreads {
 public:
  // n threads; OpenBLAS's own threads set to `blas_threads` while they run (BlasThreads: Note
  // [BLAS on the compute thread] in intra_op.cpp).
  ComputeThreads(int n, int blas_threads);
  ~ComputeThreads();  // joins the threads; no run() may be under way
  ComputeThreads(const ComputeThreads&) = delete;
  ComputeThreads& operator=(const ComputeThreads&) = delete;
  const BlasThreads& blas() const { return blas_; }

  // Runs `fn` on a free compute thread with these settings and waits for it; rethrows what it
  // threw. Called by at most as many threads at once as there are compute threads (the
  // scheduler's grants), else the extra call waits for a thread. `fn` is called by reference
  // (no copy, no allocation per step).
  template <typename F>
  void run(const ComputeSettings& how, F& fn) {
    run(how, [](void* f) { (*static_cast<F*>(f))(); }, &fn);
  }

 private:
  struct Job {
    const ComputeSettings* how = nullptr;
    void (*call)(void*) = nullptr;
    void* fn = nullptr;
    bool done = false;
    std::exception_ptr error;
  };
  void run(const ComputeSettings& how, void (*call)(void*), void* fn);
  void loop(int k);

  std::mutex mu_;
  std::condition_variable work_;  // a job queued, or stop
  std::condition_variable done_;  // a job done
  std::deque<Job*> jobs_;
  bool stop_ = false;
  const BlasThreads blas_;        // before the threads start, put back after they end
  const bool free_before_blas_;  // Note [BLAS beside the OpenMP pool]: set after blas_
  std::vector<std::thread> threads_;
};

}  // namespace runtime_detail
}  // namespace swapnet
