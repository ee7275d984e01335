// The skeleton in a swap image: pack() writes the weightless skeleton (serialize), the layer
// and tensor tables and the bound tensors' bytes; from_image() rebuilds the layered skeleton
// from those tables, its slots unbound until bind_layers() points them into fetched blocks.
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>

#include "skeleton_impl.h"
#include "text.h"

namespace swapnet {

using jit::Node;
using jit::Value;

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

}  // namespace swapnet
