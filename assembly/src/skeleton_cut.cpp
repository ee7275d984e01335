// Cutting the lifted graph into layers (step 2 of Note [Layered skeleton] in skeleton_impl.h):
// groups of top-level nodes with at most one slot-reading node each, every slot owned by one
// layer (step 4), each layer named after the module its slots belong to; then the slots
// renumbered into layer order, as the swap image stores them.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "skeleton_impl.h"

namespace swapnet {

using detail::contains_tensor;
using detail::for_each_node;
using jit::Node;
using jit::Value;

namespace {

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


bool produces_tensor(Node* n) {
  for (Value* o : n->outputs()) {
    if (contains_tensor(o->type())) return true;
  }
  return false;
}

}  // namespace

void Skeleton::Impl::cut() {
  const std::vector<std::vector<Node*>> groups = group_nodes();
  make_layers(groups);
  // Slots no layer reads belong with their closest sibling by name (Note [Layered skeleton] 4).
  place_unread_slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    LayerInfo& L = layers[slots[i].layer];
    L.slots.push_back(static_cast<int>(i));
    L.bytes += slots[i].bytes;
    L.tensors += 1;
  }
  name_layers();
}

// Which slots a top-level node reads, nested blocks included.
std::set<int> Skeleton::Impl::slots_read(Node* top) const {
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
}

// The top-level nodes but constants, in order, in groups holding at most one slot-reading node;
// the slot-free nodes before it that make no tensor move into its group.
std::vector<std::vector<Node*>> Skeleton::Impl::group_nodes() const {
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
  return groups;
}

// One layer per group: its nodes and ops, the slots it reads, and the first reader of each slot.
void Skeleton::Impl::make_layers(const std::vector<std::vector<Node*>>& groups) {
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
}

void Skeleton::Impl::place_unread_slots() {
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
}

// A layer is named after the longest module prefix its slots share (its ops' first if none).
void Skeleton::Impl::name_layers() {
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

}  // namespace swapnet
