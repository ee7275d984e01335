// Lifting a TorchScript module into one graph whose weights are slots (step 1 of Note [Layered
// skeleton] in skeleton_impl.h): the slot table from the module's tensors, then forward's
// inlined graph with each tensor reached from `self` replaced by a graph input per slot, and
// each other attribute by a constant; what would change the module's state is refused.
//
// Note [Tensor lists]
// ~~~~~~~~~~~~~~~~~~~
// A list-of-tensors attribute (nn.LSTM / nn.GRU keep `_flat_weights`, a list of their own
// parameters, and pass it to the fused kernel) cannot be a constant: it must hold whatever is
// bound when its layer runs. Each element is a slot (the parameter it already is, or an
// attribute slot named LIST.i), and the GetAttr is replaced by a prim::ListConstruct of those
// slots' inputs at the GetAttr's place: a slot-reading node, so it starts a layer, and the
// kernel that takes the list follows it in the same layer. Lists of other element types that
// hold tensors (tuples, dicts) are still refused, naming the attribute.
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "skeleton_impl.h"

namespace swapnet {

using detail::contains_tensor;
using detail::for_each_node;
using jit::Node;
using jit::Value;

void Skeleton::Impl::collect_slots(const jit::Module& m) {
  std::unordered_map<const c10::TensorImpl*, int> by_impl;
  auto add = [&](const std::string& name, const at::Tensor& t, SlotKind kind) {
    if (!t.defined()) return;
    if (t.layout() != at::kStrided || t.is_quantized()) {
      refuse("tensor '" + name + "' is " + (t.is_quantized() ? "quantized" : "not strided (sparse?)") +
             "; only dense tensors are supported");
    }
    if (!by_impl.emplace(t.unsafeGetTensorImpl(), static_cast<int>(slots.size())).second) return;
    SlotInfo s;
    s.name = name;
    s.kind = kind;
    s.dtype = t.scalar_type();
    s.sizes = t.sizes().vec();
    s.strides = t.strides().vec();
    s.bytes = static_cast<std::int64_t>(t.numel()) * static_cast<std::int64_t>(t.element_size());
    total_bytes += s.bytes;
    if (kind == SlotKind::kParameter) ++num_parameters;
    if (kind == SlotKind::kBuffer) ++num_buffers;
    slots.push_back(std::move(s));
    bound.push_back(t);
  };
  for (const auto& p : m.named_parameters(true)) add(p.name, p.value, SlotKind::kParameter);
  for (const auto& b : m.named_buffers(true)) add(b.name, b.value, SlotKind::kBuffer);
  for (const auto& a : m.named_attributes(true)) {
    if (a.value.isTensor()) add(a.name, a.value.toTensor(), SlotKind::kAttribute);
    // A list of tensors (nn.LSTM's _flat_weights: its parameters again): each element a slot,
    // unless it is one already (Note [Tensor lists]).
    if (a.value.isTensorList()) {
      const auto list = a.value.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) add(a.name + "." + std::to_string(i), list.get(i), SlotKind::kAttribute);
    }
  }
}

void Skeleton::Impl::lift(const jit::Module& m) {
  auto method = m.find_method("forward");
  if (!method) refuse("the module has no forward method");
  graph = method->graph()->copy();
  jit::Inline(*graph);
  if (graph->inputs().empty()) refuse("forward has no self input");
  num_inputs = static_cast<int>(graph->inputs().size()) - 1;

  SlotByImpl slot_by_impl;
  for (size_t i = 0; i < bound.size(); ++i) slot_by_impl[bound[i].unsafeGetTensorImpl()] = static_cast<int>(i);
  input_of_slot.assign(slots.size(), nullptr);
  lift_attributes(m, slot_by_impl);
  graph->eraseInput(0);
  jit::ConstantPropagation(graph);
  jit::EliminateDeadCode(graph);
  refuse_slot_writes();
  drop_unread_slots();
}

// Replaces every prim::GetAttr chain from `self` by what it reaches (a slot's input, a list of
// them, or a constant), refuses prim::SetAttr and modules used as values, and removes the
// GetAttr nodes.
void Skeleton::Impl::lift_attributes(const jit::Module& m, const SlotByImpl& slot_by_impl) {
  Value* self = graph->inputs()[0];
  std::unordered_map<Value*, c10::IValue> objects{{self, m._ivalue()}};
  std::unordered_map<Value*, std::string> paths{{self, ""}};
  std::vector<Node*> getattrs;
  Node* first = graph->block()->nodes().front();
  for_each_node(graph->block(), [&](Node* n) {
    if (n->kind() == c10::prim::SetAttr) {
      auto it = paths.find(n->input(0));
      std::string where = it == paths.end() ? "" : it->second;
      refuse("forward assigns attribute '" + (where.empty() ? "" : where + ".") + n->s(c10::attr::name) +
             "' (prim::SetAttr): modules that change their own state during inference are not supported");
    }
    if (n->kind() != c10::prim::GetAttr) return;
    auto it = objects.find(n->input(0));
    if (it == objects.end()) refuse("prim::GetAttr '" + n->s(c10::attr::name) + "' on a value that is not a module");
    const std::string& name = n->s(c10::attr::name);
    std::string path = paths[n->input(0)].empty() ? name : paths[n->input(0)] + "." + name;
    c10::IValue v = it->second.toObject()->getAttr(name);
    getattrs.push_back(n);
    if (v.isObject()) {
      objects[n->output()] = v;
      paths[n->output()] = path;
    } else if (v.isTensor() && v.toTensor().defined()) {
      auto s = slot_by_impl.find(v.toTensor().unsafeGetTensorImpl());
      if (s == slot_by_impl.end()) refuse("tensor '" + path + "' is not a parameter, buffer or attribute");
      n->output()->replaceAllUsesWith(slot_input(s->second, n->output()->type()));
    } else if (v.isTensorList()) {
      lift_tensor_list(n, v, path, slot_by_impl);
    } else if (v.isList() && contains_tensor(v.type())) {
      refuse("attribute '" + path + "' is a list holding tensors (" + v.type()->str() + "), which is not supported");
    } else {
      jit::WithInsertPoint guard(first);
      auto c = jit::tryInsertConstant(*graph, v);
      if (!c) refuse("attribute '" + path + "' of type " + v.type()->str() + " cannot be made a constant");
      n->output()->replaceAllUsesWith(*c);
    }
  });
  // Module objects may only be used to reach attributes.
  for (const auto& [value, obj] : objects) {
    for (const jit::Use& u : value->uses()) {
      if (u.user->kind() != c10::prim::GetAttr) {
        std::string p = paths[value].empty() ? "self" : paths[value];
        refuse("forward uses module '" + p + "' as a value in " + u.user->kind().toQualString() +
               " (interface calls and modules passed as arguments are not supported)");
      }
    }
  }
  for (auto it = getattrs.rbegin(); it != getattrs.rend(); ++it) (*it)->destroy();
}

// The graph input that reads slot `s`, added (with `type`) on its first read.
Value* Skeleton::Impl::slot_input(int s, const c10::TypePtr& type) {
  Value*& in = input_of_slot[s];
  if (in == nullptr) {
    in = graph->addInput(slots[s].name)->setType(type);
    slot_of_input[in] = s;
  }
  return in;
}

// Note [Tensor lists]: the list is rebuilt where it is read, from the slots' inputs, so that it
// holds whatever is bound when that layer runs.
void Skeleton::Impl::lift_tensor_list(Node* n, const c10::IValue& v, const std::string& path,
                                      const SlotByImpl& slot_by_impl) {
  std::vector<Value*> elems;
  const auto list = v.toTensorList();
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor t = list.get(i);
    if (!t.defined()) refuse("attribute '" + path + "' holds an undefined tensor at " + std::to_string(i));
    auto s = slot_by_impl.find(t.unsafeGetTensorImpl());
    if (s == slot_by_impl.end()) refuse("tensor '" + path + "." + std::to_string(i) + "' is not a parameter, buffer or attribute");
    elems.push_back(slot_input(s->second, c10::TensorType::get()));
  }
  jit::WithInsertPoint guard(n);
  Node* ln = graph->insertNode(graph->createList(c10::TensorType::get(), elems));
  n->output()->replaceAllUsesWith(ln->output());
}

void Skeleton::Impl::refuse_slot_writes() const {
  // Weights are read-only: refuse in-place writes to a slot (a module saved in training mode
  // updating batch-norm statistics, or a forward that scales its own weight).
  for_each_node(graph->block(), [&](Node* n) {
    const c10::FunctionSchema* schema = n->maybeSchema();
    if (schema == nullptr) return;
    for (size_t i = 0; i < n->inputs().size() && i < schema->arguments().size(); ++i) {
      const c10::AliasInfo* alias = schema->arguments()[i].alias_info();
      auto s = slot_of_input.find(n->input(i));
      if (alias != nullptr && alias->isWrite() && s != slot_of_input.end()) {
        refuse("forward writes to '" + slots[s->second].name + "' in place (" + n->kind().toQualString() +
               "); weights must be read-only during inference");
      }
    }
  });
}

void Skeleton::Impl::drop_unread_slots() {
  // Dead-code elimination may have removed the only reader of a slot (a training-only branch).
  for (size_t s = 0; s < input_of_slot.size(); ++s) {
    if (input_of_slot[s] != nullptr && !input_of_slot[s]->hasUses()) {
      slot_of_input.erase(input_of_slot[s]);
      input_of_slot[s] = nullptr;
    }
  }
}

}  // namespace swapnet
