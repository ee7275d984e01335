// Tests of swapnet::Executor (assembly.h): swapped inference within a budget is bit-identical
// to in-memory inference, plans fit their budgets, shared weights stay resident, and errors
// (budget too small, I/O failure, wrong input) are clear and leave the executor usable.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <torch/script.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <chrono>
#include <thread>
#include <vector>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "swapnet/assembly.h"
#include "packed.h"
#include "test_util.h"
#include "executor_test.h"

namespace swapnet {
namespace {

using namespace executor_test;  // the helpers and test_util's names (executor_test.h)

TEST(Executor, SwappedRunIsBitIdenticalAtAThirdOfTheModel) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  torch::jit::Module& m = pk.m;
  const std::string& img = pk.img;
  ImageInfo& info = pk.info;
  ExecutorOptions o;
  o.budget = std::max(info.data_size / 3, min_budget(info));
  auto ex = Executor::open(img, o);
  const ExecutionPlan& p = ex->plan();
  EXPECT_GT(p.blocks.size(), 2u);
  EXPECT_LE(p.arena_bytes + p.activation_bytes + p.pinned_bytes, o.budget);
  std::vector<std::uint64_t> swapped;  // bytes of the swapped blocks, in order
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    if (b + 1 < p.blocks.size()) EXPECT_EQ(p.blocks[b].second + 1, p.blocks[b + 1].first) << "blocks tile the layers";
    // The block kept in part (Note [Keeping part of a block]) reads only its rest into the ring.
    if (!p.resident[b]) swapped.push_back(p.block_bytes[b] - (static_cast<int>(b) == p.retain_block ? p.retained_bytes : 0));
  }
  // The ring holds every swapped block; two neighbours need not fit together (a block streams
  // into the bytes its predecessor frees, Note [Streaming into the ring]), and its minimum is
  // the largest layer. The two-block pipeline's pair rule is checked in TheRingRunsInTheLargestLayer.
  EXPECT_EQ(p.read_ahead, ReadAhead::kRing);
  for (std::uint64_t bytes : swapped) EXPECT_LE(bytes, p.arena_bytes) << "every swapped block fits the ring";
  torch::manual_seed(2);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  c10::IValue expected = reference(m, x);
  reset_memory_peak();
  for (int i = 0; i < 2; ++i) {
    Comparison c = compare_outputs(expected, ex->forward({x.clone()}));
    EXPECT_TRUE(c.equal) << c.difference;
  }
  EXPECT_LE(memory_stats().peak, p.arena_bytes + p.resident_bytes + p.retained_bytes) << "never more than the arenas placed";
  EXPECT_EQ(p.read_bytes + p.resident_bytes + p.retained_bytes, info.data_size);
  // Resident blocks read once, every swapped block once per inference; the ring may already
  // hold the next inference's first blocks.
  EXPECT_GE(ex->bytes_read(), p.resident_bytes + p.retained_bytes + 2 * p.read_bytes);
  EXPECT_LE(ex->bytes_read(), p.resident_bytes + p.retained_bytes + 2 * p.read_bytes + p.arena_bytes);
}

// --device cuda: where the libtorch or the GPU is missing, open says which, naming the image;
// where both exist (scripts/gpu-check.sh), it opens on memory the GPU reads in place.
TEST(Executor, CudaDeviceSaysWhatIsMissing) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  ExecutorOptions o;
  o.budget = std::max(pk.info.data_size / 3, min_budget(pk.info));
  o.device = ExecutorOptions::Device::kCUDA;
  if (!at::hasCUDA()) {
    const std::string e = error_of([&] { Executor::open(pk.img, o); });
    EXPECT_NE(e.find(pk.img + ": --device cuda: this libtorch has no CUDA support"), std::string::npos) << e;
  } else if (!cuda_device().usable) {
    const std::string e = error_of([&] { Executor::open(pk.img, o); });
    EXPECT_NE(e.find("no usable CUDA device: " + cuda_device().reason), std::string::npos) << e;
  } else {
    auto ex = Executor::open(pk.img, o);
    EXPECT_NE(ex->memory(), MemoryKind::kHost);
    o.memory = MemoryKind::kHost;
    EXPECT_NE(error_of([&] { Executor::open(pk.img, o); }).find("not host memory"), std::string::npos);
  }
}

TEST(Executor, ResidentBlocksAreReadOnceAndStayBitIdentical) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const ImageInfo& info = pk.info;
  torch::manual_seed(4);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  c10::IValue expected = reference(pk.m, x);
  // Given explicitly: four equal-byte blocks, the first and third kept.
  ExecutorOptions o;
  o.budget = info.data_size * 2;
  o.blocks = 4;
  o.resident = {0, 2};
  auto ex = Executor::open(pk.img, o);
  const ExecutionPlan& p = ex->plan();
  ASSERT_EQ(p.resident, (std::vector<char>{1, 0, 1, 0}));
  EXPECT_EQ(p.resident_bytes, p.block_bytes[0] + p.block_bytes[2]);
  EXPECT_EQ(p.arena_bytes, p.block_bytes[1] + p.block_bytes[3]) << "swapped blocks 1 and 3 are consecutive";
  for (int i = 0; i < 3; ++i) {
    Comparison c = compare_outputs(expected, ex->forward({x.clone()}));
    EXPECT_TRUE(c.equal) << c.difference;
  }
  EXPECT_GE(ex->bytes_read(), p.resident_bytes + p.retained_bytes + 3 * p.read_bytes);
  EXPECT_LE(ex->bytes_read(), p.resident_bytes + p.retained_bytes + 3 * p.read_bytes + p.arena_bytes) << "read ahead: one ring at most";
  o.resident = {7};
  EXPECT_NE(error_of([&] { Executor::open(pk.img, o); }).find("resident block 7 is not one of"), std::string::npos);
  ex.reset();  // memory_stats() is process-wide

  // Chosen by the partitioner: at two thirds of the model some blocks stay, fewer bytes are read,
  // and budget changes move between such plans without a wrong output.
  ExecutorOptions a;
  a.budget = info.data_size * 2 / 3 + info.activation_bytes;
  a.cost.alpha_ms_per_byte = 1.0 / 2e6;
  auto auto_ex = Executor::open(pk.img, a);
  EXPECT_GT(auto_ex->plan().resident_bytes, 0u);
  EXPECT_LT(auto_ex->plan().read_bytes, info.data_size);
  EXPECT_LE(auto_ex->plan().total(), a.budget);
  for (std::uint64_t b : {a.budget, min_budget(info), info.data_size / 2, info.data_size * 2, min_budget(info) + 4096}) {
    auto_ex->set_budget(b);
    EXPECT_LE(auto_ex->plan().total(), b);
    reset_memory_peak();
    Comparison c = compare_outputs(expected, auto_ex->forward({x.clone()}));
    EXPECT_TRUE(c.equal) << "budget " << b << ": " << c.difference;
    EXPECT_LE(memory_stats().peak, auto_ex->plan().arena_bytes + auto_ex->plan().resident_bytes + auto_ex->plan().retained_bytes);
  }
  auto_ex.reset();
  // With a budget grid built at open, set_budget is a lookup: same guarantees.
  ExecutorOptions g = a;
  g.grid_step = 1 << 20;
  auto grid_ex = Executor::open(pk.img, g);
  for (std::uint64_t b : {info.data_size / 2, min_budget(info) + (1 << 20), info.data_size * 2, a.budget}) {
    grid_ex->set_budget(b);
    EXPECT_LE(grid_ex->plan().total(), b);
    Comparison c = compare_outputs(expected, grid_ex->forward({x.clone()}));
    EXPECT_TRUE(c.equal) << "grid, budget " << b << ": " << c.difference;
  }
  EXPECT_THROW(grid_ex->set_budget(4096), Error);
}

TEST(Executor, BudgetChangesTakeEffectWithoutReopening) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  torch::jit::Module& m = pk.m;
  const std::string& img = pk.img;
  ImageInfo& info = pk.info;
  ExecutorOptions o;
  o.budget = info.data_size * 2;  // everything fits: one resident block
  auto ex = Executor::open(img, o);
  EXPECT_TRUE(ex->plan().all_resident());
  at::Tensor x = torch::randn({1, 3, 64, 64});
  c10::IValue expected = reference(m, x);
  EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);
  const std::uint64_t small = std::max(info.data_size / 4, min_budget(info));
  ex->set_budget(small);
  EXPECT_FALSE(ex->plan().all_resident());
  EXPECT_LE(ex->plan().total(), small);
  reset_memory_peak();
  EXPECT_TRUE(compare_outputs(expected, ex->forward({x.clone()})).equal);
  EXPECT_LE(memory_stats().peak, ex->plan().arena_bytes + ex->plan().resident_bytes + ex->plan().retained_bytes);
  EXPECT_THROW(ex->set_budget(1024), Error);
  EXPECT_LE(ex->plan().arena_bytes + ex->plan().activation_bytes, small) << "a refused budget keeps the old plan";
  ex->set_budget(info.data_size / 2 + min_budget(info));
  Comparison grown = compare_outputs(expected, ex->forward({x.clone()}));
  EXPECT_TRUE(grown.equal) << grown.difference << " max " << grown.max_abs_diff << " blocks " << ex->plan().blocks.size();
  EXPECT_GT(ex->bind_us_per_tensor(), 0);
  EXPECT_LT(ex->bind_us_per_tensor(), 50) << "binding by reference is microseconds, not the paper's 50 us";
}

// Note [Giving the C heap back]: memory freed to glibc (here every other one of 4096 64 KiB chunks,
// below its mmap threshold, so that the freed ones cannot merge: a fragmented heap, as
// activations leave it) is kept by glibc and counted in RSS, until a shrinking budget gives it
// back.
TEST(Executor, AShrinkingBudgetGivesTheFreedHeapBack) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  ExecutorOptions o;
  o.budget = pk.info.data_size * 2;
  auto ex = Executor::open(pk.img, o);
  auto rss = [] {
    long pages = 0, resident = 0;
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr || std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    if (f) std::fclose(f);
    return static_cast<std::uint64_t>(resident) * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  };
  const std::uint64_t small = std::max(pk.info.data_size / 4, min_budget(pk.info));
  at::Tensor x = torch::randn({1, 3, 64, 64});
  ex->set_budget(small);  // the small plan's own memory, once, before measuring
  ex->forward({x.clone()});
  ex->set_budget(pk.info.data_size * 2);
  std::vector<void*> chunks;
  for (int i = 0; i < 4096; ++i) {
    chunks.push_back(std::malloc(64 << 10));
    ASSERT_NE(chunks.back(), nullptr);
    std::memset(chunks.back(), 1, 64 << 10);
  }
  const std::uint64_t full = rss();
  for (size_t i = 0; i < chunks.size(); i += 2) std::free(chunks[i]);  // every other: no merging
  const std::uint64_t kept = rss();
  EXPECT_GT(kept + (32u << 20), full) << "glibc keeps what was freed: " << full << " -> " << kept;
  ex->set_budget(small);
  const std::uint64_t shrunk = rss();
  EXPECT_LT(shrunk + (64u << 20), kept) << "shrinking gives the freed 128 MiB back: " << kept << " -> " << shrunk;
  for (size_t i = 1; i < chunks.size(); i += 2) std::free(chunks[i]);
}

TEST(Executor, SharedWeightsArePinnedAcrossBlocks) {
  Packed pk = packed("synthetic", {2, 3, 16, 16});
  torch::jit::Module& m = pk.m;
  const std::string& img = pk.img;
  ImageInfo& info = pk.info;
  ExecutorOptions o;
  o.budget = 1ull << 30;
  o.blocks = static_cast<int>(info.layers.size());  // one layer per block: shared.weight crosses
  auto ex = Executor::open(img, o);
  EXPECT_GT(ex->plan().pinned_bytes, 0u);
  at::Tensor x = torch::randn({2, 3, 16, 16});
  Comparison c = compare_outputs(reference(m, x), ex->forward({x.clone()}));
  EXPECT_TRUE(c.equal) << c.difference;
  // Dict and tuple outputs survive too (synthetic returns (tensor, {str: tensor})).
}

TEST(Executor, BudgetBelowTheMinimumStatesTheMinimum) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  torch::jit::Module& m = pk.m;
  const std::string& img = pk.img;
  ImageInfo& info = pk.info;
  ExecutorOptions o;
  o.budget = 1 << 20;
  std::string e = error_of([&] { Executor::open(img, o); });
  EXPECT_NE(e.find("is below the minimum"), std::string::npos) << e;
  EXPECT_NE(e.find("the minimum for this model is " + std::to_string(min_budget(info)) + " bytes"), std::string::npos) << e;
  o.budget = 1ull << 30;
  o.partition = {5, 3};
  EXPECT_NE(error_of([&] { Executor::open(img, o); }).find("partition point 3 must be increasing"), std::string::npos);
}

TEST(Executor, IoErrorFailsThatForwardAndTheNextWorks) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  torch::jit::Module& m = pk.m;
  const std::string& img = pk.img;
  ImageInfo& info = pk.info;
  bool fail = false;
  ExecutorOptions o;
  o.budget = std::max(info.data_size / 2, min_budget(info));
  o.reader.fault = [&](std::uint64_t, std::size_t, long res) -> long { return fail ? -EIO : res; };
  auto ex = Executor::open(img, o);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  fail = true;
  std::string e = error_of([&] { ex->forward({x.clone()}); });
  EXPECT_NE(e.find(img + ": read"), std::string::npos) << e;
  EXPECT_NE(e.find("Input/output error (EIO) ("), std::string::npos) << e;
  EXPECT_NE(e.find("block "), std::string::npos) << "names the block: " << e;
  fail = false;
  Comparison c = compare_outputs(reference(m, x), ex->forward({x.clone()}));
  EXPECT_TRUE(c.equal) << c.difference;
  e = error_of([&] { ex->forward({torch::randn({1, 5, 64, 64})}); });
  EXPECT_NE(e.find("to have 3 channels"), std::string::npos) << e;
  c = compare_outputs(reference(m, x), ex->forward({x.clone()}));
  EXPECT_TRUE(c.equal) << "usable after a failed forward: " << c.difference;
}

// A ring of one block (Note [A ring of one block]): the next block streams into the bytes the
// one before frees (Note [Streaming into the ring]). Bit-identical, never more than the ring in
// use, budget changes in the middle of an inference and a failed read included; ring-whole
// (no streaming) gives the same outputs. Layer by layer (Note [Layer by layer]): layers run
// while the rest of their block lands and give their bytes back as they end; a read failing in
// the middle of a block fails that inference only; ring-blocks does neither.
TEST(Executor, BlocksStreamIntoTheBytesOlderBlocksFree) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const ImageInfo& info = pk.info;
  bool fail = false;
  std::uint64_t fail_from = 0, fail_to = ~0ull;  // reads starting in [from, to) fail
  ExecutorOptions o;
  o.blocks = 6;
  o.budget = info.data_size * 2;
  o.reader.fault = [&](std::uint64_t off, std::size_t, long res) -> long {
    return fail && off >= fail_from && off < fail_to ? -EIO : res;
  };
  const ExecutionPlan wide = plan_execution(info, o);
  std::uint64_t largest = 0;
  for (size_t b = 0; b < wide.blocks.size(); ++b) {
    if (!wide.resident[b]) largest = std::max(largest, wide.block_bytes[b]);
  }
  ASSERT_GT(largest, 2u * (2 << 20)) << "blocks of several pieces";
  const std::uint64_t tight = wide.activation_bytes + wide.pinned_bytes + largest;
  o.budget = tight;
  torch::manual_seed(5);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  for (const char* ra : {"ring", "ring-blocks", "ring-whole"}) {
    set_executor_option(&o, "--read-ahead", ra);
    auto ex = Executor::open(pk.img, o);
    const ExecutionPlan& p = ex->plan();
    ASSERT_EQ(p.arena_bytes, largest) << ra << ": a ring of the largest block";
    reset_memory_peak();
    for (int i = 0; i < 4; ++i) {
      Comparison c = compare_outputs(expected, ex->forward({x.clone()}));
      ASSERT_TRUE(c.equal) << ra << " inference " << i << ": " << c.difference;
    }
    EXPECT_LE(ex->weight_memory().peak, p.arena_bytes + p.pinned_bytes) << ra;
    EXPECT_LE(memory_stats().peak, p.arena_bytes) << ra << ": no byte of the ring counted twice";
    const Executor::PipelineStats ps = ex->pipeline_stats();
    if (std::string(ra) == "ring") {
      EXPECT_GT(ps.layers_started_early, 0u) << "layers ran while the rest of their block landed";
      EXPECT_GT(ps.released_early_bytes, 0u) << "blocks gave their first layers' bytes back";
    } else {
      EXPECT_EQ(ps.layers_started_early, 0u) << ra;
      EXPECT_EQ(ps.released_early_bytes, 0u) << ra;
    }
    if (std::string(ra) == "ring-whole") {
      EXPECT_EQ(ex->streamed_blocks(), 0u);
      continue;
    }
    // Checksums are verified on the first read of each layer, in one read: streaming after that.
    EXPECT_GE(ex->streamed_blocks(), 3u) << "consecutive blocks never fit together here";
    // Budget changes at layers in the middle, tight and back, with a block streaming.
    ASSERT_NO_FATAL_FAILURE(change_budgets_mid_inference(
        *ex, x, expected, 5, [&](int trial) { return trial % 2 ? tight : tight + largest / 2; }, ra));
    // A read failing while blocks stream fails that inference only.
    ex = Executor::open(pk.img, o);
    (void)ex->forward({x.clone()});
    const std::uint64_t before = ex->streamed_blocks();
    fail = true;
    std::string e = error_of([&] { ex->forward({x.clone()}); });
    fail = false;
    EXPECT_NE(e.find("Input/output error"), std::string::npos) << e;
    Comparison c = compare_outputs(expected, ex->forward({x.clone()}));
    EXPECT_TRUE(c.equal) << "usable after a failed streamed read: " << c.difference;
    EXPECT_GT(ex->streamed_blocks(), before);
    // A read failing past the first piece of the largest block: in the middle of that block.
    const ExecutionPlan& q = ex->plan();
    for (size_t b = 0; b < q.blocks.size(); ++b) {
      if (!q.resident[b] && q.block_bytes[b] == largest) {
        fail_from = info.layers[q.blocks[b].first].offset + (2 << 20);
        fail_to = info.layers[q.blocks[b].first].offset + largest;
      }
    }
    ASSERT_GT(fail_from, 0u);
    fail = true;
    e = error_of([&] { ex->forward({x.clone()}); });
    fail = false;
    fail_from = 0;
    fail_to = ~0ull;
    EXPECT_NE(e.find("Input/output error"), std::string::npos) << ra << ": " << e;
    EXPECT_NE(e.find("(block "), std::string::npos) << ra << ": names the block: " << e;
    for (int i = 0; i < 2; ++i) {
      c = compare_outputs(expected, ex->forward({x.clone()}));
      EXPECT_TRUE(c.equal) << ra << ": usable after a read failed inside a block: " << c.difference;
    }
    EXPECT_LE(ex->weight_memory().peak, q.arena_bytes + q.pinned_bytes + q.retained_bytes)
        << ra << ": arena " << q.arena_bytes << " pinned " << q.pinned_bytes << " retained " << q.retained_bytes
        << " resident " << q.resident_bytes;
  }
}

// Note [Streaming into the ring]: while a streamed block waits for older blocks' bytes, blocks
// that overlap nothing held are read after it ("ring"); "ring-serial" reads nothing after it
// until it is whole. Both bit-identical within the budget, budget changes in the middle of an
// inference included (they take the blocks read past the streamed one back too).
TEST(Executor, BlocksAreReadPastAStreamedBlockThatWaits) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const ImageInfo& info = pk.info;
  torch::manual_seed(9);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  install_cpu_meter();
  for (const std::string ra : {"ring", "ring-serial"}) {
    ExecutorOptions o;
    set_executor_option(&o, "--read-ahead", ra);
    o.budget = info.data_size / 3;
    auto ex = Executor::open(pk.img, o);
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(forward_within(*ex, x, expected, o.budget, ra + " inference " + std::to_string(i)));
    }
    EXPECT_GT(ex->streamed_blocks(), 0u) << ra;
    const std::uint64_t past = ex->pipeline_stats().read_past_streamed;
    if (ra == "ring") {
      EXPECT_GT(past, 0u) << "blocks read while a streamed one waited";
    } else {
      EXPECT_EQ(past, 0u);
    }
    ASSERT_NO_FATAL_FAILURE(change_budgets_mid_inference(
        *ex, x, expected, 3, [&](int trial) { return trial % 2 ? info.data_size / 3 : info.data_size / 4; }, ra));
  }
}

// Note [Tracing]: with a trace on, an inference shows every layer run once (in its block), the
// block reader's requests whose bytes add up to what it read, the disk's busy periods, the read
// cursor's events, and one span per inference; outputs stay bit-identical and within the budget.
TEST(Executor, ATraceShowsEveryLayerAndEveryByteRead) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  const ImageInfo& info = pk.info;
  torch::manual_seed(11);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  const c10::IValue expected = reference(pk.m, x);
  install_cpu_meter();
  ExecutorOptions o;
  o.budget = info.data_size / 3;
  trace_start();
  auto ex = Executor::open(pk.img, o);
  ASSERT_TRUE(forward_within(*ex, x, expected, o.budget, "warm-up"));
  const std::uint64_t read0 = ex->bytes_read();
  trace_start();  // the two inferences below only
  constexpr int kRuns = 2;
  for (int i = 0; i < kRuns; ++i) ASSERT_TRUE(forward_within(*ex, x, expected, o.budget, "traced " + std::to_string(i)));
  ex->set_budget(o.budget);  // an instant on the control lane
  const std::string path = ::testing::TempDir() + "swapnet_executor_trace.json";
  ASSERT_TRUE(trace_write(path).ok());
  // Reads still in flight when the trace stopped are in bytes_read but not traced.
  const std::uint64_t read1 = ex->bytes_read();
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["otherData"]["dropped_events"], 0);
  const int L = static_cast<int>(info.layers.size());
  std::vector<int> runs(L, 0);
  std::uint64_t read_bytes = 0;
  int inferences = 0, busy = 0, cursor = 0, budgets = 0;
  double busy_us = 0;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"], name = e.value("name", "");
    if (ph == "X" && name.rfind("layer ", 0) == 0) {
      const int k = std::stoi(name.substr(6));
      ASSERT_TRUE(k >= 0 && k < L) << name;
      ++runs[k];
      const auto [first, last] = ex->plan().blocks[e["args"]["block"].get<int>()];
      EXPECT_TRUE(first <= k && k <= last) << name << " in block " << e["args"]["block"];
    }
    if (ph == "b" && name.rfind("read ", 0) == 0) read_bytes += e["args"]["bytes"].get<std::uint64_t>();
    if (ph == "X" && name == "inference " + std::to_string(inferences + 1)) ++inferences;  // the warm-up was 0
    if (ph == "X" && name == "busy") {
      ++busy;
      busy_us += e["dur"].get<double>();
    }
    if (ph == "i" && (name.rfind("read block", 0) == 0 || name.rfind("stream block", 0) == 0 || name.rfind("held:", 0) == 0)) ++cursor;
    if (ph == "i" && name == "budget") ++budgets;
  }
  EXPECT_EQ(runs, std::vector<int>(L, kRuns)) << "every layer once per inference";
  EXPECT_EQ(inferences, kRuns);
  EXPECT_GT(busy, 0);
  EXPECT_GT(busy_us, 0.0);
  EXPECT_GT(cursor, 0);
  EXPECT_EQ(budgets, 1);
  EXPECT_GT(read_bytes, 0u);
  EXPECT_LE(read_bytes, read1 - read0);
  EXPECT_GE(read_bytes + o.budget, read1 - read0) << "only reads in flight at the end are missing";
  std::remove(path.c_str());
}

TEST(Executor, CorruptBlockIsCaughtOnFirstFetch) {
  Packed pk = packed("resnet18", {1, 3, 64, 64});
  ImageInfo& info = pk.info;
  // A copy: the packed image is the process's, shared with the tests after this one (Note
  // [Packed once per process]).
  const std::string img = pk.img + ".corrupt";
  test_util::spit(img, test_util::slurp(pk.img));
  {
    FILE* f = std::fopen(img.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(info.layers[10].offset + 8), SEEK_SET);
    int c = std::fgetc(f);
    std::fseek(f, -1, SEEK_CUR);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
  }
  ExecutorOptions o;
  o.budget = std::max(info.data_size / 2, min_budget(info));
  auto ex = Executor::open(img, o);
  std::string e = error_of([&] { ex->forward({torch::randn({1, 3, 64, 64})}); });
  EXPECT_NE(e.find("checksum mismatch in layer 10 (" + info.layers[10].name + ")"), std::string::npos) << e;
  std::remove(img.c_str());
}

}  // namespace
}  // namespace swapnet
