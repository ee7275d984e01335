// The layered skeleton: splits any TorchScript module into layers whose weights are slots bound
// by reference, and runs those layers in order with outputs bit-identical to module.forward.
//
// Note [Layered skeleton]
// ~~~~~~~~~~~~~~~~~~~~~~~
// 1. Lift. forward's graph is copied and every call inlined, so the whole model is one graph
//    whose weights are reached through prim::GetAttr chains from `self`. Each chain that ends in
//    a tensor (parameter, buffer or tensor attribute) is replaced by a new graph input, one per
//    slot; chains that end in a non-tensor attribute (self.training, a float scale, a list of
//    ints) become constants; then constant propagation and dead-code elimination remove what
//    only applied in training. `self` must have no other use: a module that assigns its own
//    attributes (prim::SetAttr), writes to a weight in place, or passes a submodule around as a
//    value is refused, naming the construct.
// 2. Cut. The top-level nodes, in graph order, are grouped so that each layer holds at most one
//    node that reads slots, together with the slot-free nodes that follow it (relu, add,
//    pooling). A prim::If / prim::Loop is one atomic node. Slot-free nodes that only prepare
//    non-tensor arguments (int lists, sizes) move forward into the layer that consumes them, so
//    activations, not argument lists, cross layer boundaries. Constants are cloned into every
//    layer that uses them.
// 3. Compile. Each layer becomes its own graph: inputs are the activations defined before it
//    and used in it, then its slots; outputs are the values it defines that later layers (or
//    the return) use. Running these graphs in order over the same tensor objects performs the
//    same operator calls, in the same order, on the same inputs as forward: bit-identical.
//    In-place ops on activations keep their meaning because activations are passed as the
//    same tensor handles, never copied. An activation is dropped after its last use.
// 4. Slots are owned by the first layer that reads them (their bytes are counted there); a
//    slot read by no layer (num_batches_tracked in eval) belongs to the layer of its closest
//    sibling by qualified name, so every byte of the module is accounted to exactly one layer.
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
// Note [Splitting large layers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer's weights are read, held and given back as one, so the largest layer sets a model's
// least budget (the ring holds it whole) and, while it computes, how much the disk can read
// ahead: vgg19's fc6 (392 MiB) made a third of vgg19 (183 MiB) impossible, and
// fcn_resnet101's classifier.0 (36 MiB, plus oneDNN's reordered copy of it and its
// activations: 92 of the 94 MB a third of the model has) left the disk idle while it ran. So,
// between lifting and cutting, a convolution (aten::conv1d/2d/3d, groups 1) or aten::linear
// whose weight is read by that node alone and is larger than SkeletonOptions::split_above is
// rewritten along its output channels:
//     y = conv(x, W, b)   ->   y_i = conv(x, W[a_i:b_i], b[a_i:b_i]);  y = cat([y_0, ..], 1)
// (the channel dimension counted from the end, so unbatched inputs join right too; linear: the
// last dimension). Each part's weight and bias are slots of their own,
// views of the parameter's rows (the first dimension: contiguous), named "W[a:b]", so each
// part is a layer of its own ("classifier.0[0:192]"), read, run and freed a part at a time;
// the cat and what follows run in the last part's layer. Parts are whole multiples of 64 rows
// (the kernels' output-channel blocks stay aligned; the last part takes what is left), at most
// SkeletonOptions::split_part bytes each (pack: 4 MiB, a quarter of its threshold, so that the
// ring holds several and the disk reads on while one computes) unless 64 rows are more. An output element is computed from the same
// inputs and weights by the same kernel, in a call with fewer output channels: bit-identical
// where the kernel's choice and reduction order do not depend on the output channels. On this
// project's CPUs that held for every part of 128 rows or more tried (conv 3x3 and 1x1, 64-2048
// channels; linear 25088 x 4096 in 2-16 parts), not for a 64-row part of a 256 -> 512 stride-2
// 3x3 convolution on a 4x4 map (oneDNN chose another kernel), and neither library promises it.
// So load_for_pack() checks the example input (at pack's thread count, on the packing CPU, and
// on its GPU where one is usable: Note [Splitting on the GPU]);
// each layer whose parts differ is tried in parts of split_above, and kept whole if those differ
// too. The parts are no slower: the cat
// copies the output once, each part reorders its input again, and oneDNN reorders less weight
// at once (fcn_resnet101's classifier.0: 53 ms whole, 45-47 ms in 2-4 parts; vgg19's fc6 27 ms
// whole and in 8 parts).
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/jit/serialization/import.h>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>
#include <unordered_set>

#include "cpu_meter.h"
#include "flops.h"
#include "swapnet/assembly.h"
#include "text.h"

namespace swapnet {

namespace jit = torch::jit;
using jit::Node;
using jit::Value;

namespace {

// A layer compiled to its own graph (step 3 of Note [Layered skeleton]).
struct CompiledLayer {
  std::vector<Node*> nodes;       // its nodes in the lifted whole-model graph
  std::vector<int> in_ids;        // activation ids pushed first, in graph-input order
  std::vector<bool> in_last_use;  // in_ids[i] is not used after this layer: moved, not copied
  std::vector<int> out_ids;       // activation ids its outputs are stored to
  std::shared_ptr<jit::Graph> graph;
  jit::Code code;
};

bool contains_tensor(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (t->kind() == c10::TypeKind::NumberType || t->kind() == c10::TypeKind::IntType ||
      t->kind() == c10::TypeKind::FloatType || t->kind() == c10::TypeKind::BoolType ||
      t->kind() == c10::TypeKind::StringType || t->kind() == c10::TypeKind::NoneType ||
      t->kind() == c10::TypeKind::DeviceObjType || t->kind() == c10::TypeKind::ComplexType) {
    return false;
  }
  if (t->kind() == c10::TypeKind::ListType || t->kind() == c10::TypeKind::TupleType ||
      t->kind() == c10::TypeKind::OptionalType || t->kind() == c10::TypeKind::DictType) {
    for (const auto& c : t->containedTypes()) {
      if (contains_tensor(c)) return true;
    }
    return false;
  }
  return true;  // anything else (objects, Any): assume it may hold tensors
}

// Visits every node of a block and its nested blocks, in order, including each block's
// prim::Return node (a value may be used only as a block's output).
void for_each_node(jit::Block* b, const std::function<void(Node*)>& fn) {
  for (Node* n : b->nodes()) {
    fn(n);
    for (jit::Block* sub : n->blocks()) for_each_node(sub, fn);
  }
  fn(b->return_node());
}

std::string common_module_prefix(const std::vector<std::string>& names) {
  // Longest common prefix of whole dotted components, without the tensor's own name.
  if (names.empty()) return "";
  std::vector<std::string> first;
  {
    std::string cur;
    for (char c : names[0]) {
      if (c == '.') { first.push_back(cur); cur.clear(); } else cur += c;
    }
  }
  size_t keep = first.size();  // components excluding the last (tensor name)
  for (const auto& n : names) {
    size_t pos = 0, k = 0;
    while (k < keep) {
      const std::string& comp = first[k];
      if (n.compare(pos, comp.size(), comp) != 0 || pos + comp.size() >= n.size() ||
          n[pos + comp.size()] != '.') break;
      pos += comp.size() + 1;
      ++k;
    }
    keep = k;
  }
  std::string out;
  for (size_t k = 0; k < keep; ++k) out += (k ? "." : "") + first[k];
  return out;
}

size_t shared_components(const std::string& a, const std::string& b) {
  size_t n = 0, i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) {
    if (a[i] == '.') ++n;
    ++i;
  }
  return n;
}

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

[[noreturn]] void refuse_binding(const std::string& origin, const std::string& what) {
  throw Error(origin + ": " + what);
}

}  // namespace

struct Skeleton::Impl {
  std::string origin;
  // Inlined nodes keep call stacks that point into the module's compiled methods (used when an
  // error is formatted), so the compilation unit must outlive the layer graphs. It holds code,
  // not weights.
  std::shared_ptr<jit::CompilationUnit> methods;
  int num_inputs = 0;
  std::shared_ptr<jit::Graph> graph;  // lifted: user inputs, then one input per used slot
  std::unordered_map<Value*, int> slot_of_input;
  std::vector<Value*> input_of_slot;  // slot -> graph input (nullptr if never read)
  std::vector<SlotInfo> slots;
  std::vector<at::Tensor> bound;
  std::vector<LayerInfo> layers;
  std::vector<CompiledLayer> compiled;
  std::vector<Value*> id_value;             // activation id -> value in `graph`
  std::vector<int> user_input_ids;          // forward input i -> activation id
  std::vector<int> output_ids;              // graph output i -> id, or -1 for a constant
  std::vector<c10::IValue> output_consts;
  std::int64_t total_bytes = 0;
  int num_parameters = 0, num_buffers = 0;

  std::vector<std::uint64_t> slot_offset;  // file offset of each slot (from_image skeletons)
  int split_parts = 0;                      // Note [Splitting large layers]
  int split_added = 0;                      // slots added by splitting (parts less the tensors split)
  std::vector<std::string> split_weights;   // the weights of the layers split

  void collect_slots(const jit::Module& m);
  void lift(const jit::Module& m);
  void split_large(const SkeletonOptions& options);
  void reorder_slots(const std::vector<int>& order);
  void cut();
  void renumber_slots();
  std::string serialize() const;
  void assign_ids();
  std::shared_ptr<jit::Graph> layer_graph(int k, bool all_values) const;
  void compile();
  [[noreturn]] void refuse(const std::string& what) const {
    throw Error(origin + ": " + what);
  }
};

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
  Value* self = graph->inputs()[0];
  num_inputs = static_cast<int>(graph->inputs().size()) - 1;

  std::unordered_map<const c10::TensorImpl*, int> slot_by_impl;
  for (size_t i = 0; i < bound.size(); ++i) slot_by_impl[bound[i].unsafeGetTensorImpl()] = static_cast<int>(i);
  input_of_slot.assign(slots.size(), nullptr);

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
      Value*& in = input_of_slot[s->second];
      if (in == nullptr) {
        in = graph->addInput(slots[s->second].name)->setType(n->output()->type());
        slot_of_input[in] = s->second;
      }
      n->output()->replaceAllUsesWith(in);
    } else if (v.isTensorList()) {
      // Note [Tensor lists]: the list is rebuilt where it is read, from the slots' inputs, so
      // that it holds whatever is bound when that layer runs.
      std::vector<Value*> elems;
      const auto list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        const at::Tensor t = list.get(i);
        if (!t.defined()) refuse("attribute '" + path + "' holds an undefined tensor at " + std::to_string(i));
        auto s = slot_by_impl.find(t.unsafeGetTensorImpl());
        if (s == slot_by_impl.end()) refuse("tensor '" + path + "." + std::to_string(i) + "' is not a parameter, buffer or attribute");
        Value*& in = input_of_slot[s->second];
        if (in == nullptr) {
          in = graph->addInput(slots[s->second].name)->setType(c10::TensorType::get());
          slot_of_input[in] = s->second;
        }
        elems.push_back(in);
      }
      jit::WithInsertPoint guard(n);
      Node* ln = graph->insertNode(graph->createList(c10::TensorType::get(), elems));
      n->output()->replaceAllUsesWith(ln->output());
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
  graph->eraseInput(0);
  jit::ConstantPropagation(graph);
  jit::EliminateDeadCode(graph);
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
  // Dead-code elimination may have removed the only reader of a slot (a training-only branch).
  for (size_t s = 0; s < input_of_slot.size(); ++s) {
    if (input_of_slot[s] != nullptr && !input_of_slot[s]->hasUses()) {
      slot_of_input.erase(input_of_slot[s]);
      input_of_slot[s] = nullptr;
    }
  }
}

// Rows of a split weight per part: whole multiples of 64 (the last part takes what is left), at
// most `above` bytes unless 64 rows are more.
static std::int64_t rows_per_part(const SlotInfo& w, std::uint64_t above) {
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(1, w.bytes / w.sizes[0]));
  const std::uint64_t rows = above / row_bytes / 64 * 64;
  return static_cast<std::int64_t>(std::max<std::uint64_t>(64, std::min<std::uint64_t>(rows, static_cast<std::uint64_t>(w.sizes[0]))));
}

void Skeleton::Impl::split_large(const SkeletonOptions& options) {
  const std::uint64_t above = options.split_above;
  if (above == 0) return;
  const std::vector<std::string>& keep_whole = options.keep_whole;
  // The most bytes of a part of weight `name`: split_part, or split_above for coarse_parts.
  const std::uint64_t fine = options.split_part == 0 || options.split_part > above ? above : options.split_part;
  auto part_of_weight = [&](const std::string& name) {
    const auto& c = options.coarse_parts;
    return std::find(c.begin(), c.end(), name) != c.end() ? above : fine;
  };
  auto is_none = [](Value* v) { return v->type()->kind() == c10::TypeKind::NoneType; };
  std::vector<char> replaced(slots.size(), 0);
  std::vector<Node*> todo;
  for (Node* n : graph->block()->nodes()) {
    const bool conv = n->kind() == c10::aten::conv1d || n->kind() == c10::aten::conv2d || n->kind() == c10::aten::conv3d;
    if (!conv && n->kind() != c10::aten::linear) continue;
    if (n->inputs().size() < 3 || n->outputs().size() != 1) continue;
    auto w = slot_of_input.find(n->input(1));
    if (w == slot_of_input.end() || n->input(1)->uses().size() != 1) continue;
    const SlotInfo& W = slots[w->second];
    const at::Tensor& wt = bound[w->second];
    if (static_cast<std::uint64_t>(W.bytes) <= above || W.sizes.size() < 2 || !wt.is_contiguous() ||
        !at::isFloatingType(W.dtype) || std::find(keep_whole.begin(), keep_whole.end(), W.name) != keep_whole.end()) {
      continue;
    }
    if (conv) {
      if (n->inputs().size() != 7) continue;
      const auto groups = jit::constant_as<std::int64_t>(n->input(6));
      if (!groups || *groups != 1) continue;
    }
    Value* bias = n->input(2);
    if (!is_none(bias)) {
      auto b = slot_of_input.find(bias);
      if (b == slot_of_input.end() || bias->uses().size() != 1 || slots[b->second].sizes != std::vector<std::int64_t>{W.sizes[0]} ||
          !bound[b->second].is_contiguous()) {
        continue;
      }
    }
    const std::int64_t rows = W.sizes[0];
    if (rows_per_part(W, part_of_weight(W.name)) >= rows) continue;
    todo.push_back(n);
  }
  for (Node* n : todo) {
    const bool conv = n->kind() != c10::aten::linear;
    Value* w_in = n->input(1);
    Value* b_in = n->input(2);
    const int w = slot_of_input.at(w_in);
    const int b = is_none(b_in) ? -1 : slot_of_input.at(b_in);
    const std::int64_t rows = slots[w].sizes[0], per = rows_per_part(slots[w], part_of_weight(slots[w].name));
    jit::WithInsertPoint guard(n);
    std::vector<Value*> parts;
    // A view of rows [a, a + len) of slot s as a new slot read by a new graph input.
    auto part_of = [&](int s, std::int64_t a, std::int64_t len, Value* like) {
      SlotInfo p = slots[s];
      p.name = slots[s].name + "[" + std::to_string(a) + ":" + std::to_string(a + len) + "]";
      p.sizes[0] = len;
      p.bytes = slots[s].bytes / rows * len;
      p.layer = -1;
      p.used_by.clear();
      const at::Tensor view = bound[s].narrow(0, a, len);
      slots.push_back(std::move(p));
      bound.push_back(view);
      Value* in = graph->addInput(slots.back().name)->setType(like->type());
      input_of_slot.push_back(in);
      slot_of_input[in] = static_cast<int>(slots.size()) - 1;
      replaced.push_back(0);
      return in;
    };
    for (std::int64_t a = 0; a < rows; a += per) {
      const std::int64_t len = std::min(per, rows - a);
      Value* wp = part_of(w, a, len, w_in);
      Value* bp = b >= 0 ? part_of(b, a, len, b_in) : b_in;
      Node* c = graph->createClone(n, [&](Value* v) { return v == w_in ? wp : v == b_in ? bp : v; });
      graph->insertNode(c);
      parts.push_back(c->output());
      ++split_parts;
    }
    Node* list = graph->insertNode(graph->createList(c10::TensorType::get(), parts));
    // The output channels: before the spatial dimensions (counted from the end, so that an
    // unbatched input, whose channels come first, joins right too), or the last for linear.
    const std::int64_t spatial = n->kind() == c10::aten::conv1d ? 1 : n->kind() == c10::aten::conv2d ? 2 : 3;
    Value* dim = graph->insertConstant(conv ? -(spatial + 1) : std::int64_t{-1});
    Value* joined = graph->insert(c10::aten::cat, {list->output(), dim});
    joined->setType(n->output()->type());
    n->output()->replaceAllUsesWith(joined);
    n->destroy();
    split_weights.push_back(slots[w].name);
    replaced[w] = 1;
    if (b >= 0) replaced[b] = 1;
    const int parts_made = static_cast<int>(parts.size());
    split_added += (b >= 0 ? 2 : 1) * (parts_made - 1);
  }
  if (todo.empty()) return;
  // The parameters split are no slots any more (their parts are): every byte in exactly one.
  std::vector<int> keep;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!replaced[i]) {
      keep.push_back(static_cast<int>(i));
      continue;
    }
    for (size_t k = 0; k < graph->inputs().size(); ++k) {
      if (graph->inputs()[k] == input_of_slot[i]) {
        graph->eraseInput(k);
        break;
      }
    }
  }
  reorder_slots(keep);
}

// Slot i becomes old slot order[i] (slots not in `order` are dropped): the slot table, the bound
// tensors and the graph inputs move together.
void Skeleton::Impl::reorder_slots(const std::vector<int>& order) {
  std::vector<SlotInfo> s2;
  std::vector<at::Tensor> b2;
  std::vector<Value*> in2;
  for (int old : order) {
    s2.push_back(std::move(slots[old]));
    b2.push_back(std::move(bound[old]));
    in2.push_back(input_of_slot[old]);
  }
  slots = std::move(s2);
  bound = std::move(b2);
  input_of_slot = std::move(in2);
  slot_of_input.clear();
  for (size_t i = 0; i < input_of_slot.size(); ++i) {
    if (input_of_slot[i] != nullptr) slot_of_input[input_of_slot[i]] = static_cast<int>(i);
  }
}

void Skeleton::Impl::cut() {
  // Which slots each top-level node reads, nested blocks included.
  auto slots_read = [&](Node* top) {
    std::set<int> out;
    auto visit = [&](Node* n) {
      for (Value* v : n->inputs()) {
        auto s = slot_of_input.find(v);
        if (s != slot_of_input.end()) out.insert(s->second);
      }
    };
    visit(top);
    for (jit::Block* b : top->blocks()) for_each_node(b, visit);
    return out;
  };
  auto produces_tensor = [](Node* n) {
    for (Value* o : n->outputs()) {
      if (contains_tensor(o->type())) return true;
    }
    return false;
  };

  std::vector<std::vector<Node*>> groups(1);
  std::vector<bool> group_weighted(1, false);
  for (Node* n : graph->block()->nodes()) {
    if (n->kind() == c10::prim::Constant) continue;
    bool weighted = !slots_read(n).empty();
    if (weighted && group_weighted.back()) {
      std::vector<Node*>& cur = groups.back();
      std::vector<Node*> moved;
      while (!cur.empty() && slots_read(cur.back()).empty() && !produces_tensor(cur.back())) {
        moved.insert(moved.begin(), cur.back());
        cur.pop_back();
      }
      groups.push_back(std::move(moved));
      group_weighted.push_back(false);
    }
    groups.back().push_back(n);
    if (weighted) group_weighted.back() = true;
  }
  if (groups.back().empty() && groups.size() > 1) groups.pop_back();

  layers.resize(groups.size());
  compiled.resize(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    LayerInfo& L = layers[k];
    L.index = static_cast<int>(k);
    compiled[k].nodes = groups[k];
    std::set<int> used;
    for (Node* n : groups[k]) {
      L.ops.push_back(n->kind().toQualString());
      for (int s : slots_read(n)) used.insert(s);
    }
    L.used_slots.assign(used.begin(), used.end());
    for (int s : used) {
      slots[s].used_by.push_back(static_cast<int>(k));
      if (slots[s].layer < 0) slots[s].layer = static_cast<int>(k);
    }
  }
  // Slots no layer reads belong with their closest sibling by name (Note [Layered skeleton] 4).
  for (auto& s : slots) {
    if (s.layer >= 0) continue;
    size_t best = 0;
    int best_layer = 0;
    bool found = false;
    for (const auto& o : slots) {
      if (o.used_by.empty()) continue;
      size_t c = shared_components(s.name, o.name);
      if (!found || c > best) { best = c; best_layer = o.layer; found = true; }
    }
    s.layer = best_layer;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    LayerInfo& L = layers[slots[i].layer];
    L.slots.push_back(static_cast<int>(i));
    L.bytes += slots[i].bytes;
    L.tensors += 1;
  }
  for (auto& L : layers) {
    std::vector<std::string> names;
    for (int s : L.slots.empty() ? L.used_slots : L.slots) names.push_back(slots[s].name);
    // A part of a split layer (Note [Splitting large layers]): its rows follow the module's name.
    std::string rows;
    if (!names.empty() && !names[0].empty() && names[0].back() == ']') {
      rows = names[0].substr(names[0].rfind('['));
      for (auto& n : names) {
        if (n.size() < rows.size() || n.compare(n.size() - rows.size(), rows.size(), rows) != 0) {
          rows.clear();
          break;
        }
      }
    }
    std::string prefix = common_module_prefix(names);
    if (prefix.empty() && !names.empty()) prefix = names.front().substr(0, names.front().size() - rows.size());
    if (prefix.empty()) prefix = L.ops.empty() ? "(empty)" : L.ops.front();
    L.name = prefix + rows;
  }
}

// Orders slots by owning layer (stable), so slot i is tensor i of the swap image and every
// layer's slots are one consecutive run: the image's tensor table is the slot table.
void Skeleton::Impl::renumber_slots() {
  std::vector<int> order(slots.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return slots[a].layer < slots[b].layer; });
  std::vector<int> new_index(slots.size());
  for (size_t i = 0; i < order.size(); ++i) new_index[order[i]] = static_cast<int>(i);
  reorder_slots(order);
  for (auto& L : layers) {
    for (int& x : L.slots) x = new_index[x];
    for (int& x : L.used_slots) x = new_index[x];
    std::sort(L.slots.begin(), L.slots.end());
    std::sort(L.used_slots.begin(), L.used_slots.end());
  }
}

// The weightless skeleton stored in a swap image: a TorchScript module without state whose
// forward(self, inputs..., slot_0, ..., slot_n-1) is the lifted graph. Kilobytes.
std::string Skeleton::Impl::serialize() const {
  auto cu = std::make_shared<jit::CompilationUnit>();
  jit::Module sm(c10::QualifiedName("__torch__.swapnet.Skeleton"), cu);
  auto g = std::make_shared<jit::Graph>();
  g->addInput("self")->setType(sm.type());
  std::unordered_map<Value*, Value*> env;
  for (int i = 0; i < num_inputs; ++i) env[graph->inputs()[i]] = g->addInput()->copyMetadata(graph->inputs()[i]);
  for (size_t s = 0; s < slots.size(); ++s) {
    Value* in = g->addInput("slot" + std::to_string(s))->setType(c10::TensorType::get());
    if (input_of_slot[s] != nullptr) env[input_of_slot[s]] = in;
  }
  auto map = [&](Value* v) -> Value* {
    auto it = env.find(v);
    if (it == env.end()) refuse("internal: skeleton export misses %" + v->debugName());
    return it->second;
  };
  for (Node* n : graph->nodes()) {
    Node* c = g->insertNode(g->createClone(n, map));
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = c->output(i);
  }
  for (Value* o : graph->outputs()) g->registerOutput(map(o));
  jit::Function* fn = cu->create_function(c10::QualifiedName(*sm.type()->name(), "forward"), g);
  sm.type()->addMethod(fn);
  std::ostringstream os;
  sm.save(os);
  return os.str();
}

void Skeleton::Impl::assign_ids() {
  // The top-level node that contains `v`'s definition, or nullptr for graph inputs.
  std::unordered_map<Node*, int> layer_of;
  for (size_t k = 0; k < compiled.size(); ++k) {
    for (Node* n : compiled[k].nodes) layer_of[n] = static_cast<int>(k);
  }
  auto top_node = [&](Value* v) -> Node* {
    Node* n = v->node();
    if (n == graph->param_node()) return nullptr;
    while (n->owningBlock() != graph->block()) n = n->owningBlock()->owningNode();
    return n;
  };
  std::unordered_map<Value*, int> id_of;
  auto id = [&](Value* v) {
    auto [it, inserted] = id_of.emplace(v, static_cast<int>(id_value.size()));
    if (inserted) id_value.push_back(v);
    return it->second;
  };
  for (int i = 0; i < num_inputs; ++i) user_input_ids.push_back(id(graph->inputs()[i]));

  std::vector<int> last_use;  // by id
  std::vector<std::vector<int>> outs(compiled.size());
  for (size_t k = 0; k < compiled.size(); ++k) {
    std::vector<int>& ins = compiled[k].in_ids;
    std::unordered_set<Node*> mine(compiled[k].nodes.begin(), compiled[k].nodes.end());
    auto visit = [&](Node* n) {
      for (Value* v : n->inputs()) {
        if (slot_of_input.count(v)) continue;
        Node* def = top_node(v);
        if (def != nullptr && (mine.count(def) || def->kind() == c10::prim::Constant)) continue;
        if (def != nullptr && !layer_of.count(def)) refuse("internal: value %" + v->debugName() + " has no layer");
        int i = id(v);
        if (std::find(ins.begin(), ins.end(), i) == ins.end()) ins.push_back(i);
        if (def != nullptr) {
          auto& o = outs[layer_of[def]];
          if (std::find(o.begin(), o.end(), i) == o.end()) o.push_back(i);
        }
        if (last_use.size() <= static_cast<size_t>(i)) last_use.resize(i + 1, -1);
        last_use[i] = std::max(last_use[i], static_cast<int>(k));
      }
    };
    for (Node* n : compiled[k].nodes) {
      visit(n);
      for (jit::Block* b : n->blocks()) for_each_node(b, visit);
    }
  }
  const int end = static_cast<int>(compiled.size());
  for (Value* v : graph->outputs()) {
    Node* def = top_node(v);
    if (def != nullptr && def->kind() == c10::prim::Constant) {
      output_ids.push_back(-1);
      output_consts.push_back(*jit::toIValue(v));
      continue;
    }
    int i = id(v);
    output_ids.push_back(i);
    output_consts.emplace_back();
    if (def != nullptr) {
      auto& o = outs[layer_of[def]];
      if (std::find(o.begin(), o.end(), i) == o.end()) o.push_back(i);
    }
    if (last_use.size() <= static_cast<size_t>(i)) last_use.resize(i + 1, -1);
    last_use[i] = end;
  }
  last_use.resize(id_value.size(), -1);
  std::vector<int> def_layer(id_value.size(), -1);
  for (size_t k = 0; k < compiled.size(); ++k) {
    for (int i : outs[k]) def_layer[i] = static_cast<int>(k);
  }
  for (size_t k = 0; k < compiled.size(); ++k) {
    compiled[k].out_ids = outs[k];
    for (int i : compiled[k].in_ids) compiled[k].in_last_use.push_back(last_use[i] == static_cast<int>(k));
    for (size_t i = 0; i < id_value.size(); ++i) {
      if (def_layer[i] < static_cast<int>(k) && last_use[i] >= static_cast<int>(k)) {
        layers[k].live_in.push_back(id_value[i]->debugName() + ": " + id_value[i]->type()->annotation_str());
      }
    }
  }
}

std::shared_ptr<jit::Graph> Skeleton::Impl::layer_graph(int k, bool all_values) const {
  const CompiledLayer& c = compiled[k];
  auto g = std::make_shared<jit::Graph>();
  std::unordered_map<Value*, Value*> env;
  for (int i : c.in_ids) env[id_value[i]] = g->addInput()->copyMetadata(id_value[i]);
  for (int s : layers[k].used_slots) env[input_of_slot[s]] = g->addInput()->copyMetadata(input_of_slot[s]);
  std::function<Value*(Value*)> map = [&](Value* v) -> Value* {
    auto it = env.find(v);
    if (it != env.end()) return it->second;
    if (v->node()->kind() == c10::prim::Constant && v->node()->owningBlock() == graph->block()) {
      Value* cv = g->insertNode(g->createClone(v->node(), map))->output();
      env[v] = cv;
      return cv;
    }
    refuse("internal: layer " + std::to_string(k) + " reads %" + v->debugName() + " (defined by " +
           v->node()->kind().toQualString() + ") which it does not receive");
  };
  for (Node* n : c.nodes) {
    Node* copy = g->insertNode(g->createClone(n, map));
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = copy->output(i);
  }
  for (int i : c.out_ids) g->registerOutput(env.at(id_value[i]));
  if (all_values) {
    // Profiling variant: every node's outputs too, so shapes of all intermediates are seen.
    std::vector<Value*> extra;
    for (Node* n : g->nodes()) {
      if (n->kind() == c10::prim::Constant) continue;
      for (Value* o : n->outputs()) extra.push_back(o);
    }
    for (Value* o : extra) g->registerOutput(o);
  }
  return g;
}

void Skeleton::Impl::compile() {
  for (size_t k = 0; k < compiled.size(); ++k) {
    compiled[k].graph = layer_graph(static_cast<int>(k), false);
    compiled[k].code = jit::Code(compiled[k].graph, "layer_" + std::to_string(k));
  }
}

// ---- construction --------------------------------------------------------------------------

Skeleton::Skeleton(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Skeleton::Skeleton(Skeleton&&) noexcept = default;
Skeleton& Skeleton::operator=(Skeleton&&) noexcept = default;
Skeleton::~Skeleton() = default;

Skeleton Skeleton::load(const std::string& path, torch::jit::Module* module, const SkeletonOptions& options) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  torch::jit::Module m;
  try {
    m = torch::jit::load(path);
  } catch (const c10::Error& e) {
    throw Error(path + ": not a TorchScript module file (torch::jit::load: " + detail::torch_message(e) + ")");
  }
  Skeleton sk = from_module(m, path, options);
  if (module != nullptr) *module = m;
  return sk;
}

Skeleton load_for_pack(const std::string& path, const std::vector<c10::IValue>& inputs, const SkeletonOptions& options,
                       torch::jit::Module* module) {
  torch::jit::Module m;
  Skeleton sk = Skeleton::load(path, &m, options);
  if (module != nullptr) *module = m;
  if (sk.split_layers() == 0) return sk;
  // Note [Splitting large layers]: the parts must give what forward gives, on this machine.
  c10::IValue expected;
  auto clones = [&] {
    std::vector<c10::IValue> v;
    for (const auto& x : inputs) v.push_back(x.isTensor() ? c10::IValue(x.toTensor().clone()) : x);
    return v;
  };
  {
    c10::InferenceMode guard;
    expected = m.forward(clones());
  }
  // Note [Splitting on the GPU]: where a GPU is usable, the parts must also give there what
  // forward gives there. cuDNN and cuBLAS choose kernels by the output channels too, and an
  // image packed on a machine with a GPU runs on either. The skeleton of the same options, its
  // slots copied to the GPU, against the module moved there (as direct GPU inference does).
  bool gpu = options.check_parts_on_gpu && at::hasCUDA() && cuda_device().usable;
  auto gpu_failed = [&](const std::exception& e) {
    log(LogLevel::kWarn, path + ": large layers in parts checked on the CPU only: the GPU check failed (" +
                             std::string(e.what()).substr(0, 300) + ")");
    gpu = false;
  };
  const c10::Device dev(c10::DeviceType::CUDA, 0);
  auto gpu_clones = [&] {
    std::vector<c10::IValue> v = clones();
    for (auto& x : v) {
      if (x.isTensor() && x.toTensor().defined()) x = x.toTensor().to(dev);
    }
    return v;
  };
  c10::IValue expected_gpu;
  if (gpu) {
    try {
      c10::InferenceMode guard;
      torch::jit::Module mg = m.clone();
      mg.to(dev);
      expected_gpu = mg.forward(gpu_clones());
      log(LogLevel::kInfo, path + ": large layers in parts checked on the CPU and on the GPU (" + cuda_device().name + ")");
    } catch (const std::exception& e) {
      gpu_failed(e);
    }
  }
  auto differs_on_gpu = [&](const SkeletonOptions& o) {
    try {
      Skeleton g = Skeleton::from_module(m, path, o);
      for (int i = 0; i < static_cast<int>(g.slots().size()); ++i) {
        if (g.slot(i).defined()) g.bind_slot(i, g.slot(i).to(dev));
      }
      return !compare_outputs(expected_gpu, g.forward(gpu_clones())).equal;
    } catch (const std::exception& e) {
      gpu_failed(e);
      return false;
    }
  };
  auto differs = [&](const Skeleton& s, const SkeletonOptions& o) {
    return !compare_outputs(expected, s.forward(clones())).equal || (gpu && differs_on_gpu(o));
  };
  if (!differs(sk, options)) return sk;
  SkeletonOptions none = options;
  none.split_above = 0;
  Skeleton whole_sk = Skeleton::from_module(m, path, none);
  // The layers differing from forward without any part (a forward that is not deterministic):
  // nothing to blame the parts for, and verify says what differs.
  if (differs(whole_sk, none)) return whole_sk;
  // One at a time, the others whole: a layer whose parts of split_part differ is tried in parts
  // of split_above (fewer output channels make oneDNN pick other kernels), and stays whole if
  // those differ too.
  const std::vector<std::string> split = sk.split_weights();
  const bool finer = options.split_part != 0 && options.split_part < options.split_above;
  SkeletonOptions keep = options;
  std::string coarse, whole;
  auto add = [](std::string& list, const std::string& name) { list += (list.empty() ? "" : ", ") + name; };
  for (const auto& name : split) {
    SkeletonOptions one = options;
    for (const auto& other : split) {
      if (other != name) one.keep_whole.push_back(other);
    }
    if (!differs(Skeleton::from_module(m, path, one), one)) continue;
    bool coarse_ok = false;
    if (finer) {
      one.coarse_parts.push_back(name);
      Skeleton c = Skeleton::from_module(m, path, one);
      coarse_ok = c.split_layers() > 0 && !differs(c, one);
    }
    if (coarse_ok) {
      keep.coarse_parts.push_back(name);
      add(coarse, name);
    } else {
      keep.keep_whole.push_back(name);
      add(whole, name);
    }
  }
  Skeleton kept = Skeleton::from_module(m, path, keep);
  if (kept.split_layers() > 0 && differs(kept, keep)) {
    log(LogLevel::kWarn, path + ": layers computed in parts along their output channels differ from forward on this "
                                "machine; packed without splitting any");
    return whole_sk;
  }
  if (!coarse.empty()) {
    log(LogLevel::kWarn, path + ": large layers differ from forward on this machine in parts of " +
                             format_bytes(options.split_part) + ", and are computed in parts of " +
                             format_bytes(options.split_above) + ": " + coarse);
  }
  if (!whole.empty()) {
    log(LogLevel::kWarn, path + ": " + std::to_string(split.size() - static_cast<size_t>(kept.split_layers())) + " of " +
                             std::to_string(split.size()) + " large layers differ from forward on this machine when "
                             "computed in parts, and stay whole: " + whole);
  }
  return kept;
}

Skeleton Skeleton::from_module(const torch::jit::Module& module, const std::string& origin,
                               const SkeletonOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  impl->methods = module._ivalue()->compilation_unit();
  torch::jit::Module m = module;  // a handle to the same module
  if (m.is_training()) {
    log(LogLevel::kWarn, origin + ": module is in training mode; swapnet runs inference in eval mode");
    m.eval();
  }
  try {
    impl->collect_slots(m);
    impl->lift(m);
    impl->split_large(options);
    impl->cut();
    impl->renumber_slots();
    impl->assign_ids();
    impl->compile();
  } catch (const c10::Error& e) {
    throw Error(origin + ": cannot build the layered skeleton: " + detail::torch_message(e));
  }
  log(LogLevel::kInfo, origin + ": " + std::to_string(impl->layers.size()) + " layers, " +
                           std::to_string(impl->slots.size()) + " slots, " + format_bytes(impl->total_bytes));
  return Skeleton(std::move(impl));
}

const std::string& Skeleton::origin() const { return impl_->origin; }
int Skeleton::num_inputs() const { return impl_->num_inputs; }
const std::vector<SlotInfo>& Skeleton::slots() const { return impl_->slots; }
const std::vector<LayerInfo>& Skeleton::layers() const { return impl_->layers; }
std::int64_t Skeleton::total_bytes() const { return impl_->total_bytes; }
int Skeleton::num_parameters() const { return impl_->num_parameters; }
int Skeleton::num_buffers() const { return impl_->num_buffers; }
const std::vector<std::string>& Skeleton::split_weights() const { return impl_->split_weights; }
int Skeleton::split_layers() const { return static_cast<int>(impl_->split_weights.size()); }
int Skeleton::split_parts() const { return impl_->split_parts; }
int Skeleton::split_tensors() const { return impl_->split_added; }

// ---- binding ----------------------------------------------------------------------------------

void Skeleton::bind_slot(int index, const at::Tensor& tensor) {
  if (index < 0 || index >= static_cast<int>(impl_->slots.size())) {
    throw Error(impl_->origin + ": slot " + std::to_string(index) + " out of range (0.." +
                std::to_string(impl_->slots.size()) + ")");
  }
  const SlotInfo& s = impl_->slots[index];
  if (!tensor.defined() || tensor.scalar_type() != s.dtype || tensor.sizes() != at::IntArrayRef(s.sizes)) {
    throw Error(impl_->origin + ": binding slot " + std::to_string(index) + " '" + s.name + "': expected " +
                c10::toString(s.dtype) + detail::shape_text(s.sizes) + ", got " +
                (tensor.defined() ? std::string(c10::toString(tensor.scalar_type())) + detail::shape_text(tensor.sizes())
                                  : std::string("an undefined tensor")));
  }
  impl_->bound[index] = tensor;
}

// ---- swap images -------------------------------------------------------------------------

void Skeleton::pack(const std::string& path, const PackOptions& options) const {
  const Impl& m = *impl_;
  ImageInfo info;
  info.source = m.origin;
  info.input_shapes = options.input_shapes;
  info.num_inputs = static_cast<std::uint32_t>(m.num_inputs);
  info.activation_bytes = options.activation_bytes;
  info.input_profiles = options.input_profiles;
  if (!options.layer_peak_bytes.empty() && options.layer_peak_bytes.size() != m.layers.size()) {
    m.refuse("internal: " + std::to_string(options.layer_peak_bytes.size()) + " layer activation peaks for " +
             std::to_string(m.layers.size()) + " layers");
  }
  std::uint32_t next = 0;
  for (const auto& L : m.layers) {
    ImageLayer il;
    il.name = L.name;
    for (const auto& op : L.ops) il.ops += (il.ops.empty() ? "" : ",") + op;
    il.first_tensor = next;
    il.num_tensors = static_cast<std::uint32_t>(L.slots.size());
    for (size_t i = 0; i < L.slots.size(); ++i) {
      if (L.slots[i] != static_cast<int>(next + i)) m.refuse("internal: layer " + std::to_string(L.index) + " slots not consecutive");
    }
    next += il.num_tensors;
    il.flops = L.flops;
    il.time_ms = L.time_ms;
    il.live_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(0, L.live_bytes));
    if (!options.layer_peak_bytes.empty()) il.peak_bytes = options.layer_peak_bytes[L.index];
    info.layers.push_back(std::move(il));
  }
  for (size_t i = 0; i < m.slots.size(); ++i) {
    const SlotInfo& sl = m.slots[i];
    const at::Tensor& t = m.bound[i];
    if (!t.defined() || !t.device().is_cpu()) {
      m.refuse("cannot pack slot " + std::to_string(i) + " '" + sl.name + "': " +
             (t.defined() ? "not in CPU memory" : "not bound"));
    }
    ImageTensor it;
    it.name = sl.name;
    it.kind = static_cast<std::uint8_t>(sl.kind);
    it.dtype = static_cast<std::uint8_t>(sl.dtype);
    it.element_size = static_cast<std::uint8_t>(c10::elementSize(sl.dtype));
    it.sizes = t.sizes().vec();
    it.strides = t.strides().vec();
    it.layer = static_cast<std::uint32_t>(sl.layer);
    info.tensors.push_back(std::move(it));
  }
  try {
    info.skeleton = m.serialize();
  } catch (const c10::Error& e) {
    m.refuse("cannot serialize the skeleton: " + detail::torch_message(e));
  }
  ImageWriteOptions wo;
  wo.progress = options.progress;
  write_image(path, std::move(info), [&](std::size_t s) -> const void* { return m.bound[s].data_ptr(); }, wo)
      .throw_if_error();
}

Skeleton Skeleton::from_image(const ImageInfo& info, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.origin = origin;
  torch::jit::Module sm;
  try {
    std::istringstream is(info.skeleton);
    sm = torch::jit::load(is);
  } catch (const std::exception& e) {
    throw Error(origin + ": the image's skeleton cannot be loaded: " + detail::torch_message(e));
  }
  m.methods = sm._ivalue()->compilation_unit();
  auto method = sm.find_method("forward");
  if (!method) throw Error(origin + ": the image's skeleton has no forward");
  m.graph = method->graph()->copy();
  jit::Inline(*m.graph);
  m.num_inputs = static_cast<int>(info.num_inputs);
  const size_t n = info.tensors.size();
  if (m.graph->inputs().size() != 1 + info.num_inputs + n || m.graph->inputs()[0]->hasUses()) {
    throw Error(origin + ": the image's skeleton takes " + std::to_string(m.graph->inputs().size()) +
                " inputs, its tables describe " + std::to_string(1 + info.num_inputs + n));
  }
  m.graph->eraseInput(0);
  m.input_of_slot.assign(n, nullptr);
  for (size_t s = 0; s < n; ++s) {
    const ImageTensor& t = info.tensors[s];
    if (t.dtype >= static_cast<std::uint8_t>(c10::ScalarType::NumOptions) ||
        c10::elementSize(static_cast<c10::ScalarType>(t.dtype)) != t.element_size) {
      throw Error(origin + ": tensor " + std::to_string(s) + " (" + t.name + ") has an unknown dtype code " +
                  std::to_string(t.dtype));
    }
    SlotInfo sl;
    sl.name = t.name;
    sl.kind = static_cast<SlotKind>(t.kind);
    sl.dtype = static_cast<c10::ScalarType>(t.dtype);
    sl.sizes = t.sizes;
    sl.strides = t.strides;
    std::int64_t numel = 1;
    for (auto d : t.sizes) numel *= d;
    sl.bytes = numel * t.element_size;
    m.total_bytes += sl.bytes;
    m.num_parameters += sl.kind == SlotKind::kParameter;
    m.num_buffers += sl.kind == SlotKind::kBuffer;
    m.slots.push_back(std::move(sl));
    m.bound.emplace_back();
    m.slot_offset.push_back(t.offset);
    Value* in = m.graph->inputs()[m.num_inputs + s];
    if (in->hasUses()) {
      m.input_of_slot[s] = in;
      m.slot_of_input[in] = static_cast<int>(s);
    }
  }
  try {
    m.cut();
    if (m.layers.size() != info.layers.size()) {
      throw Error(origin + ": the skeleton cuts into " + std::to_string(m.layers.size()) + " layers, the layer table has " +
                  std::to_string(info.layers.size()));
    }
    for (size_t s = 0; s < n; ++s) {
      if (m.slots[s].layer != static_cast<int>(info.tensors[s].layer)) {
        throw Error(origin + ": tensor " + std::to_string(s) + " (" + info.tensors[s].name + ") belongs to layer " +
                    std::to_string(info.tensors[s].layer) + " in the table but to layer " +
                    std::to_string(m.slots[s].layer) + " in the skeleton");
      }
    }
    m.renumber_slots();  // identity: the image is already in layer order
    m.assign_ids();
    m.compile();
  } catch (const c10::Error& e) {
    throw Error(origin + ": cannot build the layered skeleton: " + detail::torch_message(e));
  }
  for (size_t k = 0; k < m.layers.size(); ++k) {
    m.layers[k].flops = info.layers[k].flops;
    m.layers[k].time_ms = info.layers[k].time_ms;
    m.layers[k].live_bytes = static_cast<std::int64_t>(info.layers[k].live_bytes);
  }
  return Skeleton(std::move(impl));
}

void Skeleton::bind_layers(int first, int last, void* block, std::uint64_t block_offset, c10::Device device) {
  Impl& m = *impl_;
  if (m.slot_offset.empty() && !m.slots.empty()) refuse_binding(m.origin, "bind_layers needs a skeleton made by from_image");
  if (first < 0 || last < first || last >= static_cast<int>(m.layers.size())) {
    refuse_binding(m.origin, "layers [" + std::to_string(first) + ", " + std::to_string(last) + "] out of range (" +
                                 std::to_string(m.layers.size()) + " layers)");
  }
  for (int k = first; k <= last; ++k) {
    for (int s : m.layers[k].slots) {
      const SlotInfo& sl = m.slots[s];
      if (m.slot_offset[s] < block_offset) {
        refuse_binding(m.origin, "slot " + std::to_string(s) + " '" + sl.name + "' at offset " +
                                     std::to_string(m.slot_offset[s]) + " precedes the block at " +
                                     std::to_string(block_offset));
      }
      void* p = static_cast<char*>(block) + (m.slot_offset[s] - block_offset);
      m.bound[s] = at::for_blob(p, sl.sizes)
                       .strides(sl.strides)
                       .options(at::TensorOptions().dtype(sl.dtype).device(device))
                       .target_device(device)  // not asked of the pointer (CUDA hooks)
                       .make_tensor();
    }
  }
}

void Skeleton::unbind_layers(int first, int last) {
  Impl& m = *impl_;
  for (int k = std::max(first, 0); k <= last && k < static_cast<int>(m.layers.size()); ++k) {
    for (int s : m.layers[k].slots) m.bound[s] = at::Tensor();
  }
}

void Skeleton::unbind_slot(int index) { impl_->bound.at(index) = at::Tensor(); }
const at::Tensor& Skeleton::slot(int index) const { return impl_->bound.at(index); }

// ---- execution --------------------------------------------------------------------------------

struct Skeleton::Run::State {
  std::vector<c10::IValue> env;  // activation id -> value (None once dead)
  int next = 0;
};
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

c10::IValue Skeleton::profile(const std::vector<c10::IValue>& inputs, const ProfileOptions& options) {
  const int n = static_cast<int>(impl_->compiled.size());
  // One run of the profiling variant of each layer: every intermediate value is an output, so
  // FLOPs are computed from the shapes actually seen.
  {
    Run run = begin(inputs);
    for (int k = 0; k < n; ++k) {
      auto g = impl_->layer_graph(k, true);
      jit::Code code(g, "probe_" + std::to_string(k));
      const CompiledLayer& c = impl_->compiled[k];
      jit::Stack stack;
      for (int i : c.in_ids) stack.push_back(run.s_->env[i]);
      for (int s : impl_->layers[k].used_slots) stack.emplace_back(impl_->bound[s]);
      std::unordered_map<Value*, c10::IValue> vals;
      for (size_t i = 0; i < g->inputs().size(); ++i) vals[g->inputs()[i]] = stack[i];
      try {
        c10::InferenceMode guard;
        jit::InterpreterState(code).run(stack);
      } catch (const std::exception& e) {
        throw Error(impl_->origin + ": layer " + std::to_string(k) + " (" + impl_->layers[k].name +
                    ") failed: " + detail::torch_message(e));
      }
      size_t pos = c.out_ids.size();
      double flops = 0;
      for (Node* node : g->nodes()) {
        if (node->kind() == c10::prim::Constant) {
          vals[node->output()] = *jit::toIValue(node->output());
          continue;
        }
        std::vector<c10::IValue> in, out;
        for (Value* o : node->outputs()) vals[o] = stack[pos++];
        for (Value* v : node->inputs()) {
          auto it = vals.find(v);
          in.push_back(it == vals.end() ? c10::IValue() : it->second);
        }
        for (Value* o : node->outputs()) out.push_back(vals[o]);
        flops += detail::node_flops(node->kind().toQualString(), in, out);
      }
      impl_->layers[k].flops = flops;
      for (size_t i = 0; i < c.out_ids.size(); ++i) run.s_->env[c.out_ids[i]] = stack[i];
      for (size_t i = 0; i < c.in_ids.size(); ++i) {
        if (c.in_last_use[i]) run.s_->env[c.in_ids[i]] = c10::IValue();
      }
      run.s_->next = k + 1;
    }
  }
  // Timed runs through the real layer code.
  std::vector<std::vector<double>> times(n);
  c10::IValue out;
  for (int it = 0; it < options.warmup + options.iters; ++it) {
    Run run = begin(inputs);
    for (int k = 0; k < n; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      run_layer(run);
      auto t1 = std::chrono::steady_clock::now();
      if (it >= options.warmup) times[k].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (it == options.warmup + options.iters - 1) impl_->layers[k].live_bytes = run.live_bytes();
    }
    out = finish(run);
  }
  for (int k = 0; k < n; ++k) {
    auto& t = times[k];
    if (t.empty()) continue;
    std::sort(t.begin(), t.end());
    impl_->layers[k].time_ms = t[t.size() / 2];
  }
  return out;
}

std::uint64_t measure_activation_bytes(const Skeleton& sk, const std::vector<c10::IValue>& inputs,
                                       std::vector<std::uint64_t>* layer_peaks) {
  install_cpu_meter();
  // Note [Lending the activation reserve] (executor.cpp): the reserve becomes a zone that places
  // chunks from its end, best fit; fragmentation makes their extent exceed the bytes live at
  // once. So the forward runs under an account of its own whose region is a zone too large to
  // fill (address space only: pages are touched where chunks land), and the reserve (and each
  // layer's peak) is the most of the bytes live and of the extent plus the account's bytes
  // outside the zone (allocations too small to place): what the executor measures a layer's
  // reach by. Where the meter is not libtorch's allocator, or no account is left, the bytes
  // live alone.
  struct Scratch {
    int account = 0;
    std::uint64_t zone = 0;
    ~Scratch() {
      if (account == 0) return;
      set_cpu_account_cache(account, 0);  // the zone goes (its pages with its last chunk)
      detail::release_cpu_account(account);
    }
  } scratch;
  if (detail::cpu_meter_active()) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const std::uint64_t bytes = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * page : 0;
    scratch.account = bytes ? new_cpu_account() : 0;
    char* base = nullptr;
    if (scratch.account != 0) scratch.zone = detail::set_cpu_account_scratch_zone(scratch.account, bytes, &base);
  }
  auto zone_reach = [&] {  // since the last call: the extent reached plus the bytes outside
    if (scratch.zone == 0) return std::uint64_t{0};
    return detail::zone_reach(detail::cpu_zone_use(scratch.account, scratch.zone, true));
  };
  std::uint64_t peak = 0;
  {
    detail::AccountScope charge(scratch.account);
    reset_cpu_meter_peak();
    (void)zone_reach();
    const std::uint64_t base = cpu_meter().current;
    std::vector<c10::IValue> copies;
    for (const auto& v : inputs) copies.emplace_back(v.isTensor() ? c10::IValue(v.toTensor().clone()) : v);
    // Held to the end, as a caller holds the inputs it passes (the run would free them once used,
    // and the reserve then fell short by the input's bytes).
    const std::vector<c10::IValue> held = copies;
    Skeleton::Run run = sk.begin(std::move(copies));
    std::uint64_t live_peak = 0, zone_peak = 0;
    auto since = [&] {  // the peak since the last call
      const std::uint64_t p = cpu_meter().peak, live = p > base ? p - base : 0, zone = zone_reach();
      live_peak = std::max(live_peak, live);
      zone_peak = std::max(zone_peak, zone);
      return std::max(live, zone);
    };
    peak = since();
    const int L = static_cast<int>(sk.layers().size());
    if (layer_peaks) layer_peaks->assign(L, 0);
    for (int k = 0; k < L; ++k) {
      reset_cpu_meter_peak();
      sk.run_layer(run);
      const std::uint64_t p = since();
      peak = std::max(peak, p);
      if (layer_peaks) (*layer_peaks)[k] = p;
    }
    reset_cpu_meter_peak();
    c10::IValue out = sk.finish(run);
    peak = std::max(peak, since());
    log(LogLevel::kDebug, "activations: " + format_bytes(live_peak) + " live at most, " +
                              (scratch.zone ? format_bytes(zone_peak) + " as placed in a zone" : "no zone (meter not in use)"));
  }
  return peak;
}

}  // namespace swapnet
