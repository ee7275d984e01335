// swapnet run: inference from a swap image within a memory budget, in one of three modes:
//   swapnet  blocks fetched with O_DIRECT into the two-ended arena while the previous block
//            runs, bound by reference (the design);
//   direct   the whole model read once into memory, then in-memory inference (the paper's DInf);
//   naive    the standard path, for ablation: buffered read of each block, a full copy into
//            freshly allocated "dummy" tensors, no overlap between I/O and compute. Each block's
//            pages are dropped from the page cache once copied (POSIX_FADV_DONTNEED): the budget
//            has no room to keep the model there, and a naive path that did would be reading
//            from RAM the device does not have.
// --check compares every output with direct inference bit for bit. --compare runs each mode in
// its own process (so each one's memory is its own), rounds interleaved, and prints ratios.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <iostream>
#include <sstream>
#include <thread>

#include "commands.h"
#include "inputs.h"
#include "swapnet/allocator.h"
#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep)) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::vector<c10::IValue> inputs_for(const Common& c, const ImageInfo& info, std::vector<std::string>* shapes) {
  *shapes = c.input_shapes.empty() ? split(info.input_shapes, ' ') : c.input_shapes;
  if (shapes->empty()) throw Error("the image records no example input: give --input-shape");
  return swapnet::make_inputs(*shapes, c.seed);
}

void drop_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void inputs_to_cuda(std::vector<c10::IValue>* inputs) {
  for (auto& v : *inputs) {
    if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().to(at::Device(at::kCUDA, 0));
  }
}

InMemory::InMemory(const std::string& path, const ImageInfo& info, bool cuda) : sk(Skeleton::from_image(info, path)) {
  std::unique_ptr<BlockReader> r;
  BlockReader::open(path, ReaderOptions{}, &r).throw_if_error();
  data = alloc_aligned(info.data_size);
  if (data == nullptr) throw Error(path + ": cannot allocate " + format_bytes(info.data_size));
  Status s = r->read(info.data_offset, info.data_size, data);
  if (!s.ok()) {
    free_aligned(data);
    throw Error(s.message());
  }
  sk.bind_layers(0, static_cast<int>(info.layers.size()) - 1, data, info.data_offset);
  if (cuda) {
    for (int i = 0; i < static_cast<int>(sk.slots().size()); ++i) {
      if (sk.slot(i).defined()) sk.bind_slot(i, sk.slot(i).to(at::Device(at::kCUDA, 0)));
    }
    free_aligned(data);
    data = nullptr;
  }
}
InMemory::~InMemory() { free_aligned(data); }

namespace {

using json = nlohmann::json;

}  // namespace

std::uint64_t vm_hwm_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Note [An honest naive path]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The naive path holds each block twice while it binds it: the buffer it read into and the
// tensors it copied into. Planned as the paper's two-block pipeline in the same budget, a large
// block beside a small one (gpt_350m at 1/4: a 361 MB block in 406 MB) made it hold 731 MB, and
// it was compared with swapnet in memory the budget does not have. Its blocks are therefore
// planned in half of what the budget leaves after activations and pinned weights, and the plan
// is checked: buffer + copy of the largest block + activations + pinned weights <= the budget.
// Its minimum is that sum for the finest partition (twice the largest layer + the rest); below
// it naive does not run, and says so.

std::uint64_t largest_block(const ExecutionPlan& plan) {
  std::uint64_t largest = 0;
  for (std::uint64_t b : plan.block_bytes) largest = std::max(largest, b);
  return largest;
}

std::uint64_t naive_peak_bytes(const ExecutionPlan& plan) {
  return 2 * largest_block(plan) + plan.activation_bytes + plan.pinned_bytes;
}

namespace {
ExecutorOptions naive_options(ExecutorOptions eo) {
  eo.residency = false;  // the paper's naive swap re-reads every block
  eo.resident.clear();
  eo.partition.clear();
  eo.blocks = 0;
  eo.read_ahead = ReadAhead::kRing;  // blocks limited by one arena, not by pairs
  return eo;
}
}  // namespace

std::uint64_t naive_min_budget(const ImageInfo& info, const ExecutorOptions& options) {
  ExecutorOptions eo = naive_options(options);
  eo.budget = min_budget(info, eo);
  return naive_peak_bytes(plan_execution(info, eo));
}

ExecutionPlan naive_plan(const ImageInfo& info, const ExecutorOptions& options, const std::string& path) {
  ExecutorOptions eo = naive_options(options);
  const std::uint64_t budget = options.budget;
  const std::uint64_t least = min_budget(info, eo);
  const std::uint64_t reserve = std::min(planning_reserve(info, eo), least);
  // From half of what the budget leaves after the reserve down to the finest plan (at `least`),
  // whose peak is naive's minimum: the first plan whose buffer + copy fit is naive's.
  std::uint64_t half = budget > reserve ? reserve + (budget - reserve) / 2 : least;
  for (;;) {
    eo.budget = std::max(half, least);
    ExecutionPlan p = plan_execution(info, eo);
    const std::uint64_t peak = naive_peak_bytes(p);
    if (peak <= budget) return p;
    if (eo.budget == least) {
      throw Error(path + ": --mode naive: budget " + std::to_string(budget) + " bytes (" + format_bytes(budget) +
                  ") is below naive's minimum " + std::to_string(peak) + " bytes (" + format_bytes(peak) +
                  ": twice the largest layer, its read buffer and its copy, + activations)");
    }
    half = eo.budget - std::min(eo.budget - least, peak - budget);
  }
}

// The naive path: per block, buffered read into a fresh buffer, copy into freshly allocated
// tensors (the "dummy model" being filled), bind, run, free. No overlap.
c10::IValue naive_forward(Skeleton& sk, const std::string& path, const ImageInfo& info, const ExecutionPlan& plan,
                          std::vector<c10::IValue> inputs, std::uint64_t* bytes_read) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  // No kernel read-ahead: the paper's naive path reads a block, then runs it. With read-ahead
  // (8 MiB on this VM's disk) the kernel went on reading the next blocks while naive computed,
  // pages still in flight survived the DONTNEED below, and naive read part of the model from
  // memory the budget does not have (yolov3 at 400 MB/s: a median below the I/O bound).
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  Skeleton::Run run = sk.begin(std::move(inputs));
  for (const auto& [first, last] : plan.blocks) {
    const std::uint64_t off = info.layers[first].offset;
    const std::uint64_t len = info.layers[last].offset + info.layers[last].size - off;
    std::vector<char> buf(len);
    std::uint64_t done = 0;
    const auto queued = std::chrono::steady_clock::now();
    while (done < len) {
      ssize_t n = ::pread(fd, buf.data() + done, len - done, static_cast<off_t>(off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        throw Error(path + ": naive read failed at offset " + std::to_string(off + done));
      }
      done += static_cast<std::uint64_t>(n);
    }
    emulated_read_wait(queued, len);  // Note [An emulated disk] (swapcore/src/emulated_disk.cpp)
    *bytes_read += len;
    (void)::posix_fadvise(fd, static_cast<off_t>(off), static_cast<off_t>(len), POSIX_FADV_DONTNEED);
    for (int k = first; k <= last; ++k) {
      for (int s : sk.layers()[k].slots) {
        const SlotInfo& sl = sk.slots()[s];
        at::Tensor dummy = at::empty_strided(sl.sizes, sl.strides, at::TensorOptions().dtype(sl.dtype));
        at::Tensor src = at::from_blob(buf.data() + (info.tensors[s].offset - off), sl.sizes, sl.strides,
                                       at::TensorOptions().dtype(sl.dtype));
        std::memcpy(dummy.data_ptr(), src.data_ptr(), info.tensors[s].nbytes);  // same strides: the span
        sk.bind_slot(s, dummy);
      }
    }
    sk.run_layers(run, last + 1);
    for (int k = first; k <= last; ++k) {
      for (int s : sk.layers()[k].slots) {
        const auto& users = sk.slots()[s].used_by;
        if (users.empty() || users.back() <= last) sk.unbind_slot(s);  // shared weights stay for later blocks
      }
    }
  }
  ::close(fd);
  return sk.finish(run);
}

namespace {

// Reads [begin, end) of `path` in 4 MiB reads with swapnet's own block reader (O_DIRECT,
// io_uring, registered buffer), cyclically, at `mb_s` (paced), until destroyed: the reads
// swapnet makes, without swapnet, so that their cost to the compute on this machine
// (interrupts, the hypervisor's copies, memory bandwidth) can be measured apart.
class BackgroundReader {
 public:
  BackgroundReader(const std::string& path, std::uint64_t begin, std::uint64_t end, double mb_s) {
    if (mb_s <= 0 || end <= begin) return;
    BlockReader::open(path, ReaderOptions{}, &reader_).throw_if_error();
    buf_ = alloc_aligned(kChunk);
    if (buf_ == nullptr) throw Error("cannot allocate the background reader's buffer");
    std::memset(buf_, 0, kChunk);
    (void)reader_->register_buffers({{buf_, kChunk}});
    thread_ = std::thread([=] {
      const auto t0 = Clock::now();
      double done = 0;
      std::uint64_t at = begin;
      while (!stop_.load()) {
        const std::uint64_t n = std::min<std::uint64_t>(kChunk, end - at);
        if (!reader_->read(at, n, buf_).ok()) break;
        done += static_cast<double>(n);
        at = at + n >= end ? begin : at + n;
        const auto due = t0 + std::chrono::duration<double>(done / (mb_s * 1e6));
        std::this_thread::sleep_until(std::chrono::time_point_cast<Clock::duration>(due));
      }
    });
  }
  ~BackgroundReader() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    reader_.reset();
    if (buf_ != nullptr) free_aligned(buf_);
  }

 private:
  static constexpr std::size_t kChunk = 4u << 20;
  std::unique_ptr<BlockReader> reader_;
  void* buf_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

json run_one(const std::string& path, const Common& c, const RunOptions& o) {
  install_cpu_meter();
  ImageInfo info;
  read_image_info(path, &info).throw_if_error();
  std::vector<std::string> shapes;
  auto inputs = inputs_for(c, info, &shapes);
  ExecutorOptions eo;
  eo.budget = o.budget.empty() ? 0 : parse_size(o.budget);
  eo.blocks = o.blocks;
  for (const auto& p : split(o.partition, ',')) eo.partition.push_back(std::stoi(p));
  for (const auto& r : split(o.resident, ',')) eo.resident.push_back(std::stoi(r));
  set_executor_option(&eo, "--plan", o.plan);
  // The device profile plans (auto, optimal) and predicts (every plan) swapped runs.
  if (o.mode != "direct" && !o.budget.empty()) use_profile(device_profile(path, c, o.profile), &eo);
  if (!eo.resident.empty() && eo.partition.empty() && eo.blocks == 0) {
    throw Error("--resident needs --partition or --blocks (the blocks it numbers)");
  }
  set_executor_option(&eo, "--read-ahead", o.read_ahead);
  set_executor_option(&eo, "--verify", o.verify);
  eo.learn_after = o.learn;
  if (o.learn > 0 && o.mode != "swapnet") throw Error("--learn is swapnet's: mode swapnet only");
  if (!o.learn_store.empty() && o.learn == 0) throw Error("--learn-store " + o.learn_store + " needs --learn N (N in 3..1000)");
  eo.learn_store = o.learn_store;
  if (o.mode != "direct" && o.budget.empty()) throw Error("--budget is required for mode " + o.mode);
  if (o.mode == "direct") eo.budget = UINT64_MAX / 4;
  set_executor_option(&eo, "--device", o.device);
  const bool cuda = eo.device == ExecutorOptions::Device::kCUDA;
  if (cuda) {
    if (o.mode == "naive") throw Error("--mode naive runs on the CPU only (it is the paper's CPU baseline)");
    require_cuda(path);  // before the inputs move, so the message is ours and not PyTorch's
    inputs_to_cuda(&inputs);
  }
  // GPU work is asynchronous: a timed forward ends when the GPU is done with it.
  auto sync = [&] {
    if (!cuda) return;
    const auto* g = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    g->synchronizeStream(g->getStream(at::Device(at::kCUDA, 0)));
  };

  drop_page_cache(path);
  std::uint64_t cache_before = 0, cache_after = 0;
  page_cache_bytes(path, &cache_before).throw_if_error();

  std::vector<double> lat;
  std::vector<c10::IValue> outs;
  std::uint64_t read_before = 0, read_after = 0, arena_peak = 0, act_peak = 0, pinned = 0, arena_bytes = 0;
  // Note [Lending the activation reserve] in zone_lender.cpp: the most of activations and the blocks
  // lent their reserve's bytes at once.
  std::uint64_t act_lent_peak = 0;
  std::uint64_t resident_bytes = 0;
  double predicted_ms = 0;
  json plan_json, resident_json = json::array(), plan_facts = json::object();
  std::string backend = "-", memory = "host";
  double bind_us = 0;
  std::uint64_t streamed = 0, remeasured = 0, reserve_after = 0;
  json learning;  // --learn: Executor::learning()
  json pipeline = json::object();  // per timed inference (Note [Layer by layer] in read_ahead.cpp)
  const int iters = std::max(1, o.iters);
  auto measure = [&](const std::function<c10::IValue()>& fwd, const std::function<std::uint64_t()>& bytes,
                     const std::function<void()>& timed = nullptr,
                     const std::function<bool()>& replanned = nullptr,
                     const std::function<bool()>& decided = nullptr) {
    fwd();  // warm-up (lazy initialisation), not timed
    // --learn N: the first window, not timed either: N inferences and 1 s at least (Note [Noise
    // in the window]), until it is decided (at most 60 s: a window too noisy to tell grows).
    const auto window_until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int i = 1; i < o.learn || (o.learn > 0 && decided && !decided() && std::chrono::steady_clock::now() < window_until);
         ++i) {
      fwd();
    }
    // A plan learned in the warm-up reads its resident blocks (and a block's kept part) once, in
    // its first inference: that one is not timed either.
    if (replanned && replanned()) fwd();
    if (timed) timed();
    reset_memory_peak();
    read_before = bytes();
    for (int i = 0; i < iters; ++i) {
      // Per inference: outputs kept from earlier iterations (for --check) are not its memory.
      reset_cpu_meter_peak();
      const std::uint64_t base = cpu_meter().current;
      auto t0 = Clock::now();
      c10::IValue out = fwd();
      sync();
      lat.push_back(ms_since(t0));
      const CpuMeterStats after = cpu_meter();
      act_peak = std::max(act_peak, after.peak - base);
      act_lent_peak = std::max(act_lent_peak, after.peak_with_lent - base);
      if (o.check && outs.size() < 3) outs.push_back(out);
    }
    read_after = bytes();
    arena_peak = memory_stats().peak;
  };
  std::uint64_t naive_read = 0;
  if (!o.trace.empty() && o.mode != "swapnet") throw Error("--trace records swapnet's pipeline: mode swapnet only");
  if (o.mode == "swapnet") {
    if (!o.trace.empty()) trace_start();  // before open: the executor takes a group in the trace
    auto ex = Executor::open(path, eo);
    // The plan's facts in the JSON: at open, and again after --learn's warm-up re-planned.
    auto describe = [&](const ExecutionPlan& p) {
      pinned = p.pinned_bytes;
      arena_bytes = p.arena_bytes;
      resident_bytes = p.resident_bytes;
      predicted_ms = p.predicted_ms;
      plan_json = json::array();
      resident_json = json::array();
      for (size_t b = 0; b < p.blocks.size(); ++b) {
        plan_json.push_back({p.blocks[b].first, p.blocks[b].second});
        resident_json.push_back(static_cast<int>(p.resident[b]));
      }
      plan_facts["read_ahead"] = to_string(p.read_ahead);
      plan_facts["pair_bytes"] = p.pair_bytes;
      plan_facts["plan_read_bytes"] = p.read_bytes;
      plan_facts["retained_bytes"] = p.retained_bytes;
    };
    describe(ex->plan());
    plan_facts["min_read_bytes"] = min_read_bytes(info, eo);
    backend = to_string(ex->backend());
    memory = to_string(ex->memory());
    Executor::PipelineStats ps0;
    std::uint64_t disk0 = 0;
    measure([&] { return ex->forward(clone_inputs(inputs)); }, [&] { return ex->bytes_used(); },
            [&] {
              ps0 = ex->pipeline_stats();
              disk0 = ex->bytes_read();
              if (!o.trace.empty()) trace_start();  // the timed inferences only
            },
            [&] { return ex->learning().adopted > 0; }, [&] { return ex->learning().windows > 0; });
    if (!o.trace.empty()) trace_write(o.trace).throw_if_error();
    const Executor::PipelineStats ps1 = ex->pipeline_stats();
    // How long the disk had a read of ours during the timed inferences: near all of their time
    // means the disk never idled (the pipeline is at the I/O bound whatever the raw rate read
    // later says); the bytes over that time are the rate the disk gave while it worked for us.
    double timed_ms = 0;
    for (double v : lat) timed_ms += v;
    const double busy_ms = ps1.disk_busy_ms - ps0.disk_busy_ms;
    const double read_bytes = static_cast<double>(ex->bytes_read() - disk0);
    pipeline = {{"read_wait_ms", (ps1.read_wait_ms - ps0.read_wait_ms) / iters},
                {"disk_busy_ms", busy_ms / iters},
                {"disk_busy_fraction", timed_ms > 0 ? busy_ms / timed_ms : 0.0},
                {"disk_mb_s_while_busy", busy_ms > 0 ? json(read_bytes / (busy_ms * 1e3)) : json(nullptr)},
                {"layers_started_early", static_cast<double>(ps1.layers_started_early - ps0.layers_started_early) / iters},
                {"released_early_bytes", static_cast<double>(ps1.released_early_bytes - ps0.released_early_bytes) / iters},
                {"read_past_streamed", static_cast<double>(ps1.read_past_streamed - ps0.read_past_streamed) / iters},
                {"read_at_layer_end", static_cast<double>(ps1.read_at_layer_end - ps0.read_at_layer_end) / iters},
                // Note [Lending the activation reserve]: since open, warm-up included.
                {"zone_bytes", ps1.zone_bytes},
                {"lent_peak_bytes", ps1.lent_peak_bytes},
                {"zone_peak_bytes", ps1.zone_peak_bytes},
                {"zone_misses", ps1.zone_misses}};
    bind_us = ex->bind_us_per_tensor();
    streamed = ex->streamed_blocks();
    remeasured = ex->remeasured();
    reserve_after = ex->plan().activation_bytes;
    if (o.learn > 0) {
      const Executor::Learning l = ex->learning();
      learning = {{"learn_after", o.learn},
                  {"windows", l.windows},
                  {"replans", l.replans},
                  {"kept_plans", l.kept_plans},
                  {"layer_error", l.layer_error},
                  {"plan_error", l.plan_error},
                  {"window", l.window},
                  {"noise", l.noise},
                  {"predicted_before_ms", l.predicted_before_ms},
                  {"predicted_after_ms", l.predicted_after_ms},
                  {"measured_layers_ms", l.measured_layers_ms},
                  {"planned_layers_ms", l.planned_layers_ms},
                  {"read_mb_s", l.read_mb_s},
                  {"planned_read_mb_s", l.planned_read_mb_s},
                  {"predicted_at_open_ms", predicted_ms},
                  {"loaded_times", l.loaded_times},
                  {"loaded_rate", l.loaded_rate},
                  {"stored", l.stored},
                  {"num_blocks_at_open", plan_json.size()}};
      describe(ex->plan());  // what the timed inferences ran: the plan in force at the end
    }
  } else if (o.mode == "naive") {
    // Note [An honest naive path]; --blocks / --partition are ignored: naive's blocks must
    // hold twice.
    ExecutionPlan p = naive_plan(info, eo, path);
    Skeleton sk = Skeleton::from_image(info, path);
    for (const auto& b : p.blocks) plan_json.push_back({b.first, b.second});
    backend = "buffered_copy";
    measure([&] { return naive_forward(sk, path, info, p, clone_inputs(inputs), &naive_read); },
            [&] { return naive_read; });
    // The read buffer is not libtorch's (the meter counts the copies and activations).
    arena_peak = arena_bytes = largest_block(p);
  } else if (o.mode == "direct") {
    InMemory direct(path, info, cuda);
    plan_json.push_back({0, static_cast<int>(info.layers.size()) - 1});
    arena_bytes = info.data_size;
    direct.sk.forward(clone_inputs(inputs));  // warm-up before the background reads start
    BackgroundReader background(path, info.data_offset, info.data_offset + info.data_size, o.background_mb_s);
    measure([&] { return direct.sk.forward(clone_inputs(inputs)); }, [] { return std::uint64_t{0}; });
    arena_peak = info.data_size;  // all weights resident
  } else {
    throw Error("--mode '" + o.mode + "' is not one of swapnet|direct|naive");
  }
  const std::uint64_t rss = vm_hwm_bytes();
  page_cache_bytes(path, &cache_after).throw_if_error();
  // The raw rate last, so that its reads do not delay the timed ones (a throttled disk makes a
  // burst pay later): one pass, then passes back to back for a second, what a disk kept busy
  // delivers: the rate an I/O-bound pipeline can reach (and a real disk's, which has no burst
  // credit after idle).
  const double first_pass = raw_read_mb_s(path, info.data_offset, info.data_offset + info.data_size);
  const double raw = raw_read_mb_s(path, info.data_offset, info.data_offset + info.data_size, 1.0);

  json j;
  j["image"] = path;
  j["mode"] = o.mode;
  j["budget_bytes"] = o.mode == "direct" ? json(nullptr) : json(eo.budget);
  j["blocks"] = plan_json;
  j["num_blocks"] = plan_json.size();
  j["input_shapes"] = shapes;
  j["iters"] = iters;
  j["threads"] = at::get_num_threads();
  // Set by the `swapnet` command unless the user did (Note [OpenBLAS's idle spin] in launcher.cpp).
  const char* blas_timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  j["openblas_thread_timeout"] = blas_timeout ? json(blas_timeout) : json(nullptr);
  j["latency_ms"] = {{"median", percentile(lat, 0.5)}, {"p90", percentile(lat, 0.9)}, {"all", lat}};
  // Blocks lent the activation reserve's bytes are counted with the activations they were lent by
  // (the arena's peak counts the ring's own bytes).
  j["peak_model_bytes"] = arena_peak + std::max(act_peak, act_lent_peak) + pinned;
  j["activation_and_lent_peak_bytes"] = act_lent_peak;
  j["arena_bytes"] = arena_bytes;
  j["resident_bytes"] = resident_bytes;
  j["resident_blocks"] = resident_json;
  j["activation_peak_bytes"] = act_peak;
  j["pinned_bytes"] = pinned;
  j["peak_rss_bytes"] = rss;
  j["page_cache_growth_bytes"] = static_cast<std::int64_t>(cache_after) - static_cast<std::int64_t>(cache_before);
  const double per_inf = static_cast<double>(read_after - read_before) / iters;
  j["bytes_read_per_inference"] = per_inf;
  j["raw_io_mb_s"] = raw;
  j["raw_first_pass_mb_s"] = first_pass;
  j["io_bound_ms"] = per_inf / (raw * 1e3);
  j["backend"] = backend;
  j["memory"] = memory;
  j["device"] = o.device;
  j["verify"] = o.verify;
  j["plan"] = o.plan;
  if (predicted_ms > 0) j["predicted_ms"] = predicted_ms;
  j.update(plan_facts);
  if (o.mode == "swapnet") {
    j["bind_us_per_tensor"] = bind_us;
    j["streamed_blocks"] = streamed;  // read into ring space older blocks still held, warm-up included
    // Per timed inference: the executing thread waiting for reads, layers run while the rest of
    // their block was read, ring bytes given back before their block ended.
    j["pipeline"] = pipeline;
    // Inputs no profile in the image covered, measured in the warm-up (Note [Dynamic shapes]),
    // and the activation reserve the timed inferences planned with.
    j["remeasured_inputs"] = remeasured;
    j["activation_reserve_bytes"] = reserve_after;
    if (!learning.is_null()) j["learning"] = learning;
  }
  if (o.check) {
    // The reference is built after the measurements, so its memory is not in peak_rss_bytes.
    InMemory direct(path, info, cuda);
    c10::IValue ref = direct.sk.forward(clone_inputs(inputs));
    bool equal = true;
    std::string diff;
    for (const auto& out : outs) {
      Comparison cmp = compare_outputs(ref, out);
      if (!cmp.equal && equal) diff = cmp.difference;
      equal = equal && cmp.equal;
    }
    j["equal"] = equal;
    if (!equal) j["difference"] = diff;
  }
  return j;
}

// Runs `swapnet run ... --mode MODE --json` as a child process and parses its JSON.
json run_child(const std::string& self, const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(self.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(self.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error("child run (" + args[3] + ") failed with status " + std::to_string(WEXITSTATUS(status)));
  }
  return json::parse(out);
}

}  // namespace

int run(const std::string& path, const Common& c, const RunOptions& o) {
  apply_common(c);
  if (!o.compare) {
    json j = run_one(path, c, o);
    if (c.json) {
      std::cout << j.dump() << "\n";
    } else {
      std::printf("%s: mode %s, budget %s, %zu blocks (%s, %s memory), %d iterations\n", path.c_str(), o.mode.c_str(),
                  o.budget.empty() ? "-" : o.budget.c_str(), j["blocks"].size(), j["backend"].get<std::string>().c_str(),
                  j["memory"].get<std::string>().c_str(), j["iters"].get<int>());
      std::printf("latency %.1f ms median, %.1f ms p90; io_bound %.1f ms (%.0f MB read at %.0f MB/s raw)\n",
                  j["latency_ms"]["median"].get<double>(), j["latency_ms"]["p90"].get<double>(),
                  j["io_bound_ms"].get<double>(), j["bytes_read_per_inference"].get<double>() / 1e6,
                  j["raw_io_mb_s"].get<double>());
      std::printf("peak model memory %s (arena %s, activations %s, pinned %s); peak RSS %s; page cache growth %lld B\n",
                  format_bytes(j["peak_model_bytes"].get<std::uint64_t>()).c_str(),
                  format_bytes(j["arena_bytes"].get<std::uint64_t>()).c_str(),
                  format_bytes(j["activation_peak_bytes"].get<std::uint64_t>()).c_str(),
                  format_bytes(j["pinned_bytes"].get<std::uint64_t>()).c_str(),
                  format_bytes(j["peak_rss_bytes"].get<std::uint64_t>()).c_str(),
                  static_cast<long long>(j["page_cache_growth_bytes"].get<std::int64_t>()));
      if (j.contains("equal")) {
        std::printf("outputs %s direct inference\n", j["equal"].get<bool>() ? "bit-identical to" : "DIFFER from");
      }
    }
    return j.contains("equal") && !j["equal"].get<bool>() ? 1 : 0;
  }
  // --compare: each mode in its own process, rounds interleaved.
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw Error("cannot find this executable (/proc/self/exe)");
  self[n] = '\0';
  std::vector<std::string> modes = {"direct", "swapnet", "naive"};
  if (o.device == "cuda") modes = {"direct", "swapnet"};  // naive is the CPU baseline
  // naive holds a block twice (Note [An honest naive path]): below twice the largest layer +
  // activations (the ring's minimum is the largest layer) it cannot run in the budget at all.
  std::string naive_skipped;
  if (o.device != "cuda" && !o.budget.empty() && o.blocks == 0 && o.partition.empty()) {
    ImageInfo info;
    read_image_info(path, &info).throw_if_error();
    const std::uint64_t need = naive_min_budget(info, ExecutorOptions{}), budget = parse_size(o.budget);
    if (budget < need) {
      modes = {"direct", "swapnet"};
      naive_skipped = "naive needs " + std::to_string(need) + " bytes (" + format_bytes(need) +
                      ": twice the largest layer, its read buffer and its copy, + activations), the budget is " +
                      std::to_string(budget);
    }
  }
  std::map<std::string, std::vector<json>> results;
  for (int r = 0; r < std::max(1, o.rounds); ++r) {
    for (const auto& mode : modes) {
      std::vector<std::string> args = {"run", path, "--mode", mode, "--json", "--iters", std::to_string(o.iters),
                                       "--threads", std::to_string(at::get_num_threads()), "--seed",
                                       std::to_string(c.seed)};
      if (!o.budget.empty()) args.insert(args.end(), {"--budget", o.budget});
      if (o.blocks) args.insert(args.end(), {"--blocks", std::to_string(o.blocks)});
      if (!o.partition.empty()) args.insert(args.end(), {"--partition", o.partition});
      if (!o.resident.empty()) args.insert(args.end(), {"--resident", o.resident});
      if (!o.profile.empty()) args.insert(args.end(), {"--profile", o.profile});
      if (o.check && mode != "direct") args.push_back("--check");
      if (o.learn > 0 && mode == "swapnet") args.insert(args.end(), {"--learn", std::to_string(o.learn)});
      if (!o.learn_store.empty() && mode == "swapnet") args.insert(args.end(), {"--learn-store", o.learn_store});
      if (!o.trace.empty() && mode == "swapnet" && r + 1 == std::max(1, o.rounds)) args.insert(args.end(), {"--trace", o.trace});
      args.insert(args.end(), {"--verify", o.verify, "--plan", o.plan, "--device", o.device, "--read-ahead", o.read_ahead});
      for (const auto& s : c.input_shapes) args.insert(args.end(), {"--input-shape", s});
      results[mode].push_back(run_child(self, args));
      if (mode == "swapnet" && o.device == "cpu") {
        // Direct inference again, while the image is read at the pace swapnet just read it: what
        // those reads cost the compute on this machine, apart from swapnet.
        const json& sw = results["swapnet"].back();
        const double pace = sw["bytes_read_per_inference"].get<double>() /
                            (sw["latency_ms"]["median"].get<double>() * 1e3);
        std::vector<std::string> d = {"run", path, "--mode", "direct", "--json", "--iters", std::to_string(o.iters),
                                      "--threads", std::to_string(at::get_num_threads()), "--seed",
                                      std::to_string(c.seed), "--background-read", std::to_string(pace)};
        for (const auto& s : c.input_shapes) d.insert(d.end(), {"--input-shape", s});
        json r = run_child(self, d);
        r["background_mb_s"] = pace;
        results["direct_under_io"].push_back(std::move(r));
      }
    }
  }
  auto med = [&](const std::string& mode, const char* key, const char* sub = nullptr) {
    std::vector<double> v;
    for (const auto& j : results[mode]) v.push_back(sub ? j[key][sub].get<double>() : j[key].get<double>());
    return percentile(v, 0.5);
  };
  json j = results["swapnet"].back();
  j["rounds"] = o.rounds;
  // Each round's median per mode, in round order (the medians of these are what is reported):
  // how much the VM and a bursty throttle moved the runs.
  auto per_round = [&](const std::string& mode) {
    json v = json::array();
    for (const auto& r : results[mode]) v.push_back(r["latency_ms"]["median"]);
    return v;
  };
  j["latency_ms"]["median"] = med("swapnet", "latency_ms", "median");
  j["latency_ms"]["p90"] = med("swapnet", "latency_ms", "p90");
  j["latency_ms"].erase("all");  // the last round's inferences only
  j["latency_ms"]["rounds"] = per_round("swapnet");
  j["io_bound_ms"] = med("swapnet", "io_bound_ms");
  j["raw_io_mb_s"] = med("swapnet", "raw_io_mb_s");
  j["bytes_read_per_inference"] = med("swapnet", "bytes_read_per_inference");
  j["pipeline"]["disk_busy_fraction"] = med("swapnet", "pipeline", "disk_busy_fraction");
  j["pipeline"]["disk_busy_ms"] = med("swapnet", "pipeline", "disk_busy_ms");
  j["pipeline"]["read_wait_ms"] = med("swapnet", "pipeline", "read_wait_ms");
  {
    // The rate the disk gave swapnet's reads while they were in flight, over the rounds: above
    // the raw rate where the disk bursts (docs/partitioner.md, "When a run beats the bound").
    std::vector<double> v;
    for (const auto& r : results["swapnet"]) {
      const json& x = r["pipeline"]["disk_mb_s_while_busy"];
      if (x.is_number()) v.push_back(x.get<double>());
    }
    j["pipeline"]["disk_mb_s_while_busy"] = v.empty() ? json(nullptr) : json(percentile(v, 0.5));
  }
  std::uint64_t peak_model = 0, peak_rss = 0;
  bool equal = true;
  for (const auto& r : results["swapnet"]) {
    peak_model = std::max(peak_model, r["peak_model_bytes"].get<std::uint64_t>());
    peak_rss = std::max(peak_rss, r["peak_rss_bytes"].get<std::uint64_t>());
    if (r.contains("equal")) equal = equal && r["equal"].get<bool>();
  }
  j["peak_model_bytes"] = peak_model;
  j["peak_rss_bytes"] = peak_rss;
  if (o.check) j["equal"] = equal;
  const double direct_ms = med("direct", "latency_ms", "median");
  const bool naive = !results["naive"].empty();
  const double naive_ms = naive ? med("naive", "latency_ms", "median") : 0.0;
  // Page cache each mode left behind (the most over its rounds): memory outside the budget.
  auto cache_growth = [&](const std::string& mode) {
    std::int64_t most = 0;
    for (const auto& r : results[mode]) most = std::max(most, r["page_cache_growth_bytes"].get<std::int64_t>());
    return most;
  };
  j["page_cache_growth_bytes"] = cache_growth("swapnet");
  j["direct"] = {{"latency_ms", {{"median", direct_ms}, {"p90", med("direct", "latency_ms", "p90")}, {"rounds", per_round("direct")}}},
                 {"peak_model_bytes", results["direct"].back()["peak_model_bytes"]},
                 {"peak_rss_bytes", results["direct"].back()["peak_rss_bytes"]},
                 {"page_cache_growth_bytes", cache_growth("direct")}};
  if (!naive_skipped.empty()) j["naive"] = {{"skipped", naive_skipped}};
  if (naive) {
    j["naive"] = {{"latency_ms", {{"median", naive_ms}, {"p90", med("naive", "latency_ms", "p90")}, {"rounds", per_round("naive")}}},
                  {"peak_rss_bytes", results["naive"].back()["peak_rss_bytes"]},
                  {"bytes_read_per_inference", med("naive", "bytes_read_per_inference")},
                  {"page_cache_growth_bytes", cache_growth("naive")}};
  }
  j["ratio_vs_direct"] = j["latency_ms"]["median"].get<double>() / direct_ms;
  j["ratio_vs_bound"] = j["latency_ms"]["median"].get<double>() / std::max(direct_ms, j["io_bound_ms"].get<double>());
  {
    // The same ratio round by round (swapnet and direct run back to back in a round, the raw
    // rate right after swapnet), then its median: this VM's speed drifts by tens of percent over
    // minutes, and a ratio of neighbours drifts less than a ratio of medians taken apart.
    std::vector<double> paired;
    const size_t n = std::min(results["swapnet"].size(), results["direct"].size());
    for (size_t r = 0; r < n; ++r) {
      const json& sw = results["swapnet"][r];
      const double d = results["direct"][r]["latency_ms"]["median"].get<double>();
      paired.push_back(sw["latency_ms"]["median"].get<double>() / std::max(d, sw["io_bound_ms"].get<double>()));
    }
    if (!paired.empty()) {
      j["ratio_vs_bound_rounds"] = paired;
      j["ratio_vs_bound_paired"] = percentile(paired, 0.5);
    }
  }
  if (!results["direct_under_io"].empty()) {
    const double dio = med("direct_under_io", "latency_ms", "median");
    j["direct_under_io"] = {{"latency_ms", {{"median", dio}, {"p90", med("direct_under_io", "latency_ms", "p90")},
                                           {"rounds", per_round("direct_under_io")}}},
                            {"background_mb_s", med("direct_under_io", "background_mb_s")}};
    // The bound on this machine: computing while the same bytes are read (interrupts, the
    // hypervisor's copies and memory bandwidth cost the compute), or reading them.
    j["ratio_vs_bound_under_io"] = j["latency_ms"]["median"].get<double>() / std::max(dio, j["io_bound_ms"].get<double>());
  }
  if (naive) j["naive_ratio"] = naive_ms / j["latency_ms"]["median"].get<double>();
  // The physical bound in this budget: no schedule of these layers, reading at the raw rate
  // with weights and activations within the budget, is faster than memory_bound_ms (the
  // partitioner's derivation; it bounds the bytes any schedule reads too, so the plan's own
  // io_bound is not part of it); the layers' times are the image's, scaled to the direct
  // latency measured here (or under the same reads), their bytes the tensors' (no padding).
  // That bound allows a schedule to lend the bytes a layer's activations leave idle to weights;
  // swapnet's plans keep a constant activation reserve instead, and no such plan is faster than
  // reserve_bound_ms: the same bound with every layer's activations at the reserve, and at least
  // min_read_bytes read at the raw rate (Note [Two bounds] in docs/partitioner.md). The ratio to
  // the first is what swapnet leaves; to the second, what its engine leaves of what its plans can do.
  if (o.device == "cpu" && j["budget_bytes"].is_number()) {
    ImageInfo info;
    read_image_info(path, &info).throw_if_error();
    const double raw_mb_s = j["raw_io_mb_s"].get<double>();
    const std::uint64_t budget = j["budget_bytes"].get<std::uint64_t>();
    const double swapnet_ms = j["latency_ms"]["median"].get<double>();
    auto ratio = [&](double bound) { return std::isfinite(bound) ? json(swapnet_ms / bound) : json(nullptr); };
    auto finite = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
    auto bounds = [&](double compute_ms, const std::string& suffix) {
      const double mem = image_memory_bound_ms(info, budget, compute_ms, raw_mb_s);
      const double bound = std::max(compute_ms, mem);
      j["memory_bound" + suffix + "_ms"] = finite(mem);
      j["physical_bound" + suffix + "_ms"] = finite(bound);
      j["ratio_vs_physical_bound" + suffix] = ratio(bound);
      if (j.contains("min_read_bytes")) {
        const double reserve =
            image_reserve_bound_ms(info, budget, compute_ms, raw_mb_s, j["min_read_bytes"].get<std::uint64_t>());
        j["reserve_bound" + suffix + "_ms"] = finite(reserve);
        j["ratio_vs_reserve_bound" + suffix] = ratio(reserve);
      }
    };
    bounds(direct_ms, "");
    // Activation peaks per layer are in images of format 3; older ones bound with live bytes only.
    j["memory_bound_activations"] = info.version >= 3 ? "per-layer peaks" : "live bytes between layers";
    if (j.contains("direct_under_io")) bounds(j["direct_under_io"]["latency_ms"]["median"].get<double>(), "_under_io");
  }
  if (c.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s at budget %s, %zu blocks, %d rounds x %d iterations, each mode in its own process (medians)\n",
                path.c_str(), o.budget.c_str(), j["blocks"].size(), o.rounds, o.iters);
    std::printf("%-8s %12s %18s %14s\n", "mode", "latency ms", "peak model bytes", "peak RSS");
    std::printf("%-8s %12.1f %18s %14s\n", "direct", direct_ms,
                format_bytes(j["direct"]["peak_model_bytes"].get<std::uint64_t>()).c_str(),
                format_bytes(j["direct"]["peak_rss_bytes"].get<std::uint64_t>()).c_str());
    std::printf("%-8s %12.1f %18s %14s\n", "swapnet", j["latency_ms"]["median"].get<double>(),
                format_bytes(peak_model).c_str(), format_bytes(peak_rss).c_str());
    if (naive) {
      std::printf("%-8s %12.1f %18s %14s\n", "naive", naive_ms, "-",
                  format_bytes(j["naive"]["peak_rss_bytes"].get<std::uint64_t>()).c_str());
    }
    if (!naive_skipped.empty()) std::printf("naive: not run: %s\n", naive_skipped.c_str());
    std::printf("swapnet / direct = %.3f; swapnet / max(direct, io_bound %.1f ms) = %.3f", j["ratio_vs_direct"].get<double>(),
                j["io_bound_ms"].get<double>(), j["ratio_vs_bound"].get<double>());
    if (j.contains("ratio_vs_bound_paired")) std::printf(" (round by round: %.3f)", j["ratio_vs_bound_paired"].get<double>());
    if (naive) std::printf("; naive / swapnet = %.2f", j["naive_ratio"].get<double>());
    std::printf("\n");
    if (j.contains("direct_under_io")) {
      std::printf("direct while the image is read at swapnet's pace (%.0f MB/s): %.1f ms; swapnet / max(that, io_bound) = %.3f\n",
                  j["direct_under_io"]["background_mb_s"].get<double>(),
                  j["direct_under_io"]["latency_ms"]["median"].get<double>(), j["ratio_vs_bound_under_io"].get<double>());
    }
    if (j.contains("physical_bound_ms") && !j["physical_bound_ms"].is_null()) {
      std::printf("physical bound in this budget, max(direct, memory_bound %.1f ms): %.1f ms; swapnet / that = %.3f\n",
                  j["memory_bound_ms"].get<double>(), j["physical_bound_ms"].get<double>(),
                  j["ratio_vs_physical_bound"].get<double>());
      if (j.contains("reserve_bound_ms") && !j["reserve_bound_ms"].is_null()) {
        std::printf("with a constant activation reserve, as swapnet plans, no plan beats %.1f ms; swapnet / that = %.3f\n",
                    j["reserve_bound_ms"].get<double>(), j["ratio_vs_reserve_bound"].get<double>());
      }
    } else if (j.contains("physical_bound_ms")) {
      std::printf("physical bound: none (some layer's weights and activation peak do not fit the budget)\n");
    }
    if (o.check) std::printf("outputs %s direct inference\n", equal ? "bit-identical to" : "DIFFER from");
  }
  return o.check && !equal ? 1 : 0;
}

}  // namespace cli
}  // namespace swapnet
