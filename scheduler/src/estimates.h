// A model's expected block times for a central scheduler (runtime_worker.cpp), learned as its
// blocks run, contention included (Note [Block estimates under contention] in estimates.cpp).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "swapnet/partitioner.h"

namespace swapnet {
namespace runtime_detail {

// The machine's pace: how much slower (> 1) or faster than their usual times the last blocks of
// every model ran (Note [The machine's pace] in estimates.cpp). One per runtime, shared by its
// models' estimates; under the runtime's lock.
class Pace {
 public:
  // A block ran in `ratio` x its usual time (BlockEstimates::observe's answer; 0: no answer).
  void observe(double ratio);
  double factor() const { return std::exp(log_); }

 private:
  static constexpr double kAlpha = 0.1;
  static constexpr double kStep = 0.2;  // the most one run moves the log pace, / kAlpha
  double log_ = 0;
};

class BlockEstimates {
 public:
  // The cost model's layer table and read time: the seeds of blocks not measured yet. Forgets
  // the blocks' measured times (a learned plan's costs replace the old ones), keeps what was
  // learned of the model as a whole (its scale against the cost model, its contention, its
  // waits for reads).
  void set_costs(std::vector<LayerCost> costs, double ms_per_byte);
  double ms_per_byte() const { return ms_per_byte_; }
  // Expected ms of block [a, b] run while `others` other blocks run beside it (on average), at
  // the machine's pace `pace` (Pace::factor()); `unread`: its bytes not landed yet, where known
  // (< 0: not known; Note [Waits for the disk] in estimates.cpp).
  double expect(int a, int b, bool resident, double others, double pace = 1, double unread = -1) const;
  // Block [a, b] took `ms`, `wait_ms` of them waiting for its bytes to land, while `others`
  // other blocks ran beside it on average; the scheduler had expected `expected` ms of it, with
  // `unread` of its bytes not landed then (< 0: not known).
  // Returns its compute time over its usual one at that company (for Pace::observe), or 0 while
  // the block has no usual time yet (its first two runs).
  double observe(int a, int b, bool resident, double others, double ms, double wait_ms, double expected,
                 double unread = -1);
  // The expected wait for a block's `unread` bytes (> 0): learned from the waits that followed a
  // known number of unread bytes, the cost model's read time per byte as its prior.
  double wait_for_unread(double unread) const;
  // A request of the model was dropped on these estimates: what was learned of the model as a
  // whole counts half as much (its seeds move back towards the cost model's) and each block's
  // slowest recent run counts as a usual one, so that a model whose requests are all dropped,
  // and so never measured again, is not judged on its worst times for ever. Only when no block
  // of the model ran since its last drop: a model that runs is judged on what it does.
  void forgive();
  // A step of the scheduler (one grant: one or more consecutive blocks, Note [Steps of a grant]
  // in runtime_worker.cpp) took `ms`; the sum of its blocks' estimates was `expected`.
  void observe_step(double expected, double ms);
  // Mean |expected - measured| / measured over the steps observed, and how many.
  double error() const { return step_n_ ? step_err_sum_ / static_cast<double>(step_n_) : 0; }
  std::uint64_t steps() const { return step_n_; }
  double measured_ms() const { return step_ms_sum_; }  // the steps' measured times, summed
  // Sum |expected - measured| over sum measured, over the steps: the error per millisecond of
  // work, which is what a request's remaining time (a sum of steps) is off by.
  double time_error() const { return step_ms_sum_ > 0 ? step_err_ms_sum_ / step_ms_sum_ : 0; }
  // The same mean error over each block alone, and how many blocks.
  double block_error() const { return err_n_ ? err_sum_ / static_cast<double>(err_n_) : 0; }
  std::uint64_t observed() const { return err_n_; }
  double contention() const { return gamma_; }  // a block's slow-down per other block beside it

 private:
  using Key = std::tuple<int, int, bool>;  // first, last, resident
  static constexpr size_t kRecent = 9;
  struct Run {
    double compute = 0, wait = 0, others = 0;
  };
  struct Block {
    double compute = 0;  // its usual time at its usual company, waits for reads aside
    double wait = 0;     // its wait for its bytes
    double others = 0;   // the company it usually has (other blocks running beside it)
    double seed = 0;     // its compute time before its first run (unseen())
    Run first;           // its first run, often a cold one (Note [A block's first run])
    std::array<Run, kRecent> recent{};  // its last runs after the first
    std::uint64_t n = 0;  // runs, the first included
  };
  double median(const Block& k, int what) const;
  double factor(double others, double usual) const;
  double seed(int a, int b) const;
  double bytes(int a, int b) const;
  double scale() const;
  Block unseen(int a, int b, bool resident) const;
  std::vector<LayerCost> costs_;
  double ms_per_byte_ = 0;
  double prior_ = 1;  // the cost model's time of one whole inference: the scale's prior weight
  double prior_bytes_ = 1;  // one whole inference's bytes: the wait per byte's prior weight
  std::map<Key, Block> blocks_;
  static constexpr double kDecay = 0.05;
  double solo_sum_ = 0, seed_sum_ = 0;         // decayed: measured compute times (alone) and their seeds
  double wait_sum_ = 0, wait_bytes_sum_ = 0;  // decayed: swapped blocks' waits and their bytes
  // Decayed sums of a least-squares line: each (x, y) counts d times less at every next one.
  struct LineSums {
    double n = 0, x = 0, y = 0, xx = 0, xy = 0;
    void add(double px, double py, double d) {
      n = n * d + 1;
      x = x * d + px;
      y = y * d + py;
      xx = xx * d + px * px;
      xy = xy * d + px * py;
    }
  };
  // Over the swapped blocks that began with a known number of bytes unread (x, MB) and waited
  // y ms for them (Note [Waits for the disk]).
  LineSums waits_;
  double gamma_ = 0;
  double gamma_xy_ = 0, gamma_xx_ = 0;  // decayed sums of the centred regression
  double err_sum_ = 0;
  std::uint64_t err_n_ = 0;
  std::uint64_t observed_at_drop_ = 0;  // err_n_ at the last drop (forgive())
  double step_err_sum_ = 0, step_err_ms_sum_ = 0, step_ms_sum_ = 0;
  std::uint64_t step_n_ = 0;
};

}  // namespace runtime_detail
}  // namespace swapnet
