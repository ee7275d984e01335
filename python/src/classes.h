// Inside libswapnet_torch.so: the Executor custom class, shared by the Python classes
// (torch_classes.cpp) and transparent swapping (transparent.cpp). Not installed.
#pragma once

#include <torch/custom_class.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace swapnet {

using json = nlohmann::json;

// Python's executors (swapnet.Executor, transparent swapping) learn their costs every 3
// inferences unless told otherwise (Note [Learning the costs in service] in cost_learner.cpp): a
// program there runs with whatever profile this machine has, or none.
inline constexpr int kPythonLearnAfter = 3;
// Transparent swapping's: $SWAPNET_LEARN (0..1000), else kPythonLearnAfter; a value that is not
// such a number is said once (and kPythonLearnAfter used: the program's model still runs).
int learn_from_env();
// Where transparent swapping keeps what an image's executor learned (Note [Learned costs kept]
// in cost_learner.cpp): nowhere by default; beside the image (IMAGE.learned.json) with
// $SWAPNET_LEARN_STORE=beside. Off by default: under the blkio throttle a kept read rate was
// learned in the throttle's burst, and the next process ran 1.04x longer (bench/learn_store.py).
// SWAPNET_LEARN_STORE=beside: IMAGE.learned.json on the CPU, IMAGE.DEVICE.learned.json elsewhere.
std::string learn_store_for(const std::string& image, const std::string& device);

// The options python/swapnet passes as JSON (plan, read_ahead, verify, device, profile, learn,
// learn_store),
// with the device profile of this machine when there is one (said once when there is none).
// `learn`: ExecutorOptions::learn_after when the options do not say ("learn": N).
ExecutorOptions executor_options(const std::string& image, std::int64_t budget, const std::string& options_json,
                                 int learn = kPythonLearnAfter);
json plan_json(const ExecutionPlan& p);

inline std::vector<c10::IValue> to_inputs(const c10::List<c10::IValue>& list) {
  std::vector<c10::IValue> v;
  v.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) v.push_back(list.get(i));
  return v;
}

// Inputs' shapes as text, `sep` between inputs ("1,3,224,224 1,10"); a non-tensor by its kind.
inline std::string shape_text(const std::vector<c10::IValue>& inputs, char sep = ' ') {
  std::string out;
  for (const auto& v : inputs) {
    if (!out.empty()) out += sep;
    if (!v.isTensor()) {
      out += v.tagKind();
      continue;
    }
    const auto sizes = v.toTensor().sizes();
    for (size_t d = 0; d < sizes.size(); ++d) out += (d ? "," : "") + std::to_string(sizes[d]);
  }
  return out;
}

// Runs `f`, turning any exception into std::runtime_error (what torch passes to Python).
template <typename F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    throw std::runtime_error(e.what());
  }
}

// Where forward's tensors are (in lists, tuples and dicts too), for transparent swapping's
// executors, which follow them (Note [Transparent swapping on the GPU] in transparent.cpp):
// kNone (no tensor), kCPU, kCUDA (the first CUDA device), kMixed (some on each), or kElsewhere
// (another device: *where names it).
enum class InputsOn { kNone, kCPU, kCUDA, kMixed, kElsewhere };
InputsOn inputs_on(const std::vector<c10::IValue>& inputs, std::string* where);

// torch.classes.swapnet.Executor
struct ExecutorHolder : torch::CustomClassHolder {
  std::string image;
  std::unique_ptr<Executor> ex;
  std::mutex mu;  // one inference at a time (Executor's contract), whatever Python threads do
  int account = 0;                   // CPU meter account of its inferences' activations
  std::uint64_t activation_peak = 0;  // most activation bytes one inference allocated (and lent blocks)
  std::uint64_t inferences = 0;  // run swapped
  std::uint64_t unswapped = 0;   // run through `fallback` (loaded normally)

  // Transparent swapping of a model with no image yet (transparent.cpp): the first forward
  // calls `open` with its inputs (it makes the image and says the budget), then runs swapped;
  // if `open` throws, the model runs through `fallback` (loaded normally) from then on.
  using Open = std::function<std::string(const std::vector<c10::IValue>& inputs, std::uint64_t* budget)>;
  using Fallback = std::function<c10::IValue(std::vector<c10::IValue> inputs)>;
  Open lazy_open;
  Fallback fallback;
  std::function<void(ExecutorHolder*)> on_open;  // once swapped
  // Transparent swapping: the executor runs where forward's inputs are, and a model whose
  // inputs are where it cannot run goes to `fallback` (Note [Transparent swapping on the GPU]).
  bool follows_inputs = false;
  // `options`: as for the other constructor, "device" included (the lazily made image's
  // learn_store is added when it is made).
  ExecutorHolder(Open open, Fallback fb, std::string options)
      : lazy_open(std::move(open)), fallback(std::move(fb)), options_(std::move(options)) {}

  ExecutorHolder(const std::string& path, std::int64_t budget, const std::string& options)
      : image(path), options_(options) {
    guarded([&] {
      if (budget < 0) throw Error(path + ": budget " + std::to_string(budget) + " is negative");
      open_executor(static_cast<std::uint64_t>(budget));
      return 0;
    });
  }
  c10::IValue forward(const c10::List<c10::IValue>& inputs) {
    c10::IValue out = guarded([&] {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<c10::IValue> in = to_inputs(inputs);
      if (lazy_open) open_lazily(in);
      if (ex && follows_inputs) follow(in);
      if (!ex) {
        // Loaded normally from now on (lazy_open was taken above): no budget to share.
        loaded_normally_.store(true);
        c10::IValue r = fallback(std::move(in));
        ++unswapped;
        return r;
      }
      apply_pending();
      // Activations are charged to this executor's account while it runs (as the Runtime does),
      // so that stats can say the most it held: weights at their peak + activations at theirs.
      const int previous = set_thread_cpu_account(account);
      reset_cpu_account_peak(account);
      const std::uint64_t base = cpu_account(account).current;
      try {
        // Block by block: a budget asked for meanwhile (request_budget) is taken between two
        // blocks, as the Runtime moves its models.
        ex->begin(std::move(in));
        while (!ex->step()) apply_pending();
        c10::IValue r = ex->finish();
        set_thread_cpu_account(previous);
        // Activations, and blocks lent their reserve's bytes (Note [Lending the activation
        // reserve] in zone_lender.cpp), at once.
        activation_peak = std::max<std::uint64_t>(activation_peak, cpu_account(account).peak_with_lent - base);
        ++inferences;
        apply_pending();
        return r;
      } catch (...) {
        set_thread_cpu_account(previous);
        throw;
      }
    });
    settle();
    return out;
  }

  // From any thread: a new budget, in effect at once when no inference runs, else at the next
  // block boundary (a cut sheds at once what the running layer does not read: Executor::shed).
  void request_budget(std::uint64_t bytes) {
    pending.store(static_cast<std::int64_t>(bytes));
    if (mu.try_lock()) {
      apply_pending();
      mu.unlock();
      return;
    }
    {
      std::lock_guard<std::mutex> swap(swap_mu);  // an inference may be moving the executor (follow)
      if (ex) {
        if (bytes < budget_now.load()) ex->shed(bytes);
        ex->interrupt();
      }
    }
    settle();
  }
  std::uint64_t budget() const { return budget_now.load(); }
  // The model runs as loaded normally (its image or executor could not be opened, or its inputs
  // went where it cannot run swapped): a budget changes nothing of its memory.
  bool loaded_normally() const { return loaded_normally_.load(); }

 private:
  void open_lazily(const std::vector<c10::IValue>& inputs) {
    Open open = std::move(lazy_open);
    lazy_open = nullptr;
    try {
      std::uint64_t budget = 0;
      image = open(inputs, &budget);
      json o = options_json();
      o["learn_store"] = learn_store_for(image, o.value("device", std::string("cpu")));
      options_ = o.dump();
      open_executor(budget);
      if (on_open) on_open(this);
    } catch (const std::exception& e) {
      close_executor();
      log(LogLevel::kWarn, std::string(e.what()) + "; running the model as loaded normally");
    }
  }
  // With `mu` held, or from a constructor: the executor on `image` within `budget`.
  void open_executor(std::uint64_t budget) {
    install_cpu_meter();
    if (account == 0) account = new_cpu_account();
    std::unique_ptr<Executor> fresh =
        Executor::open(image, executor_options(image, static_cast<std::int64_t>(budget), options_));
    std::lock_guard<std::mutex> swap(swap_mu);
    ex = std::move(fresh);
    budget_now.store(budget);
    device_ = options_json().value("device", std::string("cpu"));
  }
  // With `mu` held: no executor from now on. Destroyed outside swap_mu (its reads drain), so that
  // request_budget is not held up meanwhile.
  void close_executor() {
    std::unique_ptr<Executor> gone;
    std::lock_guard<std::mutex> swap(swap_mu);
    gone.swap(ex);
  }
  json options_json() const { return json::parse(options_.empty() ? "{}" : options_); }
  // With `mu` held, the executor open: moves it where forward's inputs are (Note [Transparent
  // swapping on the GPU] in transparent.cpp): to the CPU or the first CUDA device; inputs
  // anywhere else, or a device it cannot open on, send the model to `fallback` from then on.
  void follow(const std::vector<c10::IValue>& inputs) {
    std::string where;
    const InputsOn on = inputs_on(inputs, &where);
    if (on == InputsOn::kNone || on == InputsOn::kMixed) return;
    const std::string want = on == InputsOn::kCPU ? "cpu" : on == InputsOn::kCUDA ? "cuda" : "";
    if (want == device_) return;
    std::string why = "swapnet runs a model on the CPU or the first CUDA device";
    close_executor();  // the old executor goes first: two at once would hold twice the budget
    // A budget asked for meanwhile is the one the new executor opens within.
    if (const std::int64_t p = pending.exchange(-1); p >= 0) budget_now.store(static_cast<std::uint64_t>(p));
    activation_peak = 0;  // measured again where it runs now
    if (!want.empty()) {
      json o = options_json();
      o["device"] = want;
      o["learn_store"] = learn_store_for(image, want);
      const std::string before = options_;
      options_ = o.dump();
      try {
        open_executor(budget_now.load());
        log(LogLevel::kInfo, image + ": forward's inputs are on " + where + ": the model runs swapped there now");
        return;
      } catch (const std::exception& e) {
        why = e.what();
        options_ = before;
      }
    }
    log(LogLevel::kWarn, image + ": forward's inputs are on " + where + ", where it cannot run swapped (" + why +
                             "): running the model as loaded normally from now on");
  }
  std::atomic<std::int64_t> pending{-1};
  std::atomic<std::uint64_t> budget_now{0};
  std::atomic<bool> loaded_normally_{false};
  std::string options_;  // the executor's options (JSON), "device" included
  std::string device_ = "cpu";  // the open executor's
  // Held while `ex` is replaced, and by request_budget, which reaches the executor without `mu`.
  std::mutex swap_mu;
  // With `mu` held: adopts a requested budget (a refused one keeps the plan in force, said).
  void apply_pending() {
    const std::int64_t p = pending.exchange(-1);
    if (p < 0) return;
    if (!ex) {  // the model runs as loaded normally (follow)
      budget_now.store(static_cast<std::uint64_t>(p));
      return;
    }
    try {
      ex->set_budget(static_cast<std::uint64_t>(p));
      budget_now.store(static_cast<std::uint64_t>(p));
    } catch (const std::exception& e) {
      log(LogLevel::kWarn, std::string(e.what()) + "; keeping " + format_bytes(budget_now.load()));
    }
  }
  // A request that came while an inference was ending (after its last check, before `mu` was
  // free): taken now if nobody else runs.
  void settle() {
    if (pending.load() >= 0 && mu.try_lock()) {
      apply_pending();
      mu.unlock();
    }
  }

 public:
  void set_budget(std::int64_t bytes) {
    guarded([&] {
      if (bytes < 0) throw Error(image + ": budget " + std::to_string(bytes) + " is negative");
      std::lock_guard<std::mutex> lock(mu);
      if (!ex) throw Error(image + ": the model is not running swapped (not opened yet, or loaded normally)");
      ex->set_budget(static_cast<std::uint64_t>(bytes));
      budget_now.store(static_cast<std::uint64_t>(bytes));
      return 0;
    });
  }
  std::string plan() {
    std::lock_guard<std::mutex> lock(mu);
    if (!ex) return json{{"blocks", json::array()}, {"resident", json::array()}}.dump();
    json j = plan_json(ex->plan());
    j["budget"] = ex->plan().total() > 0 ? json(ex->plan().total()) : json(nullptr);
    return j.dump();
  }
  // What the transparent models report (status, stats lines); 0s before the executor opens.
  struct Summary {
    std::uint64_t bytes_read = 0, peak_model_bytes = 0, inferences = 0, unswapped = 0;
    std::size_t blocks = 0, resident_blocks = 0;
    std::string device = "none";  // where it runs swapped: cpu, cuda, or none (not open, or loaded normally)
  };
  Summary summary() {
    std::lock_guard<std::mutex> lock(mu);
    Summary r;
    r.inferences = inferences;
    r.unswapped = unswapped;
    if (!ex) return r;
    r.device = device_;
    r.bytes_read = ex->bytes_read();
    r.peak_model_bytes = ex->weight_memory().peak + activation_peak;
    r.blocks = ex->plan().blocks.size();
    for (char c : ex->plan().resident) r.resident_blocks += c != 0;
    return r;
  }
  std::string stats() {
    std::lock_guard<std::mutex> lock(mu);
    if (!ex) return json{{"image", nullptr}, {"inferences", inferences}, {"unswapped_inferences", unswapped}}.dump();
    const WeightMemory w = ex->weight_memory();
    const Executor::PipelineStats ps = ex->pipeline_stats();
    const Executor::Learning learning = ex->learning();
    return json{{"image", image},
                {"unswapped_inferences", unswapped},
                // Note [Layer by layer] in read_ahead.cpp, since open: waiting for reads, layers
                // run while the rest of their block landed, ring bytes given back early.
                {"read_wait_ms", ps.read_wait_ms},
                {"layers_started_early", ps.layers_started_early},
                {"released_early_bytes", ps.released_early_bytes},
                // Note [Lending the activation reserve]: the zone, the most of it lent to blocks
                // at once, the most in use at once, activations that found no room.
                {"zone_bytes", ps.zone_bytes},
                {"lent_peak_bytes", ps.lent_peak_bytes},
                {"zone_peak_bytes", ps.zone_peak_bytes},
                {"zone_misses", ps.zone_misses},
                {"bytes_read", ex->bytes_read()},
                {"bytes_used", ex->bytes_used()},
                {"weights_held", w.held},
                {"weights_peak", w.peak},
                {"weights_resident_pages", w.resident_pages},
                {"bind_us_per_tensor", ex->bind_us_per_tensor()},
                {"activation_peak", activation_peak},
                {"peak_model_bytes", w.peak + activation_peak},
                {"inferences", inferences},
                {"data_bytes", ex->info().data_size},
                {"activation_bytes", ex->info().activation_bytes},
                // Note [Learning the costs in service]: re-plans for costs measured, the last
                // window's plan error and read rate.
                {"learn_windows", learning.windows},
                {"learn_replans", learning.replans},
                {"learn_kept_plans", learning.kept_plans},
                {"learn_plan_error", learning.plan_error},
                {"learn_noise", learning.noise},
                {"learn_read_mb_s", learning.read_mb_s},
                {"learn_loaded", learning.loaded_times || learning.loaded_rate},
                {"learn_stored", learning.stored},
                {"predicted_ms", ex->plan().predicted_ms}}
        .dump();
  }
};

}  // namespace swapnet
