// Tests of resumable inference (assembly.h: Executor::begin/step/finish, set_budget between
// steps): a budget change at any layer of an inference, shrinking or growing, gives outputs
// bit-identical to in-memory inference on real architectures, and from the change on the
// executor stays within the new budget (weights in use + activations), with the pages of a
// larger ring given back before set_budget returns. Budgets below the minimum, I/O errors after
// a change and abort() leave the executor clean.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "packed.h"
#include "swapnet/assembly.h"
#include "test_util.h"

namespace swapnet {
namespace {

using test_util::error_of;
using test_util::packed;
using test_util::Packed;
using test_util::reference;

// A model packed for 64x64 inputs, a random input drawn after seeding, and the in-memory output.
struct Reference {
  Packed pk;
  at::Tensor x;
  c10::IValue expected;
};
Reference reference_case(const char* model, int seed, int side = 64) {
  Reference r{packed(model, {1, 3, side, side}), {}, {}};
  torch::manual_seed(seed);
  r.x = torch::randn({1, 3, side, side});
  r.expected = reference(r.pk.m, r.x);
  return r;
}

struct Case {
  const char* model;
  ReadAhead read_ahead;
  bool grid;
  int side = 64;  // 224: activations large enough to lend (Note [Lending the activation reserve])
};

class Resume : public ::testing::TestWithParam<Case> {};

// Many inferences, each with one to three budget changes at random layers (mid-block included),
// to random budgets between the minimum and more than the model.
TEST_P(Resume, BudgetChangesAtAnyLayerAreBitIdenticalAndWithinTheNewBudget) {
  const Case c = GetParam();
  const Reference ref = reference_case(c.model, 3, c.side);
  const Packed& pk = ref.pk;
  const ImageInfo& info = pk.info;
  const at::Tensor& x = ref.x;
  const c10::IValue& expected = ref.expected;
  ExecutorOptions o;
  o.read_ahead = c.read_ahead;
  // The ring's minimum (the largest layer) is below the two-block pipeline's (a pair).
  const std::uint64_t lo = min_budget(info, o), hi = info.data_size + info.data_size / 4;
  ExecutorOptions paper;
  paper.read_ahead = ReadAhead::kPaper;
  if (c.read_ahead == ReadAhead::kRing) EXPECT_LT(lo, min_budget(info, paper));
  std::mt19937 rng(11);
  auto budget = [&] { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  o.budget = budget();
  if (c.grid) o.grid_step = default_grid_step(info);
  auto ex = Executor::open(pk.img, o);
  install_cpu_meter();
  const int L = static_cast<int>(info.layers.size());
  int changes = 0, mid_block = 0, shrinks = 0;
  // One whole inference first: it measures how far each layer's activations reach, which
  // lending the activation reserve needs (Note [Lending the activation reserve]); every
  // inference after it is changed in the middle.
  ASSERT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);
  for (int trial = 0; trial < 24; ++trial) {
    const std::uint64_t base = cpu_meter().current;
    ex->begin({x.clone()});
    bool done = false;
    std::vector<int> at;
    for (int n = 1 + static_cast<int>(rng() % 3); n > 0; --n) at.push_back(static_cast<int>(rng() % (L + 1)));
    std::sort(at.begin(), at.end());
    std::uint64_t in_force = ex->plan().total();
    for (int k : at) {
      while (!done && ex->next_layer() < k) done = ex->step(k);
      // Inside a block unless k is where one starts.
      bool inside = false;
      for (const auto& [first, last] : ex->plan().blocks) inside |= first < k && k <= last;
      mid_block += inside && !done;
      const std::uint64_t b = budget();
      shrinks += b < in_force;
      ex->set_budget(b);
      ++changes;
      in_force = b;
      EXPECT_LE(ex->plan().total(), b);
      EXPECT_LE(ex->weight_memory().held + ex->plan().activation_bytes, b) << "held at once after the change";
      // The old ring's and resident arena's pages are gone with them.
      const WeightMemory wm = ex->weight_memory();
      EXPECT_LE(wm.resident_pages, wm.held) << "pages held beyond the new plan's buffers";
      ex->reset_weight_peak();
      reset_cpu_meter_peak();
    }
    while (!done) done = ex->step();
    Comparison cmp = compare_outputs(expected, ex->finish());
    ASSERT_TRUE(cmp.equal) << c.model << " trial " << trial << ": " << cmp.difference;
    // Activations and the blocks lent their reserve's bytes, at once.
    const std::uint64_t act = cpu_meter().peak_with_lent - base;
    EXPECT_LE(ex->weight_memory().peak + act, in_force)
        << c.model << " trial " << trial << ": weights in use " << ex->weight_memory().peak << " + activations " << act;
  }
  EXPECT_GE(changes, 36);
  EXPECT_GT(mid_block, 5) << "changes inside a block were exercised";
  EXPECT_GT(shrinks, 10);
  // And the next whole inference on the last plan.
  Comparison cmp = compare_outputs(expected, ex->forward({x.clone()}));
  EXPECT_TRUE(cmp.equal) << cmp.difference;
  if (c.side == 224) {
    const Executor::PipelineStats st = ex->pipeline_stats();
    EXPECT_GT(st.lent_peak_bytes, 0u) << "blocks were lent the activation reserve's bytes";
    EXPECT_LE(st.zone_peak_bytes, info.activation_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Resume,
                         ::testing::Values(Case{"resnet18", ReadAhead::kRing, false},
                                           Case{"resnet18", ReadAhead::kRing, false, 224},
                                           Case{"mobilenet_v2", ReadAhead::kRing, true},
                                           Case{"resnet18", ReadAhead::kPaper, true}),
                         [](const auto& i) {
                           return std::string(i.param.model) + "_" + to_string(i.param.read_ahead) +
                                  (i.param.grid ? "_grid" : "") +
                                  (i.param.side != 64 ? "_" + std::to_string(i.param.side) : "");
                         });

// Note [Keeping part of a block]: the first bytes of resnet18's largest layer kept across
// inferences, the rest read at the ring's start each inference (streamed over the blocks there
// at the least budget), under every checksum policy: bit-identical, within the budget, and
// reading exactly the plan's bytes once the kept part is in (whole again when every fetch is
// verified). A budget change in the middle of an inference moves off and back onto such a plan.
TEST(KeepPart, TheRestOfALargeLayerIsReadEachInferenceBitIdentically) {
  const Reference ref = reference_case("resnet18", 5);
  const Packed& pk = ref.pk;
  const ImageInfo& info = pk.info;
  const at::Tensor& x = ref.x;
  const c10::IValue& expected = ref.expected;
  int big = 0;
  for (int k = 0; k < static_cast<int>(info.layers.size()); ++k) {
    if (info.layers[k].size > info.layers[big].size) big = k;
  }
  ASSERT_GT(big, 0);
  const std::uint64_t B = info.layers[big].size, P = B / 2 / kImageAlign * kImageAlign;
  install_cpu_meter();
  for (auto verify : {ExecutorOptions::Verify::kFirst, ExecutorOptions::Verify::kAlways, ExecutorOptions::Verify::kNever}) {
    ExecutorOptions o;
    for (int k = 1; k < static_cast<int>(info.layers.size()); ++k) o.partition.push_back(k);  // a block per layer
    o.retain_block = big;
    o.retained_bytes = P;
    o.verify = verify;
    o.budget = min_budget(info, o) + P;  // the ring no larger than the largest layer
    auto ex = Executor::open(pk.img, o);
    ASSERT_EQ(ex->plan().retain_block, big);
    ASSERT_EQ(ex->plan().retained_bytes, P);
    EXPECT_LE(ex->plan().total(), o.budget);
    std::uint64_t swapped = 0;
    for (size_t b = 0; b < ex->plan().blocks.size(); ++b) swapped += ex->plan().resident[b] ? 0 : ex->plan().block_bytes[b];
    EXPECT_EQ(ex->plan().read_bytes, swapped - P);
    for (int i = 0; i < 5; ++i) {
      const std::uint64_t base = cpu_meter().current, read0 = ex->bytes_used();
      ex->reset_weight_peak();
      reset_cpu_meter_peak();
      Comparison cmp = compare_outputs(expected, ex->forward({x.clone()}));
      ASSERT_TRUE(cmp.equal) << "inference " << i << ": " << cmp.difference;
      EXPECT_LE(ex->weight_memory().peak + (cpu_meter().peak - base), o.budget) << "inference " << i;
      if (i >= 2) {
        EXPECT_EQ(ex->bytes_used() - read0,
                  ex->plan().read_bytes + (verify == ExecutorOptions::Verify::kAlways ? P : 0))
            << "inference " << i;
      }
    }
    if (verify != ExecutorOptions::Verify::kAlways) {  // reads that verify are never streamed
      EXPECT_GT(ex->streamed_blocks(), 0u) << "the rest streams over the blocks at the ring's start";
    }
    // Off the plan in the middle of the largest layer's block and back.
    ex->begin({x.clone()});
    bool done = false;
    while (!done && ex->next_layer() <= big) done = ex->step(big + 1);
    ex->set_budget(info.data_size * 2);
    EXPECT_EQ(ex->plan().retain_block, -1);
    while (!done) done = ex->step();
    EXPECT_TRUE(compare_outputs(expected, ex->finish()).equal);
  }
  ExecutorOptions bad;
  bad.partition = {big, big + 1};  // the largest layer alone in block 1, kept resident
  bad.resident = {1};
  bad.retain_block = 1;
  bad.budget = info.data_size * 2;
  EXPECT_NE(error_of([&] { Executor::open(pk.img, bad); }).find("block 1 to keep in part"), std::string::npos);
}

// shed() from another thread while a layer runs (how Runtime cuts a budget without waiting for
// the layer): what is held drops at once to within the new budget, the shared-memory pages go
// with it, and the inference, moved to the new plan at the next layer boundary, stays
// bit-identical.
TEST(ResumeShed, ShedWhileALayerRunsGivesMemoryBackAtOnce) {
  const Reference ref = reference_case("resnet18", 5);
  const Packed& pk = ref.pk;
  const ImageInfo& info = pk.info;
  const at::Tensor& x = ref.x;
  const c10::IValue& expected = ref.expected;
  const std::uint64_t lo = min_budget(info), hi = info.data_size + info.data_size / 4;
  ExecutorOptions o;
  o.budget = hi;
  auto ex = Executor::open(pk.img, o);
  // The shedder announces a cut (phase 1: like Runtime, the target is known before shed()),
  // sheds, measures, and hands the cut over (phase 2); the inference thread moves to it at its
  // next step boundary, and does not step while a cut is being shed.
  std::atomic<bool> stop{false};
  std::atomic<int> phase{0};
  std::atomic<std::uint64_t> shed_to{0};
  std::atomic<int> sheds{0}, over{0}, rss_over{0};
  std::string first_over, first_rss_over;
  std::thread shedder([&] {
    std::mt19937 rng(7);
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
      if (phase.load() != 0) continue;  // the last one is not taken yet
      const std::uint64_t to = lo + rng() % std::max<std::uint64_t>(1, (info.data_size / 2 - lo));
      shed_to.store(to);
      phase.store(1);
      ex->interrupt();
      if (ex->shed(to)) {
        ++sheds;
        const std::uint64_t held = ex->weight_memory().held, act = ex->plan().activation_bytes;
        const std::uint64_t shm = ex->weight_memory().resident_pages;
        if (held + act > std::max(to, lo)) {
          if (over++ == 0) first_over = "held " + std::to_string(held) + " + activations " + std::to_string(act) + " > " + std::to_string(to);
        }
        if (shm > held + 64 * 4096 && rss_over++ == 0) {  // pages around the kept ranges
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          first_rss_over = "resident " + std::to_string(shm) + " > held " + std::to_string(held) +
                           " (cut to " + std::to_string(to) + "; 50 ms later: resident " +
                           std::to_string(ex->weight_memory().resident_pages) + ", held " +
                           std::to_string(ex->weight_memory().held) + ")";
        }
      }
      phase.store(2);
    }
  });
  int moves = 0;
  for (int trial = 0; trial < 18; ++trial) {
    ex->begin({x.clone()});
    bool done = false;
    while (!done) {
      done = ex->step();
      while (phase.load() == 1) std::this_thread::yield();
      if (phase.load() == 2) {
        ex->set_budget(shed_to.load());
        EXPECT_LE(ex->plan().total(), shed_to.load());
        ++moves;
        phase.store(0);
      } else if (!done && trial % 3 == 2) {
        ex->set_budget(hi);  // and grow again
      }
    }
    Comparison cmp = compare_outputs(expected, ex->finish());
    ASSERT_TRUE(cmp.equal) << "trial " << trial << ": " << cmp.difference;
    if (trial % 3 == 2) ex->set_budget(hi);
  }
  stop.store(true);
  shedder.join();
  if (phase.load() == 2) ex->set_budget(shed_to.load());
  EXPECT_GT(sheds.load(), 5) << "sheds happened while inferences ran";
  EXPECT_GT(moves, 5);
  EXPECT_EQ(over.load(), 0) << "after shed() the executor holds within the new budget: " << first_over;
  EXPECT_EQ(rss_over.load(), 0) << "the shed pages are given back: " << first_rss_over;
  Comparison cmp = compare_outputs(expected, ex->forward({x.clone()}));
  EXPECT_TRUE(cmp.equal) << cmp.difference;
}

// Below the minimum during an inference: refused with the numbers, and the inference goes on
// under the plan it had, bit-identical.
TEST(ResumeFaults, BudgetBelowTheMinimumKeepsTheInferenceGoing) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  ExecutorOptions o;
  o.budget = std::max(pk.info.data_size / 3, min_budget(pk.info));
  auto ex = Executor::open(pk.img, o);
  const ExecutionPlan before = ex->plan();
  ex->begin({x.clone()});
  for (int s = 0; s < 3; ++s) ex->step();
  const std::string e = error_of([&] { ex->set_budget(min_budget(pk.info) - 4096); });
  EXPECT_NE(e.find("is below the minimum"), std::string::npos) << e;
  EXPECT_NE(e.find("the minimum for this model is " + std::to_string(min_budget(pk.info))), std::string::npos) << e;
  EXPECT_TRUE(ex->in_inference());
  EXPECT_EQ(ex->plan().blocks, before.blocks) << "the old plan stays";
  while (!ex->step()) {
  }
  Comparison c = compare_outputs(expected, ex->finish());
  EXPECT_TRUE(c.equal) << c.difference;
}

// An I/O error after a change fails that inference only, naming the image, the block and the
// errno; the next one is bit-identical. abort() gives the ring back; begin() twice is refused.
TEST(ResumeFaults, IoErrorAfterAChangeFailsThatInferenceOnly) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  std::atomic<bool> fail{false};
  ExecutorOptions o;
  o.budget = std::max(pk.info.data_size / 2, min_budget(pk.info));
  o.reader.fault = [&](std::uint64_t, std::size_t, long res) -> long { return fail ? -EIO : res; };
  auto ex = Executor::open(pk.img, o);
  ex->begin({x.clone()});
  ex->step();
  ex->step();
  fail = true;
  ex->set_budget(std::max(pk.info.data_size / 4, min_budget(pk.info)));
  std::string e;
  try {
    while (!ex->step()) {
    }
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find(pk.img + ": read"), std::string::npos) << e;
  EXPECT_NE(e.find("(EIO)"), std::string::npos) << e;
  EXPECT_NE(e.find("(block "), std::string::npos) << e;
  EXPECT_FALSE(ex->in_inference()) << "the failed inference ended";
  fail = false;
  Comparison c = compare_outputs(expected, ex->forward({x.clone()}));
  EXPECT_TRUE(c.equal) << c.difference;

  const MemoryStats idle = memory_stats();
  ex->begin({x.clone()});
  ex->step();
  EXPECT_NE(error_of([&] { ex->begin({x.clone()}); }).find("already in progress"), std::string::npos);
  ex->abort();
  EXPECT_FALSE(ex->in_inference());
  EXPECT_LE(memory_stats().current, idle.current) << "nothing read ahead stays after abort";
  EXPECT_NE(error_of([&] { ex->finish(); }).find("finish() before"), std::string::npos);
  c = compare_outputs(expected, ex->forward({x.clone()}));
  EXPECT_TRUE(c.equal) << c.difference;
}

// The scheduler's view of the disk: the next block's unread bytes follow its read, without
// waiting for it: the whole block before its read is submitted (open reads nothing ahead), 0
// once the bytes have landed, whether or not anyone waited for them.
TEST(ResumeReadState, NextBlockUnreadBytesFollowsTheReads) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  ExecutorOptions o;
  o.budget = min_budget(pk.info);
  o.residency = false;
  auto ex = Executor::open(pk.img, o);
  const ExecutionPlan& p = ex->plan();
  ASSERT_FALSE(p.resident[0]);
  ASSERT_GT(p.block_bytes[0], 0u);
  EXPECT_EQ(ex->next_block_unread_bytes(), p.block_bytes[0]) << "nothing is read at open";
  auto settle = [&] {  // the reads land on their own: poll, never wait on them
    for (int i = 0; i < 5000 && ex->next_block_unread_bytes() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return ex->next_block_unread_bytes();
  };
  ex->begin({x.clone()});
  EXPECT_LE(ex->next_block_unread_bytes(), p.block_bytes[0]);
  EXPECT_EQ(settle(), 0u) << "block 0 landed";
  int steps = 0;
  while (!ex->step()) {
    ++steps;
    EXPECT_LE(ex->next_block_unread_bytes(), p.block_bytes[static_cast<size_t>(steps)]);
    EXPECT_EQ(settle(), 0u) << "block " << steps;
  }
  Comparison c = compare_outputs(expected, ex->finish());
  EXPECT_TRUE(c.equal) << c.difference;
  ex->release();
  EXPECT_EQ(ex->next_block_unread_bytes(), 0u) << "released: nothing to read";
}

}  // namespace
}  // namespace swapnet
