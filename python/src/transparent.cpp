// Transparent swapping (Note [Transparent swapping] in preload/src/jit_load.cpp): what the
// preload's torch::jit::load / import_ir_module hand a model file to when SWAPNET_BUDGET is set.
//
// The model is never loaded into the program. Its swap image is found or made:
//   1. MODEL's stem + ".swapnet" beside it (an image the user packed), if not older than MODEL;
//   2. STEM.<content hash>.swapnet beside MODEL (if the directory is writable), else in the
//      cache directory ($SWAPNET_CACHE_DIR, else $XDG_CACHE_HOME/swapnet, else ~/.cache/swapnet):
//      keyed by the file's content (XXH3-64), so a changed model gets a new image;
//   3. else made by `swapnet pack` in a child process (the model's weights are read there, not
//      here) into a temporary file renamed into place 2: now, when SWAPNET_INPUT_SHAPE gives
//      forward's input shape(s) (as `swapnet pack --input-shape`, several separated by ';'), or
//      else at the first forward, from its inputs' shapes (lazily(): forward's signature is read
//      by `swapnet signature` in a child; a model that then cannot be packed is loaded normally
//      and runs as such).
// The module returned has the model's forward signature (from the image's skeleton) and one
// attribute, `_swapnet`, an Executor custom class object (classes.h) holding the image open
// within the budget; forward calls it: outputs bit-identical to the model's forward.
//
// SWAPNET_BUDGET: bytes, text ("60MiB"), or a percentage of the model's full demand (weights +
// activations, as swapnet.Executor takes it). On the GPU where the program puts the model there
// (Note [Transparent swapping on the GPU]). Declined, each said once on stderr, and loaded
// normally: a map_location other than the CPU or the first CUDA device (or that device where
// swapnet cannot run on it), extra files asked for, a failing pack, a budget the model fits in
// anyway or is below its minimum.
// The budget changes at run time through SWAPNET_BUDGET_SOURCE and SWAPNET_CONTROL (Models
// below), taken at the next block boundary of an inference in progress.
// SWAPNET_ALLOC_STATS=1 adds one line per swapped model at exit:
//   swapnet-model: MODEL image=IMAGE budget=N blocks=N resident_blocks=N peak_model_bytes=N
//                  bytes_read=N inferences=N device=cpu|cuda|none unswapped=N (none: it runs as
//                  loaded normally; unswapped: the forwards run so)
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/custom_class.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "classes.h"
#include "torch_compat.h"
#include "transparent_image.h"
#include "swapnet/scheduler.h"
#include "swapnet/swapcore.h"

namespace swapnet {

// Note [Transparent swapping on the GPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A program puts its model on the GPU in one of two ways, and both run it swapped there, within
// SWAPNET_BUDGET, on the executor's CUDA backend (Note [Swapping onto the GPU] in
// assembly/src/device_backend.cpp):
// - it loads it there (map_location "cuda" or "cuda:0", torch::jit::load(file, kCUDA)): the
//   executor opens on the GPU. Other devices (a second GPU, anything else) are declined at load
//   (said once, loaded normally), and so is "cuda" where swapnet cannot run on it (a CPU-only
//   libtorch, no usable GPU: require_cuda's reason);
// - it loads it, then moves it (.to("cuda")). The swapped module holds no parameters or buffers,
//   so the move does nothing to it, and its first sign is forward's inputs arriving on the GPU.
//   So a transparently swapped model follows its inputs: when they are all on the CPU, or all on
//   the first CUDA device, and its executor is elsewhere, the executor moves there (closed, then
//   opened on the new device: two at once would hold twice the budget) before the inference
//   runs. Inputs elsewhere (a second GPU), or a device it fails to open on, send the model to the
//   fallback: loaded normally and moved where the inputs are, said once. Inputs on several
//   devices, or no tensors, leave it where it is.
// Outputs are where the inputs went, as the program's own module would have made them.
InputsOn inputs_on(const std::vector<c10::IValue>& inputs, std::string* where) {
  std::vector<c10::Device> seen;
  std::function<void(const c10::IValue&)> visit = [&](const c10::IValue& v) {
    if (v.isTensor()) {
      seen.push_back(v.toTensor().device());
    } else if (v.isTuple()) {
      for (const auto& e : v.toTupleRef().elements()) visit(e);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef()) visit(e);
    } else if (v.isGenericDict()) {
      for (const auto& kv : v.toGenericDict()) visit(kv.value());
    }
  };
  for (const auto& v : inputs) visit(v);
  if (seen.empty()) return InputsOn::kNone;
  for (const c10::Device& d : seen) {
    if (d != seen.front()) {
      *where = "several devices";
      return InputsOn::kMixed;
    }
  }
  *where = seen.front().str();
  if (seen.front().is_cpu()) return InputsOn::kCPU;
  if (seen.front().is_cuda() && seen.front().index() <= 0) return InputsOn::kCUDA;
  return InputsOn::kElsewhere;
}

namespace {

using torch::jit::CompilationUnit;
using torch::jit::ExtraFilesMap;
using torch::jit::Module;
using namespace transparent;

// ---- the program's swapped models: stats at exit, budget changes at run time ----
struct Swapped {
  std::string model, image;
  c10::intrusive_ptr<ExecutorHolder> holder;
};

// Every model the program loaded swapped, as one BudgetTarget for SWAPNET_BUDGET_SOURCE and
// the control socket: a new total is split in proportion to the models' budgets now (one
// model: all of it); each takes its share at its next block boundary. A model that runs as
// loaded normally (ExecutorHolder::loaded_normally) has no share: its memory is the model's
// whatever the budget, so the swapped ones split the whole total, and it counts in none.
class Models final : public BudgetTarget {
 public:
  void add(Swapped s) {
    std::lock_guard<std::mutex> lock(mu_);
    list_.push_back(std::move(s));
  }
  void set_budget(std::uint64_t total) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t now = total_locked();
    if (list_.empty() || now == 0) return;
    for (const Swapped& s : list_) {
      if (s.holder->loaded_normally()) continue;
      const double share = static_cast<double>(s.holder->budget()) / static_cast<double>(now);
      s.holder->request_budget(static_cast<std::uint64_t>(share * static_cast<double>(total)));
    }
  }
  std::uint64_t total_budget() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return total_locked();
  }
  std::string status_json() const override {
    std::lock_guard<std::mutex> lock(mu_);
    json j;
    j["total_budget_bytes"] = total_locked();
    j["models"] = json::array();
    for (const Swapped& s : list_) {
      const ExecutorHolder::Summary m = s.holder->summary();
      j["models"].push_back({{"name", s.model},
                             {"image", s.image},
                             {"budget_bytes", s.holder->budget()},
                             {"paused", false},
                             {"blocks", m.blocks},
                             {"requests", m.inferences},
                             {"unswapped_requests", m.unswapped},
                             {"loaded_normally", s.holder->loaded_normally()},
                             {"peak_model_bytes", m.peak_model_bytes},
                             {"bytes_read", m.bytes_read},
                             {"device", m.device}});
    }
    return j.dump();
  }
  // swapnet-model lines (SWAPNET_ALLOC_STATS=1), at exit.
  void print() const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Swapped& s : list_) {
      const ExecutorHolder::Summary m = s.holder->summary();
      std::fprintf(stderr,
                   "swapnet-model: %s image=%s budget=%llu blocks=%zu resident_blocks=%zu peak_model_bytes=%llu "
                   "bytes_read=%llu inferences=%llu device=%s unswapped=%llu\n",
                   s.model.c_str(), s.image.c_str(), static_cast<unsigned long long>(s.holder->budget()), m.blocks,
                   m.resident_blocks, static_cast<unsigned long long>(m.peak_model_bytes),
                   static_cast<unsigned long long>(m.bytes_read), static_cast<unsigned long long>(m.inferences),
                   m.device.c_str(), static_cast<unsigned long long>(m.unswapped));
    }
  }

 private:
  std::uint64_t total_locked() const {
    std::uint64_t t = 0;
    for (const Swapped& s : list_) t += s.holder->loaded_normally() ? 0 : s.holder->budget();
    return t;
  }
  mutable std::mutex mu_;
  std::vector<Swapped> list_;
};

// Never destroyed: read at exit, and by the watcher and control threads until the process ends.
Models& models() {
  static Models* m = new Models;
  return *m;
}

// SWAPNET_BUDGET_SOURCE (file:PATH | meminfo:RESERVE | cgroup:PATH, polled every
// SWAPNET_BUDGET_PERIOD_MS, default 100) and SWAPNET_CONTROL (a socket path, or "default" for
// swapnet ctl's default) start with the first swapped model; a bad one is said and ignored.
// The watcher and the control server are stopped (their threads joined) at exit, before the
// libraries' static objects are destroyed under them; then the stats lines are printed.
struct Controls {
  std::unique_ptr<BudgetWatcher> watcher;
  std::unique_ptr<ControlServer> control;
  bool stats = false;
};
Controls& controls() {
  static Controls* c = new Controls;  // never destroyed (see at_exit)
  return *c;
}
void at_exit() {
  Controls& c = controls();
  c.watcher.reset();
  c.control.reset();
  if (c.stats) models().print();
}

void start_controls() {
  static std::once_flag once;
  std::call_once(once, [] {
    Controls& c = controls();
    c.stats = !env("SWAPNET_ALLOC_STATS").empty() && env("SWAPNET_ALLOC_STATS") != "0";
    if (const std::string spec = env("SWAPNET_BUDGET_SOURCE"); !spec.empty()) {
      try {
        int ms = 100;
        if (const std::string p = env("SWAPNET_BUDGET_PERIOD_MS"); !p.empty()) ms = std::max(1, std::stoi(p));
        c.watcher = std::make_unique<BudgetWatcher>(&models(), BudgetSource(spec), std::chrono::milliseconds(ms));
      } catch (const std::exception& e) {
        say("source", std::string("SWAPNET_BUDGET_SOURCE=") + spec + ": " + e.what() + "; ignored");
      }
    }
    if (std::string path = env("SWAPNET_CONTROL"); !path.empty()) {
      if (path == "default") path = default_control_path();
      try {
        c.control = std::make_unique<ControlServer>(&models(), path);
      } catch (const std::exception& e) {
        say("control", std::string("SWAPNET_CONTROL=") + path + ": " + e.what() + "; ignored");
      }
    }
    std::atexit(at_exit);
  });
}

// The module handed to the program: forward(self, <the model's inputs>) -> <its output>, which
// calls self._swapnet.forward([inputs]) and casts the result back to the declared type.
Module wrapper(std::shared_ptr<CompilationUnit> cu, const std::string& model, const std::vector<c10::Argument>& inputs,
               const c10::TypePtr& returns, const c10::intrusive_ptr<ExecutorHolder>& holder) {
  if (!cu) cu = std::make_shared<CompilationUnit>();
  std::string name;
  for (char c : stem_of(model)) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  Module m(c10::QualifiedName("__torch__.swapnet.Swapped_" + name), cu, /*shouldMangle=*/true);
  m.register_attribute("training", c10::BoolType::get(), false);
  m.register_attribute("_swapnet", torch::getCustomClass("__torch__.torch.classes.swapnet.Executor"), c10::IValue(holder));

  auto g = std::make_shared<torch::jit::Graph>();
  torch::jit::Value* self = g->addInput("self")->setType(m.type());
  std::vector<torch::jit::Value*> args;
  for (const c10::Argument& a : inputs) args.push_back(g->addInput(a.name())->setType(a.type()));
  torch::jit::Value* obj = g->insertGetAttr(self, "_swapnet");
  torch::jit::Value* list = g->insertNode(g->createList(c10::AnyType::get(), args))->output();
  torch::jit::Node* call = g->insertNode(g->create(c10::prim::CallMethod, {obj, list}, 1));
  call->s_(c10::attr::name, "forward");
  call->output()->setType(c10::AnyType::get());
  torch::jit::Value* out = g->insertUncheckedCast(call->output(), returns);
  g->registerOutput(out);
  auto* fn = cu->create_function(c10::QualifiedName(*m.type()->name(), "forward"), g);
  m.type()->addMethod(fn);
  return m;
}

// forward's inputs (without self) and output type, from the image's weightless skeleton.
void signature_of_image(const std::string& model, const ImageInfo& info, std::vector<c10::Argument>* inputs,
                        c10::TypePtr* returns) {
  std::istringstream is(info.skeleton);
  Module skeleton = torch::jit::load(is);  // its forward takes the inputs, then every tensor
  const c10::FunctionSchema& schema = skeleton.get_method("forward").function().getSchema();
  const size_t n = info.num_inputs;
  if (schema.arguments().size() < 1 + n || schema.returns().size() != 1) {
    throw Error(model + ": the image's skeleton does not have forward's signature");
  }
  inputs->assign(schema.arguments().begin() + 1, schema.arguments().begin() + 1 + static_cast<std::ptrdiff_t>(n));
  *returns = schema.returns()[0].type();
}

// The same, from the model file, read by `swapnet signature` in a child process.
void signature_of_model(const std::string& model, std::vector<c10::Argument>* inputs, c10::TypePtr* returns) {
  std::string text;
  if (std::string err = run_cli({"signature", model}, &text); !err.empty()) throw Error(err);
  const c10::FunctionSchema schema = torch::jit::parseSchema(json::parse(text).at("schema").get<std::string>());
  if (schema.returns().size() != 1) throw Error(model + ": forward returns " + std::to_string(schema.returns().size()) + " values");
  *inputs = schema.arguments();
  *returns = schema.returns()[0].type();
}

// Forward's tensor inputs as `swapnet pack --input-shape` values, ';' between inputs.
std::string shapes_of(const std::string& model, const std::vector<c10::IValue>& inputs) {
  for (const auto& v : inputs) {
    if (!v.isTensor()) throw Error(model + ": forward's inputs are not all tensors (" + v.tagKind() + "): cannot make its image");
  }
  return shape_text(inputs, ';');
}

void register_swapped(const std::string& model, const std::string& image, ExecutorHolder* holder) {
  models().add(Swapped{model, image, c10::intrusive_ptr<ExecutorHolder>::unsafe_reclaim_from_nonowning(holder)});
  start_controls();
}

// How the model is loaded normally: the interposed libtorch function, of the form `kind` names.
struct Real {
  void* fn = nullptr;
  int kind = 0;
  c10::optional<c10::Device> device;
  compat::JitFlags flags;  // the call's trailing flags (libtorch 2.x)
  // The call the program made (its compilation unit and extra files, either may be absent).
  Module call(std::shared_ptr<CompilationUnit> cu, const std::string& file, ExtraFilesMap* extra) const;
  // A load of our own (the fallback of a model that cannot be swapped).
  Module load(const std::string& file) const;
};

// The model loaded normally (at its first call), for a model that cannot run swapped. It runs
// where forward's inputs are: a program that moved its module (.to("cuda")) moved the swapped
// one, which has no parameters, so only its inputs say where the program wants it.
ExecutorHolder::Fallback loaded_normally(const std::string& model, const Real& real) {
  auto loaded = std::make_shared<c10::optional<Module>>();
  auto on = std::make_shared<std::string>();
  return [model, real, loaded, on](std::vector<c10::IValue> in) {
    if (!loaded->has_value()) *loaded = real.load(model);
    std::string where;
    const InputsOn at = inputs_on(in, &where);
    if (at != InputsOn::kNone && at != InputsOn::kMixed && where != *on) {
      (**loaded).to(c10::Device(where));
      *on = where;
    }
    return (**loaded).forward(std::move(in));
  };
}

// No image yet and no SWAPNET_INPUT_SHAPE: a module with the model's forward (its signature read
// by a child process) whose first call makes the image from its inputs' shapes, then runs
// swapped; if that fails, the model is loaded normally then and runs as such (said).
c10::optional<Module> lazily(std::shared_ptr<CompilationUnit> cu, const std::string& model, const std::string& out,
                             const std::string& spec, const Real& real, const json& options) {
  const std::string key = "transparent:" + model;
  (void)parse_budget(spec, 1 << 30);  // a malformed budget is refused now, not at the first call
  std::vector<c10::Argument> inputs;
  c10::TypePtr returns;
  try {
    signature_of_model(model, &inputs, &returns);
  } catch (const std::exception& e) {
    say(key, std::string(e.what()) + "; " + model + " loaded normally");
    return c10::nullopt;
  }
  say(key, "no swap image for " + model + " yet: it is made at " + out + " when forward is first called (from " +
               "its inputs' shapes; SWAPNET_INPUT_SHAPE makes it when the model loads)");
  auto open = [model, out, spec](const std::vector<c10::IValue>& in, std::uint64_t* budget) {
    if (!is_file(out)) {
      if (std::string err = make_image(model, out, shapes_of(model, in)); !err.empty()) throw Error(err);
    }
    ImageInfo info;
    read_image_info(out, &info).throw_if_error();
    const std::uint64_t full = info.data_size + info.activation_bytes;
    *budget = std::min(parse_budget(spec, full), full);
    return out;
  };
  auto holder = c10::make_intrusive<ExecutorHolder>(open, loaded_normally(model, real), options.dump());
  holder->follows_inputs = true;
  holder->on_open = [model](ExecutorHolder* h) { register_swapped(model, h->image, h); };
  return wrapper(std::move(cu), model, inputs, returns, holder);
}

// Returns the swapped module, or (declined, said once) nothing.
c10::optional<Module> try_swap(std::shared_ptr<CompilationUnit> cu, const std::string& model,
                               c10::optional<c10::Device> device, ExtraFilesMap* extra, const Real& real) {
  notices_on();
  const std::string key = "transparent:" + model;
  // Note [Transparent swapping on the GPU]: map_location "cuda" (or "cuda:0") runs it there.
  std::string on = "cpu";
  if (device && !device->is_cpu()) {
    if (!device->is_cuda() || device->index() > 0) {
      say(key, model + ": map_location " + device->str() + ": loaded normally (swapnet runs models on the CPU or " +
                   "the first CUDA device)");
      return c10::nullopt;
    }
    try {
      require_cuda(model + ": map_location " + device->str());
    } catch (const std::exception& e) {
      say(key, std::string(e.what()) + "; loaded normally");
      return c10::nullopt;
    }
    on = "cuda";
  }
  if (extra && !extra->empty()) {
    say(key, model + ": extra files asked for: loaded normally");
    return c10::nullopt;
  }
  if (!is_file(model)) return c10::nullopt;  // libtorch says what is wrong
  const std::string spec = env("SWAPNET_BUDGET");
  std::string why, make_at;
  std::string image = find_image(model, &make_at, &why);
  if (image.empty() && make_at.empty()) {
    say(key, why + "; loaded normally");
    return c10::nullopt;
  }
  if (image.empty()) {
    if (const std::string shapes = env("SWAPNET_INPUT_SHAPE"); !shapes.empty()) {
      if (std::string err = make_image(model, make_at, shapes); !err.empty()) {
        say(key, err + "; " + model + " loaded normally");
        return c10::nullopt;
      }
      image = make_at;
    } else {
      return lazily(std::move(cu), model, make_at, spec, real, json{{"learn", learn_from_env()}, {"device", on}});
    }
  }
  ImageInfo info;
  if (Status s = read_image_info(image, &info); !s.ok()) {
    say(key, s.message() + "; " + model + " loaded normally");
    return c10::nullopt;
  }
  const std::uint64_t full = info.data_size + info.activation_bytes;
  const std::uint64_t budget = parse_budget(spec, full);
  if (budget >= full) {
    say(key, model + " fits in SWAPNET_BUDGET=" + spec + " (" + format_bytes(budget) + " >= " + format_bytes(full) +
                 " of weights and activations): loaded normally");
    return c10::nullopt;
  }
  c10::intrusive_ptr<ExecutorHolder> holder;
  try {
    notices_on();  // a bad SWAPNET_LEARN is said
    const json o = {{"learn", learn_from_env()}, {"learn_store", learn_store_for(image, on)}, {"device", on}};
    holder = c10::make_intrusive<ExecutorHolder>(image, static_cast<std::int64_t>(budget), o.dump());
  } catch (const std::exception& e) {
    say(key, std::string(e.what()) + " (SWAPNET_BUDGET=" + spec + "); " + model + " loaded normally");
    return c10::nullopt;
  }
  holder->follows_inputs = true;
  holder->fallback = loaded_normally(model, real);
  std::vector<c10::Argument> inputs;
  c10::TypePtr returns;
  signature_of_image(model, info, &inputs, &returns);
  Module m = wrapper(std::move(cu), model, inputs, returns, holder);
  log(LogLevel::kInfo, model + " runs swapped from " + image + " within " + format_bytes(budget) + " on the " +
                          (on == "cuda" ? "GPU" : "CPU"));
  register_swapped(model, image, holder.get());
  return m;
}

enum Kind : int { kLoad3 = 0, kLoad2 = 1, kImport4 = 2 };

// Set while Real::load runs: libtorch's two-argument load calls the three-argument one through
// the preload again, which must then go straight to libtorch.
thread_local bool loading_real = false;

Module Real::call(std::shared_ptr<CompilationUnit> cu, const std::string& file, ExtraFilesMap* extra) const {
  ExtraFilesMap none;
  ExtraFilesMap& files = extra ? *extra : none;
  switch (kind) {
    case kLoad3:
      return compat::call_load3(fn, file, device, files, flags);
    case kLoad2:
      return compat::call_load2(fn, file, device, flags);
    default:
      return compat::call_import4(fn, cu ? std::move(cu) : std::make_shared<CompilationUnit>(), file, device, files,
                                  flags);
  }
}

Module Real::load(const std::string& file) const {
  struct Flag {
    bool was = loading_real;
    Flag() { loading_real = true; }
    ~Flag() { loading_real = was; }
  } flag;
  return call(nullptr, file, nullptr);
}

}  // namespace
}  // namespace swapnet

// The preload's entry point (preload/src/jit_load.cpp): the swapped module, or what the real
// libtorch function returns. Any failure of swapnet's own loads the model normally (said).
extern "C" __attribute__((visibility("default"))) torch::jit::Module swapnet_transparent_load(
    void* real, int kind, std::shared_ptr<torch::jit::CompilationUnit> cu, const std::string& file,
    c10::optional<c10::Device> device, torch::jit::ExtraFilesMap* extra, const swapnet::compat::JitFlags* flags) {
  using namespace swapnet;
  const Real r{real, kind, device, flags ? *flags : compat::JitFlags{}};
  try {
    if (loading_real) {
      // a load made by Real::load: libtorch's own
    } else if (auto m = try_swap(cu, file, device, extra, r)) {
      return *m;
    }
  } catch (const std::exception& e) {
    say("transparent:" + file, file + ": " + e.what() + "; loaded normally");
  }
  return r.call(std::move(cu), file, extra);
}
