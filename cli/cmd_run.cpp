// swapnet run: inference from a swap image within a memory budget, in one of three modes:
//   swapnet  blocks fetched with O_DIRECT into the read-ahead ring while earlier blocks run,
//            bound by reference (the design);
//   direct   the whole model read once into memory, then in-memory inference (the paper's DInf);
//   naive    the standard path, for ablation: buffered read of each block, a full copy into
//            freshly allocated "dummy" tensors, no overlap between I/O and compute. Each block's
//            pages are dropped from the page cache once copied (POSIX_FADV_DONTNEED): the budget
//            has no room to keep the model there, and a naive path that did would be reading
//            from RAM the device does not have.
// --check compares every output with direct inference bit for bit. --compare runs each mode in
// its own process (so each one's memory is its own), rounds interleaved, and prints ratios.
//
// One run in three parts: set-up (the image, its inputs, the executor's options from the
// command line), measure (warm-up, --learn's window, timed inferences, in the mode's own path),
// report (JSON, or the lines below). --compare is run_compare.cpp.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <thread>

#include "commands.h"
#include "inputs.h"
#include "swapnet/allocator.h"
#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

namespace {

using json = nlohmann::json;

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

// One `swapnet run` in one mode: set up by the constructor, then measured and reported.
class OneRun {
 public:
  OneRun(const std::string& path, const Common& c, const RunOptions& o);
  json measure_and_report();

 private:
  void executor_options();
  void sync() const;
  void measure(const std::function<c10::IValue()>& fwd, const std::function<std::uint64_t()>& bytes,
               const std::function<void()>& timed = nullptr, const std::function<bool()>& replanned = nullptr,
               const std::function<bool()>& decided = nullptr);
  void describe(const ExecutionPlan& p);
  void run_swapnet();
  void note_pipeline(Executor& ex, const Executor::PipelineStats& ps0, std::uint64_t disk0);
  json learning_json(const Executor::Learning& l) const;
  void run_naive();
  void run_direct();
  json report(std::uint64_t rss, std::uint64_t cache_after, double first_pass, double raw) const;
  void add_check(json* j) const;

  const std::string& path_;
  const Common& c_;
  const RunOptions& o_;
  ImageInfo info_;
  std::vector<std::string> shapes_;
  std::vector<c10::IValue> inputs_;
  ExecutorOptions eo_;
  bool cuda_ = false;
  int iters_ = 1;
  std::uint64_t cache_before_ = 0;
  // Measured by measure().
  std::vector<double> lat_;
  std::vector<c10::IValue> outs_;
  std::uint64_t read_before_ = 0, read_after_ = 0, arena_peak_ = 0, act_peak_ = 0;
  // Note [Lending the activation reserve] in zone_lender.cpp: the most of activations and the blocks
  // lent their reserve's bytes at once.
  std::uint64_t act_lent_peak_ = 0;
  // The plan's facts (describe(), or the mode's own).
  std::uint64_t pinned_ = 0, arena_bytes_ = 0, resident_bytes_ = 0;
  double predicted_ms_ = 0;
  json plan_json_, resident_json_ = json::array(), plan_facts_ = json::object();
  std::string backend_ = "-", memory_ = "host";
  // Mode swapnet's.
  double bind_us_ = 0;
  std::uint64_t streamed_ = 0, remeasured_ = 0, reserve_after_ = 0;
  json learning_;                   // --learn: Executor::learning()
  json pipeline_ = json::object();  // per timed inference (Note [Layer by layer] in read_ahead.cpp)
};

OneRun::OneRun(const std::string& path, const Common& c, const RunOptions& o) : path_(path), c_(c), o_(o) {
  install_cpu_meter();
  read_image_info(path_, &info_).throw_if_error();
  inputs_ = inputs_for(c_, info_, &shapes_);
  executor_options();
  cuda_ = eo_.device == ExecutorOptions::Device::kCUDA;
  if (cuda_) {
    if (o_.mode == "naive") throw Error("--mode naive runs on the CPU only (it is the paper's CPU baseline)");
    require_cuda(path_);  // before the inputs move, so the message is ours and not PyTorch's
    inputs_to_cuda(&inputs_);
  }
  iters_ = std::max(1, o_.iters);
}

// The executor's options from the command line, refused where they do not go together.
void OneRun::executor_options() {
  eo_.budget = o_.budget.empty() ? 0 : parse_size(o_.budget);
  eo_.blocks = o_.blocks;
  for (const auto& p : split(o_.partition, ',')) eo_.partition.push_back(std::stoi(p));
  for (const auto& r : split(o_.resident, ',')) eo_.resident.push_back(std::stoi(r));
  set_executor_option(&eo_, "--plan", o_.plan);
  // The device profile plans (auto, optimal) and predicts (every plan) swapped runs.
  if (o_.mode != "direct" && !o_.budget.empty()) use_profile(device_profile(path_, c_, o_.profile), &eo_);
  if (!eo_.resident.empty() && eo_.partition.empty() && eo_.blocks == 0) {
    throw Error("--resident needs --partition or --blocks (the blocks it numbers)");
  }
  set_executor_option(&eo_, "--read-ahead", o_.read_ahead);
  set_executor_option(&eo_, "--verify", o_.verify);
  eo_.learn_after = o_.learn;
  if (o_.learn > 0 && o_.mode != "swapnet") throw Error("--learn is swapnet's: mode swapnet only");
  if (!o_.learn_store.empty() && o_.learn == 0) throw Error("--learn-store " + o_.learn_store + " needs --learn N (N in 3..1000)");
  eo_.learn_store = o_.learn_store;
  if (o_.mode != "direct" && o_.budget.empty()) throw Error("--budget is required for mode " + o_.mode);
  if (o_.mode == "direct") eo_.budget = UINT64_MAX / 4;
  set_executor_option(&eo_, "--device", o_.device);
}

// GPU work is asynchronous: a timed forward ends when the GPU is done with it.
void OneRun::sync() const {
  if (!cuda_) return;
  const auto* g = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  g->synchronizeStream(g->getStream(at::Device(at::kCUDA, 0)));
}

void OneRun::measure(const std::function<c10::IValue()>& fwd, const std::function<std::uint64_t()>& bytes,
                     const std::function<void()>& timed, const std::function<bool()>& replanned,
                     const std::function<bool()>& decided) {
  fwd();  // warm-up (lazy initialisation), not timed
  // --learn N: the first window, not timed either: N inferences and 1 s at least (Note [Noise
  // in the window]), until it is decided (at most 60 s: a window too noisy to tell grows).
  const auto window_until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 1; i < o_.learn || (o_.learn > 0 && decided && !decided() && std::chrono::steady_clock::now() < window_until);
       ++i) {
    fwd();
  }
  // A plan learned in the warm-up reads its resident blocks (and a block's kept part) once, in
  // its first inference: that one is not timed either.
  if (replanned && replanned()) fwd();
  if (timed) timed();
  reset_memory_peak();
  read_before_ = bytes();
  for (int i = 0; i < iters_; ++i) {
    // Per inference: outputs kept from earlier iterations (for --check) are not its memory.
    reset_cpu_meter_peak();
    const std::uint64_t base = cpu_meter().current;
    auto t0 = Clock::now();
    c10::IValue out = fwd();
    sync();
    lat_.push_back(ms_since(t0));
    const CpuMeterStats after = cpu_meter();
    act_peak_ = std::max(act_peak_, after.peak - base);
    act_lent_peak_ = std::max(act_lent_peak_, after.peak_with_lent - base);
    if (o_.check && outs_.size() < 3) outs_.push_back(out);
  }
  read_after_ = bytes();
  arena_peak_ = memory_stats().peak;
}

// The plan's facts in the JSON: at open, and again after --learn's warm-up re-planned.
void OneRun::describe(const ExecutionPlan& p) {
  pinned_ = p.pinned_bytes;
  arena_bytes_ = p.arena_bytes;
  resident_bytes_ = p.resident_bytes;
  predicted_ms_ = p.predicted_ms;
  plan_json_ = json::array();
  resident_json_ = json::array();
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    plan_json_.push_back({p.blocks[b].first, p.blocks[b].second});
    resident_json_.push_back(static_cast<int>(p.resident[b]));
  }
  plan_facts_["read_ahead"] = to_string(p.read_ahead);
  plan_facts_["pair_bytes"] = p.pair_bytes;
  plan_facts_["plan_read_bytes"] = p.read_bytes;
  plan_facts_["retained_bytes"] = p.retained_bytes;
}

void OneRun::run_swapnet() {
  if (!o_.trace.empty()) trace_start();  // before open: the executor takes a group in the trace
  auto ex = Executor::open(path_, eo_);
  describe(ex->plan());
  plan_facts_["min_read_bytes"] = min_read_bytes(info_, eo_);
  backend_ = to_string(ex->backend());
  memory_ = to_string(ex->memory());
  Executor::PipelineStats ps0;
  std::uint64_t disk0 = 0;
  measure([&] { return ex->forward(clone_inputs(inputs_)); }, [&] { return ex->bytes_used(); },
          [&] {
            ps0 = ex->pipeline_stats();
            disk0 = ex->bytes_read();
            if (!o_.trace.empty()) trace_start();  // the timed inferences only
          },
          [&] { return ex->learning().adopted > 0; }, [&] { return ex->learning().windows > 0; });
  if (!o_.trace.empty()) trace_write(o_.trace).throw_if_error();
  note_pipeline(*ex, ps0, disk0);
  bind_us_ = ex->bind_us_per_tensor();
  streamed_ = ex->streamed_blocks();
  remeasured_ = ex->remeasured();
  reserve_after_ = ex->plan().activation_bytes;
  if (o_.learn > 0) {
    learning_ = learning_json(ex->learning());
    describe(ex->plan());  // what the timed inferences ran: the plan in force at the end
  }
}

// The pipeline over the timed inferences, from `ps0` and `disk0` before them.
void OneRun::note_pipeline(Executor& ex, const Executor::PipelineStats& ps0, std::uint64_t disk0) {
  const Executor::PipelineStats ps1 = ex.pipeline_stats();
  // How long the disk had a read of ours during the timed inferences: near all of their time
  // means the disk never idled (the pipeline is at the I/O bound whatever the raw rate read
  // later says); the bytes over that time are the rate the disk gave while it worked for us.
  double timed_ms = 0;
  for (double v : lat_) timed_ms += v;
  const double busy_ms = ps1.disk_busy_ms - ps0.disk_busy_ms;
  const double read_bytes = static_cast<double>(ex.bytes_read() - disk0);
  const int iters = iters_;
  pipeline_ = {{"read_wait_ms", (ps1.read_wait_ms - ps0.read_wait_ms) / iters},
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
}

// --learn: what was learned, with the plan at open (before describe() is called again).
json OneRun::learning_json(const Executor::Learning& l) const {
  return {{"learn_after", o_.learn},
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
          {"predicted_at_open_ms", predicted_ms_},
          {"loaded_times", l.loaded_times},
          {"loaded_rate", l.loaded_rate},
          {"stored", l.stored},
          {"num_blocks_at_open", plan_json_.size()}};
}

void OneRun::run_naive() {
  // Note [An honest naive path]; --blocks / --partition are ignored: naive's blocks must
  // hold twice.
  std::uint64_t naive_read = 0;
  ExecutionPlan p = naive_plan(info_, eo_, path_);
  Skeleton sk = Skeleton::from_image(info_, path_);
  for (const auto& b : p.blocks) plan_json_.push_back({b.first, b.second});
  backend_ = "buffered_copy";
  measure([&] { return naive_forward(sk, path_, info_, p, clone_inputs(inputs_), &naive_read); },
          [&] { return naive_read; });
  // The read buffer is not libtorch's (the meter counts the copies and activations).
  arena_peak_ = arena_bytes_ = largest_block(p);
}

void OneRun::run_direct() {
  InMemory direct(path_, info_, cuda_);
  plan_json_.push_back({0, static_cast<int>(info_.layers.size()) - 1});
  arena_bytes_ = info_.data_size;
  direct.sk.forward(clone_inputs(inputs_));  // warm-up before the background reads start
  BackgroundReader background(path_, info_.data_offset, info_.data_offset + info_.data_size, o_.background_mb_s);
  measure([&] { return direct.sk.forward(clone_inputs(inputs_)); }, [] { return std::uint64_t{0}; });
  arena_peak_ = info_.data_size;  // all weights resident
}

json OneRun::measure_and_report() {
  drop_page_cache(path_);
  page_cache_bytes(path_, &cache_before_).throw_if_error();
  if (!o_.trace.empty() && o_.mode != "swapnet") throw Error("--trace records swapnet's pipeline: mode swapnet only");
  if (o_.mode == "swapnet") {
    run_swapnet();
  } else if (o_.mode == "naive") {
    run_naive();
  } else if (o_.mode == "direct") {
    run_direct();
  } else {
    throw Error("--mode '" + o_.mode + "' is not one of swapnet|direct|naive");
  }
  const std::uint64_t rss = vm_hwm_bytes();
  std::uint64_t cache_after = 0;
  page_cache_bytes(path_, &cache_after).throw_if_error();
  // The raw rate last, so that its reads do not delay the timed ones (a throttled disk makes a
  // burst pay later): one pass, then passes back to back for a second, what a disk kept busy
  // delivers: the rate an I/O-bound pipeline can reach (and a real disk's, which has no burst
  // credit after idle).
  const double first_pass = raw_read_mb_s(path_, info_.data_offset, info_.data_offset + info_.data_size);
  const double raw = raw_read_mb_s(path_, info_.data_offset, info_.data_offset + info_.data_size, 1.0);
  json j = report(rss, cache_after, first_pass, raw);
  if (o_.check) add_check(&j);
  return j;
}

json OneRun::report(std::uint64_t rss, std::uint64_t cache_after, double first_pass, double raw) const {
  json j;
  j["image"] = path_;
  j["mode"] = o_.mode;
  j["budget_bytes"] = o_.mode == "direct" ? json(nullptr) : json(eo_.budget);
  j["blocks"] = plan_json_;
  j["num_blocks"] = plan_json_.size();
  j["input_shapes"] = shapes_;
  j["iters"] = iters_;
  j["threads"] = at::get_num_threads();
  // Set by the `swapnet` command unless the user did (Note [OpenBLAS's idle spin] in launcher.cpp).
  const char* blas_timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  j["openblas_thread_timeout"] = blas_timeout ? json(blas_timeout) : json(nullptr);
  j["latency_ms"] = {{"median", percentile(lat_, 0.5)}, {"p90", percentile(lat_, 0.9)}, {"all", lat_}};
  // Blocks lent the activation reserve's bytes are counted with the activations they were lent by
  // (the arena's peak counts the ring's own bytes).
  j["peak_model_bytes"] = arena_peak_ + std::max(act_peak_, act_lent_peak_) + pinned_;
  j["activation_and_lent_peak_bytes"] = act_lent_peak_;
  j["arena_bytes"] = arena_bytes_;
  j["resident_bytes"] = resident_bytes_;
  j["resident_blocks"] = resident_json_;
  j["activation_peak_bytes"] = act_peak_;
  j["pinned_bytes"] = pinned_;
  j["peak_rss_bytes"] = rss;
  j["page_cache_growth_bytes"] = static_cast<std::int64_t>(cache_after) - static_cast<std::int64_t>(cache_before_);
  const double per_inf = static_cast<double>(read_after_ - read_before_) / iters_;
  j["bytes_read_per_inference"] = per_inf;
  j["raw_io_mb_s"] = raw;
  j["raw_first_pass_mb_s"] = first_pass;
  j["io_bound_ms"] = per_inf / (raw * 1e3);
  j["backend"] = backend_;
  j["memory"] = memory_;
  j["device"] = o_.device;
  j["verify"] = o_.verify;
  j["plan"] = o_.plan;
  if (predicted_ms_ > 0) j["predicted_ms"] = predicted_ms_;
  j.update(plan_facts_);
  if (o_.mode == "swapnet") {
    j["bind_us_per_tensor"] = bind_us_;
    j["streamed_blocks"] = streamed_;  // read into ring space older blocks still held, warm-up included
    // Per timed inference: the executing thread waiting for reads, layers run while the rest of
    // their block was read, ring bytes given back before their block ended.
    j["pipeline"] = pipeline_;
    // Inputs no profile in the image covered, measured in the warm-up (Note [Dynamic shapes]),
    // and the activation reserve the timed inferences planned with.
    j["remeasured_inputs"] = remeasured_;
    j["activation_reserve_bytes"] = reserve_after_;
    if (!learning_.is_null()) j["learning"] = learning_;
  }
  return j;
}

// --check: the kept outputs against direct inference's, bit for bit.
void OneRun::add_check(json* j) const {
  // The reference is built after the measurements, so its memory is not in peak_rss_bytes.
  InMemory direct(path_, info_, cuda_);
  c10::IValue ref = direct.sk.forward(clone_inputs(inputs_));
  bool equal = true;
  std::string diff;
  for (const auto& out : outs_) {
    Comparison cmp = compare_outputs(ref, out);
    if (!cmp.equal && equal) diff = cmp.difference;
    equal = equal && cmp.equal;
  }
  (*j)["equal"] = equal;
  if (!equal) (*j)["difference"] = diff;
}

void print_one(const std::string& path, const RunOptions& o, const json& j) {
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

}  // namespace

int run(const std::string& path, const Common& c, const RunOptions& o) {
  apply_common(c);
  if (o.compare) return run_compare(path, c, o);  // run_compare.cpp
  json j = OneRun(path, c, o).measure_and_report();
  if (c.json) {
    std::cout << j.dump() << "\n";
  } else {
    print_one(path, o, j);
  }
  return j.contains("equal") && !j["equal"].get<bool>() ? 1 : 0;
}

}  // namespace cli
}  // namespace swapnet
