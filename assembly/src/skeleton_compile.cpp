// Compiling each layer into its own graph (step 3 of Note [Layered skeleton] in
// skeleton_impl.h): activation ids for the values crossing layer boundaries, each value's last
// use, and per layer a graph whose inputs are its activations then its slots.
#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "skeleton_impl.h"

namespace swapnet {

using detail::CompiledLayer;
using detail::for_each_node;
using jit::Node;
using jit::Value;

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

}  // namespace swapnet
