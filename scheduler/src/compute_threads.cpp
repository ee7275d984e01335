// A central scheduler's compute threads (compute_threads.h).
//
// Note [Compute threads]
// ~~~~~~~~~~~~~~~~~~~~~~
// Under a central scheduler each model still has a thread of its own: it takes the model's
// requests in turn, waits for a worker for each step (acquire in runtime_worker.cpp), moves the
// model to a new budget, and answers. The step itself, the blocks a grant holds its worker for,
// runs on one of the runtime's compute threads, one per worker. Each compute thread keeps one
// OpenMP pool of the intra-op threads the models ask for, so the process holds as many pools as
// workers, whatever the number of models: with each model's own thread computing, every model's
// thread kept a pool, libgomp counted more helpers than cores and stopped spinning at its
// barriers (Note [One OpenMP pool per core] in intra_op.cpp), and every model ran slower.
//
// A step is handed to a compute thread and waited for: two wake-ups per step (a step is 2 ms of
// work at least, Note [Steps of a grant]). The compute thread takes the model's intra-op threads
// (without touching the process's default), its CPU-meter account (activations are charged to
// the model), and its CPUs where it is pinned, for the step; the model's own thread runs no
// parallel op (release_intra_op_threads(true)).
#include "compute_threads.h"

#include <c10/core/InferenceMode.h>
#include <pthread.h>
#include <sched.h>

#include <string>

#include "intra_op.h"
#include "swapnet/assembly.h"
#include "swapnet/scheduler.h"

namespace swapnet {
namespace runtime_detail {

ComputeThreads::ComputeThreads(int n, int blas_threads)
    : blas_(blas_threads), free_before_blas_(blas_has_own_threads()) {
  for (int k = 0; k < n; ++k) threads_.emplace_back([this, k] { loop(k); });
}

ComputeThreads::~ComputeThreads() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_.notify_all();
  for (auto& t : threads_) t.join();
}

int pin_this_thread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

void ComputeThreads::run(const ComputeSettings& how, void (*call)(void*), void* fn) {
  Job job;
  job.how = &how;
  job.call = call;
  job.fn = fn;
  std::unique_lock<std::mutex> lk(mu_);
  jobs_.push_back(&job);
  work_.notify_one();
  done_.wait(lk, [&] { return job.done; });
  if (job.error) std::rethrow_exception(job.error);
}

namespace {

// Pins the calling thread to `cpus` for a scope (none: left as it is), then back to `all`.
class PinFor {
 public:
  PinFor(const std::vector<int>* cpus, const cpu_set_t& all) : all_(all) {
    if (cpus != nullptr && !cpus->empty()) pinned_ = pin_this_thread(*cpus) == 0;
  }
  ~PinFor() {
    if (pinned_) (void)pthread_setaffinity_np(pthread_self(), sizeof all_, &all_);
  }
  PinFor(const PinFor&) = delete;
  PinFor& operator=(const PinFor&) = delete;

 private:
  const cpu_set_t& all_;
  bool pinned_ = false;
};

}  // namespace

void ComputeThreads::loop(int k) {
  pthread_setname_np(pthread_self(), ("swapnet-cpu" + std::to_string(k)).c_str());
  cpu_set_t all;
  CPU_ZERO(&all);
  (void)pthread_getaffinity_np(pthread_self(), sizeof all, &all);
  c10::InferenceMode guard;
  int last_blas_model = -1;  // the model whose BLAS-first step ran last here (-1: another step)
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    work_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) break;  // stop_, and nothing left to run
    Job* job = jobs_.front();
    jobs_.pop_front();
    lk.unlock();
    try {
      const ComputeSettings& how = *job->how;
      // Note [BLAS beside the OpenMP pool]: not between two of a model's BLAS-first steps in a row.
      if (free_before_blas_ && how.blas_first && how.model != last_blas_model) release_intra_op_threads(false);
      last_blas_model = how.blas_first ? how.model : -1;
      if (how.threads > 0) set_intra_op_threads_here(how.threads);
      PinFor pin(how.cpus, all);
      const int before = set_thread_cpu_account(how.account);
      try {
        job->call(job->fn);
      } catch (...) {
        job->error = std::current_exception();
      }
      set_thread_cpu_account(before);
    } catch (...) {  // the settings' own failures (a thread that cannot start)
      job->error = std::current_exception();
    }
    lk.lock();
    job->done = true;
    done_.notify_all();
  }
}

}  // namespace runtime_detail
}  // namespace swapnet
