// Splitting large layers along their output channels, between lifting and cutting: a
// convolution or linear whose weight is larger than SkeletonOptions::split_above becomes parts
// over views of its weight's rows, joined by aten::cat; the slot table follows.
//
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
#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <string>
#include <vector>

#include "skeleton_impl.h"

namespace swapnet {

using jit::Node;
using jit::Value;

namespace {

// Rows of a split weight per part: whole multiples of 64 (the last part takes what is left), at
// most `above` bytes unless 64 rows are more.
std::int64_t rows_per_part(const SlotInfo& w, std::uint64_t above) {
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(1, w.bytes / w.sizes[0]));
  const std::uint64_t rows = above / row_bytes / 64 * 64;
  return static_cast<std::int64_t>(std::max<std::uint64_t>(64, std::min<std::uint64_t>(rows, static_cast<std::uint64_t>(w.sizes[0]))));
}

// The most bytes of a part of weight `name`: split_part, or split_above for coarse_parts.
std::uint64_t part_bytes(const SkeletonOptions& options, const std::string& name) {
  const std::uint64_t above = options.split_above;
  const std::uint64_t fine = options.split_part == 0 || options.split_part > above ? above : options.split_part;
  const auto& c = options.coarse_parts;
  return std::find(c.begin(), c.end(), name) != c.end() ? above : fine;
}

bool is_none(Value* v) { return v->type()->kind() == c10::TypeKind::NoneType; }

}  // namespace

void Skeleton::Impl::split_large(const SkeletonOptions& options) {
  const std::uint64_t above = options.split_above;
  if (above == 0) return;
  std::vector<char> replaced(slots.size(), 0);
  std::vector<Node*> todo;
  for (Node* n : graph->block()->nodes()) {
    if (splittable(n, options)) todo.push_back(n);
  }
  for (Node* n : todo) split_node(n, options, replaced);
  if (todo.empty()) return;
  drop_split_slots(replaced);
}

// A conv (groups 1) or linear whose weight, read by it alone, is over split_above bytes and
// would be more than one part; its bias (if any) a slot of its own as well.
bool Skeleton::Impl::splittable(Node* n, const SkeletonOptions& options) const {
  const std::uint64_t above = options.split_above;
  const std::vector<std::string>& keep_whole = options.keep_whole;
  const bool conv = n->kind() == c10::aten::conv1d || n->kind() == c10::aten::conv2d || n->kind() == c10::aten::conv3d;
  if (!conv && n->kind() != c10::aten::linear) return false;
  if (n->inputs().size() < 3 || n->outputs().size() != 1) return false;
  auto w = slot_of_input.find(n->input(1));
  if (w == slot_of_input.end() || n->input(1)->uses().size() != 1) return false;
  const SlotInfo& W = slots[w->second];
  const at::Tensor& wt = bound[w->second];
  if (static_cast<std::uint64_t>(W.bytes) <= above || W.sizes.size() < 2 || !wt.is_contiguous() ||
      !at::isFloatingType(W.dtype) || std::find(keep_whole.begin(), keep_whole.end(), W.name) != keep_whole.end()) {
    return false;
  }
  if (conv) {
    if (n->inputs().size() != 7) return false;
    const auto groups = jit::constant_as<std::int64_t>(n->input(6));
    if (!groups || *groups != 1) return false;
  }
  Value* bias = n->input(2);
  if (!is_none(bias)) {
    auto b = slot_of_input.find(bias);
    if (b == slot_of_input.end() || bias->uses().size() != 1 || slots[b->second].sizes != std::vector<std::int64_t>{W.sizes[0]} ||
        !bound[b->second].is_contiguous()) {
      return false;
    }
  }
  const std::int64_t rows = W.sizes[0];
  return rows_per_part(W, part_bytes(options, W.name)) < rows;
}

// Replaces node `n` by its parts and their aten::cat; marks the slots split in `replaced`.
void Skeleton::Impl::split_node(Node* n, const SkeletonOptions& options, std::vector<char>& replaced) {
  const bool conv = n->kind() != c10::aten::linear;
  Value* w_in = n->input(1);
  Value* b_in = n->input(2);
  const int w = slot_of_input.at(w_in);
  const int b = is_none(b_in) ? -1 : slot_of_input.at(b_in);
  const std::int64_t rows = slots[w].sizes[0], per = rows_per_part(slots[w], part_bytes(options, slots[w].name));
  jit::WithInsertPoint guard(n);
  std::vector<Value*> parts;
  for (std::int64_t a = 0; a < rows; a += per) {
    const std::int64_t len = std::min(per, rows - a);
    Value* wp = part_slot(w, a, len, rows, w_in, replaced);
    Value* bp = b >= 0 ? part_slot(b, a, len, rows, b_in, replaced) : b_in;
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

// A view of rows [a, a + len) of slot s (of `rows` rows) as a new slot read by a new graph input.
Value* Skeleton::Impl::part_slot(int s, std::int64_t a, std::int64_t len, std::int64_t rows, Value* like,
                                 std::vector<char>& replaced) {
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
}

// The parameters split are no slots any more (their parts are): every byte in exactly one.
void Skeleton::Impl::drop_split_slots(const std::vector<char>& replaced) {
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

}  // namespace swapnet
