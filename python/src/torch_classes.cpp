// libswapnet_torch.so: swapnet for Python (the `swapnet` package in python/swapnet), as
// TorchScript custom classes and one operator registered with libtorch's dispatcher. No Python
// C API: Debian's python3-torch loads it with torch.ops.load_library, and the same classes can
// be called from TorchScript and from C++ through torch::jit.
//
//   torch.ops.swapnet.pack(model, image, inputs) -> str            (JSON: what was written)
//   torch.ops.swapnet.image_info(image) -> str                      (JSON: sizes, minimum budget)
//   torch.classes.swapnet.Executor(image, budget, options_json)
//       .forward(inputs) -> Any    .set_budget(bytes)    .plan_json() -> str    .stats_json() -> str
//   torch.classes.swapnet.Runtime(models_json, total_budget, policy)
//       .forward(model, inputs) -> Any    .set_budget(bytes)    .status_json() -> str
//
// Errors are thrown as std::runtime_error with swapnet's message (file, value, limit); torch
// turns them into RuntimeError and python/swapnet raises swapnet.Error from them.
#include <torch/custom_class.h>
#include <torch/library.h>
#include <ATen/Parallel.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "swapnet/assembly.h"
#include "swapnet/partitioner.h"
#include "swapnet/scheduler.h"
#include "swapnet/swapcore.h"
#include "classes.h"

namespace swapnet {
namespace {

std::string pack(const std::string& model, const std::string& image, const c10::List<c10::IValue>& list) {
  return guarded([&] {
    auto inputs = to_inputs(list);
    Skeleton sk = load_for_pack(model, inputs, pack_skeleton_options());  // as swapnet pack
    try {
      sk.profile(inputs, ProfileOptions{1, 3});
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (inputs " + shape_text(inputs) + ")");
    }
    PackOptions po;
    po.input_shapes = shape_text(inputs);
    po.activation_bytes = measure_activation_bytes(sk, inputs, &po.layer_peak_bytes);
    po.input_profiles.push_back(InputProfile{po.activation_bytes, describe_inputs(inputs)});
    sk.pack(image, po);
    ImageInfo info;
    read_image_info(image, &info).throw_if_error();
    return json{{"model", model},
                {"image", image},
                {"layers", info.layers.size()},
                {"tensors", info.tensors.size()},
                {"data_bytes", info.data_size},
                {"file_bytes", info.file_size},
                {"activation_bytes", info.activation_bytes}}
        .dump();
  });
}

// What an image holds, before opening it (percentage budgets, minimums).
std::string image_info(const std::string& image) {
  return guarded([&] {
    ImageInfo info;
    read_image_info(image, &info).throw_if_error();
    return json{{"image", image},
                {"layers", info.layers.size()},
                {"tensors", info.tensors.size()},
                {"data_bytes", info.data_size},
                {"file_bytes", info.file_size},
                {"activation_bytes", info.activation_bytes},
                {"full_bytes", info.data_size + info.activation_bytes},
                {"min_budget", min_budget(info)},
                {"input_shapes", info.input_shapes}}
        .dump();
  });
}

}  // namespace

// The options python/swapnet passes as JSON: plan, read_ahead, verify, device, profile, learn,
// learn_store.
ExecutorOptions executor_options(const std::string& image, std::int64_t budget, const std::string& text, int learn) {
  if (budget < 0) throw Error(image + ": budget " + std::to_string(budget) + " is negative");
  const json o = text.empty() ? json::object() : json::parse(text);
  ExecutorOptions eo;
  eo.budget = static_cast<std::uint64_t>(budget);
  try {
    for (const char* key : {"plan", "read_ahead", "verify", "device"}) {
      if (o.contains(key)) set_executor_option(&eo, key, o[key].get<std::string>());
    }
  } catch (const Error& e) {
    throw Error(image + ": " + e.what());
  }
  eo.learn_after = learn;
  if (o.contains("learn")) {
    const auto& v = o["learn"];
    if (!v.is_number_integer() || !learn_after_valid(v.get<std::int64_t>())) {
      throw Error(image + ": learn " + v.dump() + " is not 0 (never) or a number of inferences in 3..1000");
    }
    eo.learn_after = o["learn"].get<int>();
  }
  if (o.contains("learn_store")) {
    if (!o["learn_store"].is_string()) throw Error(image + ": learn_store " + o["learn_store"].dump() + " is not a path");
    eo.learn_store = o["learn_store"].get<std::string>();
  }
  // The device profile plans the blocks when there is one for this machine; else the default
  // cost model (said once: `swapnet profile IMAGE` measures one).
  const std::string path = o.value("profile", std::string());
  const std::string where = path.empty() ? default_profile_path() : path;
  DeviceProfile p;
  Status s = load_profile(where, &p);
  if (s.ok() && profile_mismatch(p, at::get_num_threads()).empty()) {
    eo.cost = p.cost;
    eo.measured_exec = p.exec_source == "measured";
    eo.gamma_ms_per_flop = p.gamma_ms_per_flop;
  } else if (!path.empty()) {
    throw Error(s.ok() ? where + ": " + profile_mismatch(p, at::get_num_threads()) : s.message());
  } else {
    log_once(LogLevel::kWarn, "python_no_profile",
             "no device profile for this machine at " + where +
                 "; planning with the default cost model (`swapnet profile IMAGE` measures one)");
  }
  return eo;
}

std::string learn_store_for(const std::string& image, const std::string& device) {
  const char* v = std::getenv("SWAPNET_LEARN_STORE");
  const std::string s = v ? v : "";
  // One file per device: a GPU's layer times are not the CPU's (Note [Learned costs kept]), and a
  // model that moves between the two would otherwise overwrite one with the other each time.
  if (s == "beside") return image + (device == "cpu" || device.empty() ? "" : "." + device) + ".learned.json";
  if (!s.empty() && s != "off") {
    log_once(LogLevel::kWarn, "swapnet_learn_store_env",
             "SWAPNET_LEARN_STORE='" + s + "' is not beside or off: learned costs are not kept");
  }
  return "";
}

int learn_from_env() {
  const char* v = std::getenv("SWAPNET_LEARN");
  if (v == nullptr || *v == '\0') return kPythonLearnAfter;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || !learn_after_valid(n)) {
    log_once(LogLevel::kWarn, "swapnet_learn_env",
             std::string("SWAPNET_LEARN='") + v + "' is not 0 (never) or a number of inferences in 3..1000: learning every " +
                 std::to_string(kPythonLearnAfter));
    return kPythonLearnAfter;
  }
  return static_cast<int>(n);
}

json plan_json(const ExecutionPlan& p) {
  return {{"blocks", p.blocks},
          {"resident", p.resident},
          {"block_bytes", p.block_bytes},
          {"arena_bytes", p.arena_bytes},
          {"resident_bytes", p.resident_bytes},
          {"activation_bytes", p.activation_bytes},
          {"pinned_bytes", p.pinned_bytes},
          {"read_bytes", p.read_bytes},
          {"min_budget", p.min_budget},
          {"total_bytes", p.total()},
          {"predicted_ms", p.predicted_ms},
          {"read_ahead", p.read_ahead == ReadAhead::kPaper       ? "paper"
                         : p.read_ahead == ReadAhead::kTwoEnded ? "two-ended"
                                                                 : "ring"}};
}

namespace {

struct RuntimeHolder : torch::CustomClassHolder {
  std::unique_ptr<Runtime> rt;

  // models: [{"name", "image", "urgency", "threads", "options": {...executor options}}]
  RuntimeHolder(const std::string& models, std::int64_t total, const std::string& policy) {
    guarded([&] {
      install_cpu_meter();
      if (total < 0) throw Error("Runtime: total budget " + std::to_string(total) + " is negative");
      std::vector<RuntimeModel> list;
      for (const auto& m : json::parse(models)) {
        RuntimeModel r;
        r.name = m.at("name").get<std::string>();
        r.image = m.at("image").get<std::string>();
        r.urgency = m.value("urgency", 1.0);
        r.threads = m.value("threads", 0);
        // A Runtime's models learn only when asked ("options": {"learn": N, "learn_store": PATH}):
        // several models learning on two cores re-plan in turn (each grid rebuild slows the
        // others' inferences), Note [Splitting with learned costs] in runtime.cpp.
        r.options = executor_options(r.image, 0, m.contains("options") ? m["options"].dump() : "", 0);
        list.push_back(std::move(r));
      }
      RuntimeOptions ro;
      ro.policy = policy;
      rt = Runtime::open(std::move(list), static_cast<std::uint64_t>(total), ro);
      return 0;
    });
  }
  c10::IValue forward(const std::string& model, const c10::List<c10::IValue>& inputs) {
    return guarded([&] {
      const int i = rt->index(model);
      if (i < 0) throw Error("Runtime: no model named '" + model + "'");
      return rt->submit(i, to_inputs(inputs)).get();
    });
  }
  void set_budget(std::int64_t total) {
    guarded([&] {
      if (total < 0) throw Error("Runtime: total budget " + std::to_string(total) + " is negative");
      rt->set_budget(static_cast<std::uint64_t>(total));
      return 0;
    });
  }
  bool wait_adapted(std::int64_t ms) { return rt->wait_adapted(std::chrono::milliseconds(ms)); }
  std::string status() {
    json models = json::array();
    for (const ModelStatus& s : rt->status()) {
      models.push_back({{"name", s.name},
                        {"budget", s.budget},
                        {"paused", s.paused},
                        {"paused_reason", s.paused_reason},
                        {"blocks", s.blocks},
                        {"threads", s.threads},
                        {"resident_blocks", s.resident_blocks},
                        {"predicted_ms", s.predicted_ms},
                        {"min_bytes", s.min_bytes},
                        {"full_bytes", s.full_bytes},
                        {"peak_model_bytes", s.peak_model_bytes},
                        {"over_budget", s.over_budget},
                        {"requests", s.requests},
                        {"rejected", s.rejected},
                        {"failed", s.failed},
                        {"budget_changes", s.budget_changes}});
    }
    json adaptations = json::array();
    for (const Adaptation& a : rt->adaptations()) {
      adaptations.push_back({{"at_s", a.at_s},
                             {"budget_bytes", a.budget_bytes},
                             {"budgets", a.budgets},
                             {"took_ms", a.took_ms},
                             {"plans_ms", a.plans_ms},
                             {"note", a.note}});
    }
    return json{{"total_budget", rt->total_budget()}, {"models", models}, {"adaptations", adaptations}}.dump();
  }
};

// Greedy generation (generate_tokens in assembly.h; Note [Speculative decoding]) with `target`,
// and with `draft` (a list of zero or one Executor) proposing tokens: JSON with the tokens and
// what the passes did.
std::string generate(const c10::IValue& target, const c10::List<c10::IValue>& draft, const at::Tensor& prompt,
                     const c10::List<c10::IValue>& target_state, const c10::List<c10::IValue>& draft_state,
                     std::int64_t new_tokens, std::int64_t k, std::int64_t max_k) {
  return guarded([&] {
    auto as_model = [](const c10::IValue& v, const char* what) -> TokenModel {
      if (!v.isCustomClass()) throw Error(std::string("generate: ") + what + " is not a swapnet.Executor");
      auto h = v.toCustomClass<ExecutorHolder>();
      return [h](std::vector<c10::IValue> in) {
        c10::impl::GenericList list(c10::AnyType::get());
        for (auto& x : in) list.push_back(std::move(x));
        return h->forward(list);
      };
    };
    if (draft.size() > 1) throw Error("generate: one draft at most");
    auto vec = [](const c10::List<c10::IValue>& l) { return std::vector<c10::IValue>(l.begin(), l.end()); };
    GenerationOptions o;
    o.new_tokens = static_cast<int>(new_tokens);
    o.k = static_cast<int>(k);
    o.max_k = static_cast<int>(max_k);
    const GenerationResult r = generate_tokens(as_model(target, "the target"),
                                               draft.empty() ? TokenModel() : as_model(draft.get(0), "the draft"),
                                               prompt, vec(target_state), vec(draft_state), o);
    return json{{"tokens", r.tokens},       {"pass_ms", r.pass_ms}, {"pass_tokens", r.pass_tokens},
                {"pass_k", r.pass_k},       {"proposed", r.proposed}, {"accepted", r.accepted},
                {"draft_ms", r.draft_ms}}
        .dump();
  });
}

TORCH_LIBRARY(swapnet, m) {
  m.def("pack(str model, str image, Any[] inputs) -> str", &pack);
  m.def("image_info(str image) -> str", &image_info);
  m.def("generate(Any target, Any[] draft, Tensor prompt, Any[] target_state, Any[] draft_state, int new_tokens, "
        "int k, int max_k) -> str",
        &generate);
  m.class_<ExecutorHolder>("Executor")
      .def(torch::init<std::string, std::int64_t, std::string>())
      .def("forward", &ExecutorHolder::forward)
      .def("set_budget", &ExecutorHolder::set_budget)
      .def("plan_json", &ExecutorHolder::plan)
      .def("stats_json", &ExecutorHolder::stats);
  m.class_<RuntimeHolder>("Runtime")
      .def(torch::init<std::string, std::int64_t, std::string>())
      .def("forward", &RuntimeHolder::forward)
      .def("set_budget", &RuntimeHolder::set_budget)
      .def("wait_adapted", &RuntimeHolder::wait_adapted)
      .def("status_json", &RuntimeHolder::status);
}

}  // namespace
}  // namespace swapnet
