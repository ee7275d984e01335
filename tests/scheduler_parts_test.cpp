// The scheduler's internal parts on their own: the block estimates (Note [Block estimates under
// contention] in estimates.cpp), the memory ledger (Note [The memory ledger] in ledger.cpp) and
// which layers call BLAS (Note [BLAS beside the OpenMP pool] in intra_op.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "estimates.h"
#include "intra_op.h"
#include "ledger.h"
#include "test_util.h"

namespace swapnet {
namespace runtime_detail {
namespace {

// Ten layers of 1 ms and 1 MB each, read at 1 ms per MB.
BlockEstimates ten_layers() {
  BlockEstimates e;
  std::vector<LayerCost> costs(10);
  for (auto& c : costs) {
    c.exec_ms = 1;
    c.bytes = 1 << 20;
  }
  e.set_costs(costs, 1.0 / (1 << 20));
  return e;
}

TEST(BlockEstimates, TheColdFirstRunCountsOnlyUntilASecondAndOutliersDoNotMoveIt) {
  BlockEstimates e = ten_layers();
  EXPECT_NEAR(e.expect(0, 1, true, 0), 2.0, 1e-9);  // seeded: two layers' execution
  // A cold first run of 18 ms: alone, the geometric mean of it and the seed (Note [A block's
  // first run]); a second run of 6 ms replaces both.
  EXPECT_EQ(e.observe(0, 1, true, 0, 18.0, 0, e.expect(0, 1, true, 0)), 0.0);  // no usual time yet
  EXPECT_NEAR(e.expect(0, 1, true, 0), 6.0, 1e-9);
  e.observe(0, 1, true, 0, 6.0, 0, e.expect(0, 1, true, 0));
  EXPECT_NEAR(e.expect(0, 1, true, 0), 6.0, 1e-9);
  e.observe(0, 1, true, 0, 7.0, 0, e.expect(0, 1, true, 0));
  EXPECT_NEAR(e.expect(0, 1, true, 0), 6.0, 1e-9);  // of two runs, the faster; the cold one not among them
  for (int k = 0; k < 8; ++k) e.observe(0, 1, true, 0, k == 4 ? 300.0 : 6.0, 0, e.expect(0, 1, true, 0));
  EXPECT_NEAR(e.expect(0, 1, true, 0), 6.0, 1e-9);  // one preempted run of 300 ms: the median stays
  EXPECT_GT(e.block_error(), 0);
  EXPECT_EQ(e.observed(), 11u);
  EXPECT_EQ(e.steps(), 0u);  // blocks alone are no step (the runtime says when one ends)
}

// Note [Steps of a grant] in runtime_worker.cpp: a step's error is its blocks' summed estimate
// against its time, per step and per millisecond of work.
TEST(BlockEstimates, StepsAreScoredAsAWhole) {
  BlockEstimates e = ten_layers();
  e.observe_step(4.0, 5.0);   // 0.2 off
  e.observe_step(10.0, 8.0);  // 0.25 off
  e.observe_step(3.0, 0.0);   // not timed: not counted
  EXPECT_EQ(e.steps(), 2u);
  EXPECT_NEAR(e.error(), (0.2 + 0.25) / 2, 1e-12);
  EXPECT_NEAR(e.time_error(), 3.0 / 13.0, 1e-12);
  EXPECT_NEAR(e.measured_ms(), 13.0, 1e-12);
  EXPECT_EQ(e.observed(), 0u);
}

TEST(BlockEstimates, ARunAnswersItsPaceAgainstTheBlocksUsualTime) {
  BlockEstimates e = ten_layers();
  for (int k = 0; k < 3; ++k) e.observe(0, 1, true, 0, 4.0, 0, 4.0);
  EXPECT_NEAR(e.observe(0, 1, true, 0, 8.0, 0, 4.0), 2.0, 1e-9);  // twice its usual 4 ms
  EXPECT_NEAR(e.expect(0, 1, true, 0, 1.5), 6.0, 1e-9);           // at 1.5x the pace
  // Waits for reads are not paced.
  BlockEstimates w = ten_layers();
  for (int k = 0; k < 3; ++k) w.observe(0, 0, false, 0, 4.0, 3.0, 4.0);
  EXPECT_NEAR(w.expect(0, 0, false, 0, 2.0), 1.0 * 2 + 3.0, 1e-9);
}

TEST(Pace, FollowsABurstAndComesBack) {
  Pace p;
  EXPECT_EQ(p.factor(), 1.0);
  p.observe(0);  // no answer: nothing learned
  EXPECT_EQ(p.factor(), 1.0);
  p.observe(30.0);  // one preempted block: a small step
  EXPECT_NEAR(p.factor(), std::exp(0.1 * 0.2), 1e-12);
  p.observe(1.0);
  for (int k = 0; k < 60; ++k) p.observe(2.0);  // every model's blocks at twice their usual time
  EXPECT_NEAR(p.factor(), 2.0, 0.05);
  for (int k = 0; k < 60; ++k) p.observe(1.0);
  EXPECT_NEAR(p.factor(), 1.0, 0.05);
  for (int k = 0; k < 200; ++k) p.observe(1000.0);  // a run clamped at e x its usual time
  EXPECT_LE(p.factor(), std::exp(1.0) + 1e-9);
}

TEST(BlockEstimates, OneMeasuredBlockScalesTheModelsSeeds) {
  BlockEstimates e = ten_layers();
  for (int k = 0; k < 20; ++k) e.observe(0, 4, true, 0, 15.0, 0, e.expect(0, 4, true, 0));  // 3x its seed of 5
  const double unseen = e.expect(5, 9, true, 0);  // seed 5 ms
  EXPECT_GT(unseen, 8.0);
  EXPECT_LT(unseen, 15.5);
}

TEST(BlockEstimates, LearnsContentionFromCompany) {
  BlockEstimates e = ten_layers();
  // Alone 10 ms, beside one other block 18 ms: usually beside half a block, 14 ms, and 4 ms more
  // (or less) per half block more (or less): gamma 8/14.
  for (int k = 0; k < 200; ++k) {
    const double others = (k % 2) ? 1.0 : 0.0;
    const double ms = others > 0 ? 18.0 : 10.0;
    e.observe(2, 3, true, others, ms, 0, e.expect(2, 3, true, others));
  }
  EXPECT_NEAR(e.contention(), 8.0 / 14, 0.1);
  EXPECT_NEAR(e.expect(2, 3, true, 1.0), 18.0, 2.5);
  EXPECT_NEAR(e.expect(2, 3, true, 0.0), 10.0, 2.5);
}

TEST(BlockEstimates, AlwaysTheSameCompanyTeachesNoContention) {
  BlockEstimates e = ten_layers();
  for (int k = 0; k < 200; ++k) e.observe(2, 3, true, 1.0, k % 3 ? 12.0 : 20.0, 0, e.expect(2, 3, true, 1.0));
  EXPECT_EQ(e.contention(), 0.0);  // no variation in company: nothing to learn (and no drift on noise)
}

TEST(BlockEstimates, ForgivingBringsADroppedModelBackToItsUsualTimes) {
  BlockEstimates e = ten_layers();
  e.observe(0, 9, true, 0, 400.0, 0, 10.0);  // a cold first run, 40x its seed
  const double cold = e.expect(0, 9, true, 0);
  EXPECT_GT(cold, 40.0);
  for (int k = 0; k < 7; ++k) e.forgive();  // its requests dropped on it (the first drop forgives nothing)
  EXPECT_LT(e.expect(0, 9, true, 0), 2 * 10.0);  // back near its seed
  // Slow runs of late: a drop right after them leaves them be (they are what the model does
  // now); a second drop with no run between counts the slowest as the fastest.
  BlockEstimates f = ten_layers();
  for (double ms : {30.0, 10.0, 90.0, 95.0}) f.observe(0, 9, true, 0, ms, 0, f.expect(0, 9, true, 0));
  EXPECT_NEAR(f.expect(0, 9, true, 0), 90.0, 1e-9);
  f.forgive();
  EXPECT_NEAR(f.expect(0, 9, true, 0), 90.0, 1e-9);
  f.forgive();
  EXPECT_NEAR(f.expect(0, 9, true, 0), 10.0, 1e-9);
  for (int k = 0; k < 2; ++k) f.observe(0, 9, true, 0, 95.0, 0, f.expect(0, 9, true, 0));  // it ran again
  f.forgive();
  EXPECT_NEAR(f.expect(0, 9, true, 0), 90.0, 1e-9);  // {10, 90, 10, 95, 95}: nothing forgiven
}

TEST(BlockEstimates, WaitsForSwappedBlocksAreLearnedApart) {
  BlockEstimates e = ten_layers();
  for (int k = 0; k < 5; ++k) e.observe(0, 0, false, 0, 4.0, 3.0, e.expect(0, 0, false, 0));
  EXPECT_NEAR(e.expect(0, 0, false, 0), 4.0, 1e-9);  // 1 ms of compute + 3 ms waiting
  // An unseen swapped block waits at most its read at the cost model's rate (1 ms per MB).
  EXPECT_LE(e.expect(5, 5, false, 0), 1.0 * e.expect(5, 5, true, 0) + 1.0 + 1e-9);
}

// Note [Waits for the disk]: where the bytes still unread are known, the wait follows them.
TEST(BlockEstimates, AWaitFollowsTheBytesStillUnread) {
  const double mib = 1 << 20;
  BlockEstimates e = ten_layers();
  for (int k = 0; k < 5; ++k) e.observe(0, 0, false, 0, 4.0, 3.0, e.expect(0, 0, false, 0));
  EXPECT_NEAR(e.expect(0, 0, false, 0), 4.0, 1e-9);          // not known: its usual 3 ms wait
  EXPECT_NEAR(e.expect(0, 0, false, 0, 1, 0), 1.0, 1e-9);    // all landed: no wait
  EXPECT_NEAR(e.expect(0, 0, true, 0, 1, 2 * mib), 1.0, 1e-9);  // a resident block never waits
  // Before any such wait was seen, the cost model's rate (1 ms per MiB).
  EXPECT_NEAR(e.expect(0, 0, false, 0, 1, 2 * mib), 1.0 + 2.0, 1e-9);
  // A disk busier than the profile said: 0.5 ms + 3 ms per 1e6 bytes unread.
  for (int k = 0; k < 100; ++k) {
    const double unread = 1e6 * (1 << (k % 4));  // 1, 2, 4, 8 MB
    e.observe(1, 1, false, 0, 1.0 + 0.5 + 3e-6 * unread, 0.5 + 3e-6 * unread, e.expect(1, 1, false, 0, 1, unread),
              unread);
  }
  EXPECT_NEAR(e.expect(0, 0, false, 0, 1, 3e6), 1.0 + 9.5, 0.5);
  EXPECT_NEAR(e.expect(0, 0, false, 0, 1, 0), 1.0, 1e-9);
  // What was learned of unread bytes leaves the usual wait (unread not known) as it was.
  EXPECT_NEAR(e.expect(0, 0, false, 0), 4.0, 1e-9);
}

using Clock = std::chrono::steady_clock;
Clock::time_point at(double s) { return Clock::time_point{} + std::chrono::microseconds(static_cast<long long>(s * 1e6)); }

TEST(MemoryLedger, CountsBytesSecondsAboveTheBudget) {
  MemoryLedger l(2, 100, at(0));
  l.use(0, 60, at(0));
  l.use(1, 30, at(0));
  l.use(1, 50, at(1));  // 110 of 100 from 1 s to 3 s: 10 bytes x 2 s
  l.use(1, 40, at(3));
  const MemoryUse u = l.totals(at(4));
  EXPECT_DOUBLE_EQ(u.over_byte_s, 20.0);
  EXPECT_DOUBLE_EQ(u.over_s, 2.0);
  EXPECT_EQ(u.peak_bytes, 110u);
  EXPECT_DOUBLE_EQ(u.complying_byte_s, 0.0);
}

TEST(MemoryLedger, ACutMayTakeEffectBeforeItCounts) {
  MemoryLedger l(1, 100, at(0));
  l.use(0, 90, at(0));
  l.announce(50, at(1));   // a cut: 90 used until it takes effect at 1.5 s
  l.use(0, 45, at(1.5));
  l.in_effect(at(1.5));
  MemoryUse u = l.totals(at(2));
  EXPECT_DOUBLE_EQ(u.over_byte_s, 0.0);             // within the larger total while complying
  EXPECT_DOUBLE_EQ(u.complying_byte_s, 40.0 * 0.5);  // 40 above the new total for 0.5 s
  l.use(0, 55, at(2));  // above the total in force: broken
  u = l.totals(at(3));
  EXPECT_DOUBLE_EQ(u.over_byte_s, 5.0);
}

// A step whose first layer calls BLAS is the one a compute thread frees its helpers for.
TEST(IntraOp, ALayerCallsBlasWhenItHasALinearOrAMatrixProduct) {
  EXPECT_TRUE(calls_blas("aten::linear"));
  EXPECT_TRUE(calls_blas("aten::flatten,aten::linear,aten::relu"));
  EXPECT_TRUE(calls_blas("prim::GetAttr,aten::addmm"));
  EXPECT_TRUE(calls_blas("aten::matmul"));
  EXPECT_FALSE(calls_blas("aten::_convolution,aten::relu_"));
  EXPECT_FALSE(calls_blas("aten::mmx,aten::linear_backward"));  // whole names only
  EXPECT_FALSE(calls_blas(""));
}

// Note [BLAS on the compute thread]: OpenBLAS's own threads while BlasThreads live, put back by
// the last of them where nobody else changed them; the user's choice in the environment stays.
// Without OpenBLAS's pthread build nothing is held.
TEST(IntraOp, BlasThreadsAreSetForTheirLifetimeAndPutBack) {
  test_util::BlasStateGuard st;
  if (!st.pthreads) {
    BlasThreads b(1);
    EXPECT_EQ(b.set(), 0) << "no OpenBLAS pthread build: nothing to hold";
    return;
  }
  const auto get = st.get;
  const auto set = st.set;
  set(2);
  {
    BlasThreads b(1);
    EXPECT_EQ(get(), 1);
    EXPECT_EQ(b.before(), 2);
    EXPECT_EQ(b.set(), 1);
  }
  EXPECT_EQ(get(), 2) << "put back";
  {
    BlasThreads b(-1);  // the default: one
    EXPECT_EQ(get(), 1);
  }
  EXPECT_EQ(get(), 2);
  {
    BlasThreads b(0);  // left as they are
    EXPECT_EQ(get(), 2);
    EXPECT_EQ(b.set(), 0);
  }
  ::setenv("OPENBLAS_NUM_THREADS", "2", 1);
  {
    BlasThreads b(-1);  // the user chose them
    EXPECT_EQ(get(), 2);
  }
  ::setenv("OPENBLAS_NUM_THREADS", "", 1);  // empty: unset, as OpenBLAS takes it
  {
    BlasThreads b(-1);
    EXPECT_EQ(get(), 1);
  }
  ::unsetenv("OPENBLAS_NUM_THREADS");
  {
    BlasThreads a(1);
    {
      BlasThreads b(1);  // two runtimes open at once
      EXPECT_EQ(b.before(), 2);
      BlasThreads c(3);  // another number than they are held at: left
      EXPECT_EQ(c.set(), 0);
    }
    EXPECT_EQ(get(), 1) << "the first holder still holds them";
  }
  EXPECT_EQ(get(), 2) << "the last one out put them back";
  {
    BlasThreads b(1);
    set(3);  // someone else's setting while it is held
  }
  EXPECT_EQ(get(), 3) << "someone else's setting stays";
}

}  // namespace
}  // namespace runtime_detail
}  // namespace swapnet
