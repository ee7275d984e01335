// FLOP rules, grouped by operator family. See flops.h for what is counted.
#include "flops.h"

#include <unordered_set>

namespace swapnet {
namespace detail {
namespace {

double numel(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().defined()) return static_cast<double>(v.toTensor().numel());
  return 0;
}

const at::Tensor* tensor(const std::vector<c10::IValue>& v, size_t i) {
  if (i < v.size() && v[i].isTensor() && v[i].toTensor().defined()) return &v[i].toTensor();
  return nullptr;
}

double out_numel(const std::vector<c10::IValue>& out) {
  double n = 0;
  for (const auto& o : out) n += numel(o);
  return n;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

}  // namespace

double node_flops(const std::string& kind, const std::vector<c10::IValue>& in,
                  const std::vector<c10::IValue>& out) {
  static const std::unordered_set<std::string> kFree = {
      "aten::view", "aten::reshape", "aten::flatten", "aten::squeeze", "aten::unsqueeze",
      "aten::transpose", "aten::permute", "aten::select", "aten::slice", "aten::expand",
      "aten::t", "aten::contiguous", "aten::size", "aten::dim", "aten::cat", "aten::stack",
      "aten::dropout", "aten::dropout_", "aten::feature_dropout", "aten::detach", "aten::to",
      "aten::chunk", "aten::split", "aten::split_with_sizes", "aten::unbind", "aten::__getitem__",
      "aten::narrow", "aten::clone", "aten::copy_", "aten::zeros", "aten::ones", "aten::empty",
      "aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::index", "aten::roll",
      "aten::pad", "aten::constant_pad_nd", "aten::repeat", "aten::expand_as", "aten::view_as",
      "aten::reshape_as", "aten::flip", "aten::gather", "aten::masked_fill", "aten::masked_fill_",
      "aten::arange", "aten::type_as", "aten::upsample_nearest2d", "aten::upsample_nearest1d",
      "aten::pixel_shuffle", "aten::channel_shuffle", "aten::identity"};
  const at::Tensor* x = tensor(in, 0);
  const at::Tensor* w = tensor(in, 1);
  if (!starts_with(kind, "aten::")) return 0;  // prim:: nodes move values around
  if (kFree.count(kind)) return 0;
  if (kind == "aten::_convolution" || starts_with(kind, "aten::conv")) {
    if (w == nullptr || w->dim() < 2) return 0;
    bool transposed = kind.find("transpose") != std::string::npos;
    if (kind == "aten::_convolution" && in.size() > 6 && in[6].isBool()) transposed = in[6].toBool();
    double per_out = static_cast<double>(w->numel()) / static_cast<double>(w->size(0));
    double bias = tensor(in, 2) ? out_numel(out) : 0;
    if (transposed) return 2.0 * numel(in[0]) * per_out + bias;
    return 2.0 * out_numel(out) * per_out + bias;
  }
  if (kind == "aten::linear") {
    if (x == nullptr || x->dim() == 0) return 0;
    return 2.0 * out_numel(out) * static_cast<double>(x->size(-1)) + (tensor(in, 2) ? out_numel(out) : 0);
  }
  if (kind == "aten::addmm" || kind == "aten::baddbmm") {
    const at::Tensor* a = tensor(in, 1);
    if (a == nullptr || a->dim() == 0) return 0;
    return 2.0 * out_numel(out) * static_cast<double>(a->size(-1)) + out_numel(out);
  }
  if (kind == "aten::mm" || kind == "aten::bmm" || kind == "aten::matmul" || kind == "aten::einsum") {
    if (kind == "aten::einsum") return 0;  // contraction sizes are not recoverable from outputs
    if (x == nullptr || x->dim() == 0) return 0;
    return 2.0 * out_numel(out) * static_cast<double>(x->size(-1));
  }
  if (kind == "aten::batch_norm" || kind == "aten::layer_norm" || kind == "aten::group_norm" ||
      kind == "aten::instance_norm") {
    return 4.0 * out_numel(out);  // subtract mean, divide, scale, shift
  }
  if (kind == "aten::softmax" || kind == "aten::log_softmax") return 3.0 * out_numel(out);
  if (kind.find("pool") != std::string::npos) return x ? static_cast<double>(x->numel()) : 0;
  if (kind == "aten::mean" || kind == "aten::sum") return x ? static_cast<double>(x->numel()) : 0;
  if (kind == "aten::scaled_dot_product_attention") return 0;
  return out_numel(out);  // elementwise: one per output element
}

}  // namespace detail
}  // namespace swapnet
