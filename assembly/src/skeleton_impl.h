// The layered skeleton splits any TorchScript module into layers whose weights are slots bound
// by reference, and runs those layers in order with outputs bit-identical to module.forward.
//
// This header holds its private state: Skeleton::Impl (the lifted graph, its slots and its
// compiled layers), the steps that build it, and what the skeleton_*.cpp files share. The
// steps, in the order from_module runs them: collect_slots and lift (skeleton_lift.cpp),
// split_large (skeleton_split.cpp), cut and renumber_slots (skeleton_cut.cpp), assign_ids and
// compile (skeleton_compile.cpp).
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
#pragma once

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "swapnet/assembly.h"

namespace swapnet {

namespace jit = torch::jit;

namespace detail {

// A layer compiled to its own graph (step 3 of Note [Layered skeleton]).
struct CompiledLayer {
  std::vector<jit::Node*> nodes;  // its nodes in the lifted whole-model graph
  std::vector<int> in_ids;        // activation ids pushed first, in graph-input order
  std::vector<bool> in_last_use;  // in_ids[i] is not used after this layer: moved, not copied
  std::vector<int> out_ids;       // activation ids its outputs are stored to
  std::shared_ptr<jit::Graph> graph;
  jit::Code code;
};

inline bool contains_tensor(const c10::TypePtr& t) {
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
inline void for_each_node(jit::Block* b, const std::function<void(jit::Node*)>& fn) {
  for (jit::Node* n : b->nodes()) {
    fn(n);
    for (jit::Block* sub : n->blocks()) for_each_node(sub, fn);
  }
  fn(b->return_node());
}

}  // namespace detail

struct Skeleton::Impl {
  std::string origin;
  // Inlined nodes keep call stacks that point into the module's compiled methods (used when an
  // error is formatted), so the compilation unit must outlive the layer graphs. It holds code,
  // not weights.
  std::shared_ptr<jit::CompilationUnit> methods;
  int num_inputs = 0;
  std::shared_ptr<jit::Graph> graph;  // lifted: user inputs, then one input per used slot
  std::unordered_map<jit::Value*, int> slot_of_input;
  std::vector<jit::Value*> input_of_slot;  // slot -> graph input (nullptr if never read)
  std::vector<SlotInfo> slots;
  std::vector<at::Tensor> bound;
  std::vector<LayerInfo> layers;
  std::vector<detail::CompiledLayer> compiled;
  std::vector<jit::Value*> id_value;        // activation id -> value in `graph`
  std::vector<int> user_input_ids;          // forward input i -> activation id
  std::vector<int> output_ids;              // graph output i -> id, or -1 for a constant
  std::vector<c10::IValue> output_consts;
  std::int64_t total_bytes = 0;
  int num_parameters = 0, num_buffers = 0;

  std::vector<std::uint64_t> slot_offset;  // file offset of each slot (from_image skeletons)
  int split_parts = 0;                      // Note [Splitting large layers]
  int split_added = 0;                      // slots added by splitting (parts less the tensors split)
  std::vector<std::string> split_weights;   // the weights of the layers split

  using SlotByImpl = std::unordered_map<const c10::TensorImpl*, int>;

  // Lift (skeleton_lift.cpp).
  void collect_slots(const jit::Module& m);
  void lift(const jit::Module& m);
  void lift_attributes(const jit::Module& m, const SlotByImpl& slot_by_impl);
  void lift_tensor_list(jit::Node* n, const c10::IValue& v, const std::string& path, const SlotByImpl& slot_by_impl);
  jit::Value* slot_input(int s, const c10::TypePtr& type);
  void refuse_slot_writes() const;
  void drop_unread_slots();
  // Split (skeleton_split.cpp).
  void split_large(const SkeletonOptions& options);
  bool splittable(jit::Node* n, const SkeletonOptions& options) const;
  void split_node(jit::Node* n, const SkeletonOptions& options, std::vector<char>& replaced);
  jit::Value* part_slot(int s, std::int64_t a, std::int64_t len, std::int64_t rows, jit::Value* like,
                        std::vector<char>& replaced);
  void drop_split_slots(const std::vector<char>& replaced);
  void reorder_slots(const std::vector<int>& order);
  // Cut (skeleton_cut.cpp).
  void cut();
  std::set<int> slots_read(jit::Node* top) const;
  std::vector<std::vector<jit::Node*>> group_nodes() const;
  void make_layers(const std::vector<std::vector<jit::Node*>>& groups);
  void place_unread_slots();
  void name_layers();
  void renumber_slots();
  // Compile (skeleton_compile.cpp).
  void assign_ids();
  std::shared_ptr<jit::Graph> layer_graph(int k, bool all_values) const;
  void compile();
  // The swap image's skeleton (skeleton_image.cpp).
  std::string serialize() const;

  [[noreturn]] void refuse(const std::string& what) const {
    throw Error(origin + ": " + what);
  }
};

// Execution state of one forward (skeleton_run.cpp; profile reads it too).
struct Skeleton::Run::State {
  std::vector<c10::IValue> env;  // activation id -> value (None once dead)
  int next = 0;
};

}  // namespace swapnet
