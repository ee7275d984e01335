// Running the layers in order (step 3 of Note [Layered skeleton] in skeleton_impl.h): a Run
// holds the activations by id; each layer's code takes its activations, then its bound slots,
// and an activation is moved into the last layer that uses it.
#include <c10/core/InferenceMode.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "skeleton_impl.h"
#include "text.h"

namespace swapnet {

using detail::CompiledLayer;

namespace {

void storage_bytes(const c10::IValue& v, std::unordered_set<const void*>& seen, std::int64_t& total) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.has_storage()) return;
    const void* key = t.storage().unsafeGetStorageImpl();
    if (seen.insert(key).second) total += static_cast<std::int64_t>(t.storage().nbytes());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) storage_bytes(e, seen, total);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) storage_bytes(e, seen, total);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) storage_bytes(kv.value(), seen, total);
  }
}

}  // namespace

Skeleton::Run::Run() : s_(std::make_unique<State>()) {}
Skeleton::Run::Run(Run&&) noexcept = default;
Skeleton::Run& Skeleton::Run::operator=(Run&&) noexcept = default;
Skeleton::Run::~Run() = default;
int Skeleton::Run::next_layer() const { return s_->next; }
std::int64_t Skeleton::Run::live_bytes() const {
  std::unordered_set<const void*> seen;
  std::int64_t total = 0;
  for (const auto& v : s_->env) storage_bytes(v, seen, total);
  return total;
}

Skeleton::Run Skeleton::begin(std::vector<c10::IValue> inputs) const {
  if (static_cast<int>(inputs.size()) != impl_->num_inputs) {
    throw Error(impl_->origin + ": forward takes " + std::to_string(impl_->num_inputs) + " input(s), got " +
                std::to_string(inputs.size()));
  }
  Run run;
  run.s_->env.resize(impl_->id_value.size());
  for (size_t i = 0; i < inputs.size(); ++i) run.s_->env[impl_->user_input_ids[i]] = std::move(inputs[i]);
  return run;
}

void Skeleton::run_layer(Run& run) const {
  const int k = run.s_->next;
  if (k >= static_cast<int>(impl_->compiled.size())) {
    throw Error(impl_->origin + ": all " + std::to_string(impl_->compiled.size()) + " layers already ran");
  }
  const CompiledLayer& c = impl_->compiled[k];
  const LayerInfo& L = impl_->layers[k];
  auto& env = run.s_->env;
  jit::Stack stack;
  stack.reserve(c.in_ids.size() + L.used_slots.size());
  for (size_t i = 0; i < c.in_ids.size(); ++i) {
    if (c.in_last_use[i]) stack.push_back(std::move(env[c.in_ids[i]]));
    else stack.push_back(env[c.in_ids[i]]);
  }
  for (int s : L.used_slots) {
    const at::Tensor& t = impl_->bound[s];
    if (!t.defined()) {
      throw Error(impl_->origin + ": layer " + std::to_string(k) + " (" + L.name + ") reads slot " +
                  std::to_string(s) + " '" + impl_->slots[s].name + "', which is not bound");
    }
    stack.emplace_back(t);
  }
  try {
    c10::InferenceMode guard;
    jit::InterpreterState(c.code).run(stack);
  } catch (const std::exception& e) {
    throw Error(impl_->origin + ": layer " + std::to_string(k) + " (" + L.name + ", " + L.ops.front() +
                ") failed: " + detail::torch_message(e));
  }
  for (size_t i = 0; i < c.out_ids.size(); ++i) env[c.out_ids[i]] = std::move(stack[i]);
  run.s_->next = k + 1;
}

void Skeleton::run_layers(Run& run, int end) const {
  while (run.s_->next < end) run_layer(run);
}

c10::IValue Skeleton::finish(Run& run) const {
  if (run.s_->next != static_cast<int>(impl_->compiled.size())) {
    throw Error(impl_->origin + ": finish() after " + std::to_string(run.s_->next) + " of " +
                std::to_string(impl_->compiled.size()) + " layers");
  }
  std::vector<c10::IValue> outs;
  for (size_t i = 0; i < impl_->output_ids.size(); ++i) {
    int id = impl_->output_ids[i];
    outs.push_back(id < 0 ? impl_->output_consts[i] : run.s_->env[id]);
  }
  run.s_->env.clear();
  if (outs.size() == 1) return outs[0];
  return c10::ivalue::Tuple::create(std::move(outs));
}

c10::IValue Skeleton::forward(std::vector<c10::IValue> inputs) const {
  Run run = begin(std::move(inputs));
  run_layers(run, static_cast<int>(impl_->compiled.size()));
  return finish(run);
}

}  // namespace swapnet
