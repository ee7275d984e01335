// Bit-for-bit comparison of two forward outputs (tensors, tuples, lists, dicts, scalars), and
// input-shape parsing shared by the CLI and tests.
#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "swapnet/assembly.h"
#include "text.h"

namespace swapnet {
namespace {

void compare(const c10::IValue& a, const c10::IValue& b, const std::string& where, Comparison& r) {
  auto differ = [&](const std::string& what) {
    if (r.difference.empty()) r.difference = where + ": " + what;
    r.equal = false;
  };
  auto structural = [&](const std::string& what) {
    differ(what);
    r.max_abs_diff = std::numeric_limits<double>::infinity();
  };
  if (a.tagKind() != b.tagKind()) return structural(a.tagKind() + " vs " + b.tagKind());
  if (a.isTensor()) {
    const at::Tensor& x = a.toTensor();
    const at::Tensor& y = b.toTensor();
    if (x.defined() != y.defined()) return structural("defined vs undefined tensor");
    if (!x.defined()) return;
    if (x.scalar_type() != y.scalar_type()) {
      return structural(std::string("dtype ") + c10::toString(x.scalar_type()) + " vs " + c10::toString(y.scalar_type()));
    }
    if (x.sizes() != y.sizes()) return structural("shape " + detail::shape_text(x.sizes()) + " vs " + detail::shape_text(y.sizes()));
    at::Tensor xc = x.cpu().contiguous();
    at::Tensor yc = y.cpu().contiguous();
    const size_t bytes = static_cast<size_t>(xc.numel()) * xc.element_size();
    if (bytes != 0 && std::memcmp(xc.data_ptr(), yc.data_ptr(), bytes) != 0) {
      differ("values differ");
      if (at::isFloatingType(xc.scalar_type()) || at::isIntegralType(xc.scalar_type(), true)) {
        double d = (xc.to(at::kDouble) - yc.to(at::kDouble)).abs().max().item<double>();
        if (std::isnan(d) || d == 0) d = std::max(r.max_abs_diff, d == 0 ? 0.0 : d);  // NaN payloads, -0.0
        r.max_abs_diff = std::max(r.max_abs_diff, d);
      }
    }
    return;
  }
  if (a.isTuple() || a.isList()) {
    std::vector<c10::IValue> xs, ys;
    if (a.isTuple()) {
      xs = a.toTupleRef().elements().vec();
      ys = b.toTupleRef().elements().vec();
    } else {
      xs = a.toListRef().vec();
      ys = b.toListRef().vec();
    }
    if (xs.size() != ys.size()) {
      return structural(std::to_string(xs.size()) + " vs " + std::to_string(ys.size()) + " elements");
    }
    for (size_t i = 0; i < xs.size(); ++i) compare(xs[i], ys[i], where + "[" + std::to_string(i) + "]", r);
    return;
  }
  if (a.isGenericDict()) {
    auto x = a.toGenericDict();
    auto y = b.toGenericDict();
    if (x.size() != y.size()) return structural(std::to_string(x.size()) + " vs " + std::to_string(y.size()) + " keys");
    for (const auto& kv : x) {
      auto it = y.find(kv.key());
      std::string key = kv.key().isString() ? "'" + kv.key().toStringRef() + "'" : kv.key().tagKind();
      if (it == y.end()) return structural("key " + key + " missing");
      compare(kv.value(), it->value(), where + "[" + key + "]", r);
    }
    return;
  }
  if (a.isDouble() || a.isInt() || a.isBool() || a.isString() || a.isNone()) {
    if (!(a == b)) structural("scalar values differ");
    return;
  }
  structural("cannot compare values of kind " + a.tagKind());
}

}  // namespace

Comparison compare_outputs(const c10::IValue& expected, const c10::IValue& actual) {
  Comparison r;
  r.equal = true;
  compare(expected, actual, "output", r);
  return r;
}

std::vector<std::int64_t> parse_shape(const std::string& text) {
  std::vector<std::int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string part = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || end == nullptr || *end != '\0' || v < 0 || v > (1LL << 40)) {
      throw Error("input shape '" + text + "': '" + part + "' is not a non-negative integer (expected e.g. 1,3,224,224)");
    }
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace swapnet
