// A model's expected block times (estimates.h).
//
// Note [Block estimates under contention]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A central scheduler ranks requests by their expected remaining time and drops those that can
// no longer meet their deadline (Note [Dispatch policies] in dispatch.cpp), so its estimates
// decide who runs. Band keeps one EWMA per subgraph (alpha 0.1) seeded from a profile. Measured
// on 2026-11-27 (self_driving_slo.json, lst, two workers) that gave mean errors of 0.57 to 3.4
// per block: the seed (the cost model's execution time at its own thread count, or the block's
// read when that is longer, though the read mostly overlaps earlier blocks) was 2-4x off, alpha
// 0.1 forgot it only after tens of runs, and a model whose requests were all dropped never ran,
// so never corrected it: resnet101, which meets its deadline alone, was served 14 %.
// What we keep instead, per model:
// - each block's last nine runs: compute time, wait for its bytes (the executor's read wait
//   during the step) and company; its estimate is their median (of two runs the faster). On
//   this VM a 2 ms block took 100-270 ms now and then (its thread preempted): an EWMA followed
//   those (per-block errors of 2-13x for blocks of a few ms), a median does not;
// - the model's scale against the cost model: measured compute over seeds, as a ratio of
//   decayed sums with one whole inference's seeds as its prior weight (a first version averaged
//   log ratios from the first block: a cold first run 6x its seed scaled every seed 6-fold and
//   every later request of three models of four was dropped). A block not measured yet (a new
//   plan's, a dropped model's) is seeded with its execution time x scale, and a swapped one
//   with the model's measured wait per byte (one inference's bytes waited for in no time as
//   its prior, at most the cost model's read time: a first version extrapolated the first
//   block's 1.2 ms wait for 7 KB to 85 s for vgg19's blocks, and dropped all its requests);
// - its contention: `others` is the mean number of other blocks running beside a block (the
//   runtime integrates the blocks running over time: beside one other for half its time is
//   0.5); a block's compute is its usual time (the median of its runs, each brought to the
//   block's usual company) x (1 + gamma x (others - usual company)). gamma is a least-squares
//   slope over the model's runs: how much more a run took than its block's usual time, against
//   how much more company it had than usual. Centred on each block's usual company, so a block
//   always run with the same company teaches nothing: a first version fitted gamma against
//   "alone" times that were never measured and drifted on noise to its clamp (3x, every
//   estimate doubled).
// A block's estimate is that compute at the company the scheduler expects when it ranks the
// request (the blocks running then), plus its wait. A dropped request halves the model's evidence (forgive()), so
// a model that is dropped because its times were measured under a burst gets back to its cost
// model's times and runs again, where it is measured again. Only a model that has not run since
// its last drop is forgiven: a model that runs between its drops is measured, and forgiving it
// anyway (each drop counting a block's slowest recent run as its fastest) wiped its waits for
// the disk. On 2026-11-28 at 0.85 GB/s, self_driving_slo at load 0.9, vgg19 dropped 15-23
// requests in 30 s while running the others; its classifier blocks, which waited 3-5 ms for
// their bytes, came to be expected at their 0.8 ms of compute, and since the pace learns from
// every model, the others' estimates moved with it (fcn_resnet101, never dropped: 0.23-0.27
// per step, 0.11-0.18 with this rule; three interleaved rounds each).
//
// Note [Waits for the disk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A swapped block waits for whatever of its bytes has not landed when it starts: nothing when
// its model waited in the queue long enough for the read-ahead, several ms when it follows its
// previous block at once. A block's median wait is one or the other (vgg19's classifier parts,
// 2026-11-28, disk at 0.85 GB/s: 0 in some runs and 3-5 ms in others, its estimate off by 0.5-1.8
// per block). The scheduler knows, where the locks are free (Executor::try_next_block_unread_bytes),
// how many bytes of the next block are still unread when it counts that block (when it grants the
// step, and when the step goes on to it): none, no wait; else a line in the unread bytes, fitted by
// decayed least squares over the model's waits after a known unread (a request's latency plus
// the bytes at the disk's rate while busy: 0.6 ms + 1.1 ms per MB in one run), with two reads at
// the cost model's rate as its prior. Replayed on three runs' logs, vgg19's wait was off by a mean
// 0.68-0.75 of its blocks' times with the median, 0.16-0.20 with a rate alone, 0.10-0.14 with the
// line, 0.12-0.15 with a per-block median of waits that began unread. Where the bytes are not
// known (the rest of a request's blocks, a busy lock), the block's median wait stands.
//
// Note [A block's first run]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A block's first run is mostly a cold one: its layers' first execution in the process (oneDNN
// makes its primitives, the allocator maps the activations). self_driving_slo.json at load 0.9,
// 30 s, 2026-11-27: first runs took a median 1.77x (p90 7.8x) the block's seed and its later
// runs 1.34x; estimating the second run by the first was off by a mean 1.26 (a 25 ms cold run
// against 2 ms warm ones). So the first run stays apart: alone, the block's estimate is the
// geometric mean of it and the seed; from the second run on, the median is over the later runs
// only (the first two runs' mean error 1.06 -> ~0.35 replayed on that run's log). It still
// counts in the model's scale against the cost model, so that the blocks not run yet, whose
// first runs are to come, are seeded with what first runs cost.
//
// Note [The machine's pace]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// On this 2-vCPU VM a block's time is bimodal: the same 55 ms block took 96-101 ms in bursts,
// a 10 ms one 20-24 ms, when the process got one core instead of two (its CPU time over wall
// time fell below 1 for those runs). The bursts last for tens of blocks (the lag-1 correlation
// of log(run / block's median) across consecutive blocks, whatever their model, was 0.28, and
// still 0.23 at lag 10), so a block's own history, however well averaged, misses them: the
// best constant per block, chosen in hindsight, was off by a mean 0.158 (0.193 on a second
// run), the floor of any per-block estimate. The pace is what the last blocks of every model
// showed: an exponential average (alpha 0.1) of log(compute / the block's usual compute at its
// company), each clamped to [1/e, e]; every compute estimate is multiplied by exp of it.
// Replayed on the two runs' logs: 0.183 -> 0.172 (blocks from their fourth run on) and 0.228 ->
// 0.209 (after the warm-up) per block; alpha 0.05 and 0.2 did worse. One run moves the pace by
// at most kAlpha x kStep (0.02 in log): a block preempted for 20 ms in a 0.5 ms run (2 % of
// blocks on 2026-11-28) had moved it by 0.1, and every estimate with it, for the next tens of
// blocks; a burst that lasts still moves it all the way. Replayed on six runs' block logs
// (self_driving_slo and two_rates at load 0.9, 2026-11-28): the median over models per step
// 0.094-0.163 -> 0.085-0.153, per block 0.109-0.184 -> 0.099-0.173; a step of 0.5 or no limit
// did worse, and clamping the run's log ratio itself to +-0.3 about the same but caps the pace
// at 1.35 however long a burst lasts. Measured, both changes
// together: bench/results/estimates.md. Learned from all models since the cores are shared:
// the contention a model's blocks meet is what the others' blocks met just before.
#include "estimates.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace swapnet {
namespace runtime_detail {

namespace {

// Band's alpha from the tenth sample on; the running mean before.
double alpha(std::uint64_t n) { return std::max(0.1, 1.0 / static_cast<double>(n + 1)); }

}  // namespace

void Pace::observe(double ratio) {
  if (!(ratio > 0)) return;
  log_ += kAlpha * std::clamp(std::clamp(std::log(ratio), -1.0, 1.0) - log_, -kStep, kStep);
}

void BlockEstimates::set_costs(std::vector<LayerCost> costs, double ms_per_byte) {
  costs_ = std::move(costs);
  ms_per_byte_ = ms_per_byte;
  blocks_.clear();
  prior_ = std::max(1.0, seed(0, static_cast<int>(costs_.size()) - 1));
  prior_bytes_ = std::max(1.0, bytes(0, static_cast<int>(costs_.size()) - 1));
}

// The cost model's execution time of layers [a, b], and their bytes.
double BlockEstimates::seed(int a, int b) const {
  double exec = 0;
  for (int k = std::max(0, a); k <= b && k < static_cast<int>(costs_.size()); ++k) exec += costs_[static_cast<size_t>(k)].exec_ms;
  return std::max(exec, 0.01);
}
double BlockEstimates::bytes(int a, int b) const {
  double n = 0;
  for (int k = std::max(0, a); k <= b && k < static_cast<int>(costs_.size()); ++k) n += static_cast<double>(costs_[static_cast<size_t>(k)].bytes);
  return n;
}

double BlockEstimates::scale() const {
  return std::clamp((solo_sum_ + prior_) / (seed_sum_ + prior_), 0.1, 10.0);
}

BlockEstimates::Block BlockEstimates::unseen(int a, int b, bool resident) const {
  Block u;
  u.compute = seed(a, b) * scale();
  // The wait per byte with one whole inference's bytes waited for in no time as its prior, and
  // never more than the block's whole read at the cost model's rate.
  u.wait = resident ? 0.0 : bytes(a, b) * std::min(ms_per_byte_, wait_sum_ / (wait_bytes_sum_ + prior_bytes_));
  u.others = 0;
  return u;
}

// The factor by which company `others` changes a block usually run with company `usual`.
double BlockEstimates::factor(double others, double usual) const {
  return std::max(0.25, 1 + gamma_ * (std::max(0.0, others) - usual));
}

// The median of the block's last runs' compute times, each brought to its usual company (what
// = 0), or of their waits (1); its first run only while it has no other (Note [A block's first
// run]). The block has run (k.n >= 1).
double BlockEstimates::median(const Block& k, int what) const {
  const double floor = what == 0 ? 0.01 : 0.0;
  if (k.n == 1) {
    if (what == 1) return k.first.wait;
    return std::max(floor, std::sqrt(std::max(floor, k.first.compute / factor(k.first.others, k.others)) * k.seed));
  }
  const size_t n = static_cast<size_t>(std::min<std::uint64_t>(k.n - 1, kRecent));
  std::array<double, kRecent> v{};
  for (size_t j = 0; j < n; ++j) {
    const Run& r = k.recent[j];
    v[j] = what == 0 ? r.compute / factor(r.others, k.others) : r.wait;
  }
  const size_t mid = (n - 1) / 2;  // of two runs, the faster: the other may be a slow one
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.begin() + static_cast<std::ptrdiff_t>(n));
  return std::max(floor, v[mid]);
}

double BlockEstimates::wait_for_unread(double unread) const {
  const double x = unread / 1e6, per_mb = ms_per_byte_ * 1e6;
  // The prior: two blocks of 1 and 4 MB waited for at the cost model's rate.
  const double n = waits_.n + 2, sx = waits_.x + 5, sy = waits_.y + 5 * per_mb, sxx = waits_.xx + 17,
               sxy = waits_.xy + 17 * per_mb;
  const double det = n * sxx - sx * sx;
  double slope = det > 1e-9 ? (n * sxy - sx * sy) / det : sy / sx;
  slope = std::clamp(slope, 0.25 * per_mb, 4 * per_mb);
  const double at0 = std::max(0.0, (sy - slope * sx) / n);
  return at0 + slope * x;
}

double BlockEstimates::expect(int a, int b, bool resident, double others, double pace, double unread) const {
  auto it = blocks_.find(Key{a, b, resident});
  const Block k = it != blocks_.end() ? it->second : unseen(a, b, resident);
  double wait = k.wait;
  if (unread >= 0 && !resident) {  // Note [Waits for the disk]
    wait = unread <= 0 ? 0.0 : wait_for_unread(unread);
  }
  return k.compute * factor(others, k.others) * pace + wait;
}

double BlockEstimates::observe(int a, int b, bool resident, double others, double ms, double wait_ms, double expected,
                               double unread) {
  if (!(ms > 0)) return 0;
  err_sum_ += std::abs(expected - ms) / ms;
  ++err_n_;
  others = std::max(0.0, others);
  wait_ms = std::clamp(wait_ms, 0.0, ms);
  const double compute = std::max(0.01, ms - wait_ms);
  auto it = blocks_.find(Key{a, b, resident});
  if (it == blocks_.end()) it = blocks_.emplace(Key{a, b, resident}, unseen(a, b, resident)).first;
  Block& k = it->second;
  double pace = 0;
  if (k.n >= 2) {
    pace = compute / (k.compute * factor(others, k.others));
    // Contention: this run's time against the block's usual one, by how much more (or less)
    // company it had than usual. Centred, so that a block always run with the same company
    // teaches nothing (and gamma cannot drift on noise); an outlier counts as at most 2x.
    const double x = others - k.others, y = std::clamp(compute / k.compute - 1, -0.5, 1.0);
    gamma_xy_ = gamma_xy_ * (1 - kDecay) + x * y;
    gamma_xx_ = gamma_xx_ * (1 - kDecay) + x * x;
    if (gamma_xx_ > 1) gamma_ = std::clamp(gamma_xy_ / gamma_xx_, 0.0, 3.0);
  }
  k.others += alpha(k.n) * (others - k.others);  // the first run replaces the seed's (none)
  if (k.n == 0) {
    k.seed = k.compute;
    k.first = {compute, wait_ms, others};
  } else {
    k.recent[(k.n - 1) % kRecent] = {compute, wait_ms, others};
  }
  ++k.n;
  k.compute = median(k, 0);
  k.wait = median(k, 1);
  solo_sum_ = solo_sum_ * (1 - kDecay) + compute / factor(others, 0);
  seed_sum_ = seed_sum_ * (1 - kDecay) + seed(a, b);
  if (!resident) {
    wait_sum_ = wait_sum_ * (1 - kDecay) + wait_ms;
    wait_bytes_sum_ = wait_bytes_sum_ * (1 - kDecay) + bytes(a, b);
    if (unread > 0) waits_.add(unread / 1e6, wait_ms, 1 - kDecay);
  }
  return pace;
}

void BlockEstimates::observe_step(double expected, double ms) {
  if (!(ms > 0)) return;
  step_err_sum_ += std::abs(expected - ms) / ms;
  step_err_ms_sum_ += std::abs(expected - ms);
  step_ms_sum_ += ms;
  ++step_n_;
}

void BlockEstimates::forgive() {
  const bool ran = err_n_ != observed_at_drop_;  // Note [Block estimates under contention]
  observed_at_drop_ = err_n_;
  if (ran) return;
  solo_sum_ /= 2;
  seed_sum_ /= 2;
  wait_sum_ /= 2;
  wait_bytes_sum_ /= 2;
  // Each block's slowest recent run counts as its fastest (its only run: half-way to its seed).
  for (auto& [key, k] : blocks_) {
    if (k.n == 1) {  // maybe the cold first run
      const Block u = unseen(std::get<0>(key), std::get<1>(key), std::get<2>(key));
      k.first.compute = (k.first.compute + u.compute) / 2;
      k.first.wait = (k.first.wait + u.wait) / 2;
    }
    const size_t n = k.n > 1 ? static_cast<size_t>(std::min<std::uint64_t>(k.n - 1, kRecent)) : 0;
    size_t worst = 0, best = 0;
    auto total = [&](size_t j) { return k.recent[j].compute + k.recent[j].wait; };
    for (size_t j = 1; j < n; ++j) {
      if (total(j) > total(worst)) worst = j;
      if (total(j) < total(best)) best = j;
    }
    if (n > 0) k.recent[worst] = k.recent[best];
    if (k.n > 0) {
      k.compute = median(k, 0);
      k.wait = median(k, 1);
    }
  }
}

}  // namespace runtime_detail
}  // namespace swapnet
