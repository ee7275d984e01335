// Intra-op (OpenMP) threads per thread, inside the scheduler module (Note [One OpenMP pool per
// core] in intra_op.cpp; the public call is release_intra_op_threads in scheduler.h).
#pragma once

#include <string>

namespace swapnet {
namespace runtime_detail {

// The calling thread's intra-op threads from now on (n >= 1), leaving the process's default (and
// libtorch's shared thread pool) as they are, unlike at::set_num_threads.
void set_intra_op_threads_here(int n);

// Whether libtorch's BLAS keeps threads of its own that compete with the OpenMP pool for cores:
// OpenBLAS's pthread build with more than one thread (Note [BLAS beside the OpenMP pool]).
bool blas_has_own_threads();

// OpenBLAS's own threads (its pthread build; process-wide, as OpenBLAS has one setting) while the
// object lives: set by the first of those alive at once and put back by the last, where nobody
// changed them meanwhile (Note [BLAS on the compute thread] in intra_op.cpp). n > 0: n; 0: left
// as they are; < 0: one, unless the user chose them (OPENBLAS_NUM_THREADS or GOTO_NUM_THREADS in
// the environment). One asking for another number than those alive hold leaves them.
class BlasThreads {
 public:
  explicit BlasThreads(int n);
  ~BlasThreads();
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;
  int before() const { return before_; }  // what they were before the first holder (0: not held)
  int set() const { return set_; }        // what they are held at (0: not held)

 private:
  int before_ = 0, set_ = 0;
};

// Whether a layer of these node kinds (ImageLayer::ops, comma-separated) calls BLAS: a linear
// layer or a matrix product.
bool calls_blas(const std::string& ops);

}  // namespace runtime_detail
}  // namespace swapnet
