// Binding slots by reference: a slot is an at::Tensor handle pointed at other memory (a caller's
// tensor, or a view of a fetched block of a swap image) without copying; unbinding drops it.
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <string>

#include "skeleton_impl.h"
#include "text.h"

namespace swapnet {

namespace {

[[noreturn]] void refuse_binding(const std::string& origin, const std::string& what) {
  throw Error(origin + ": " + what);
}

}  // namespace

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

}  // namespace swapnet
