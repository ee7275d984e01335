// Prefix sums over a layer table: the bytes, tensors and compute of any run of layers, and the
// paper's costs of reading, binding and releasing it (partitioner.h's t_io, t_bind, t_out). The
// partitioner's files share them; nothing outside partitioner/src includes this.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "swapnet/partitioner.h"

namespace swapnet {
namespace detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

struct Prefix {
  std::vector<std::uint64_t> bytes;  // bytes[i] = sum of layers [0, i)
  std::vector<std::uint64_t> tensors;
  std::vector<double> exec;
  explicit Prefix(const std::vector<LayerCost>& l) : bytes(l.size() + 1), tensors(l.size() + 1), exec(l.size() + 1) {
    for (size_t i = 0; i < l.size(); ++i) {
      bytes[i + 1] = bytes[i] + l[i].bytes;
      tensors[i + 1] = tensors[i] + l[i].tensors;
      exec[i + 1] = exec[i] + l[i].exec_ms;
    }
  }
  // All over layers [i, j]; empty (0) when j < i.
  std::uint64_t b(int i, int j) const { return j < i ? 0 : bytes[j + 1] - bytes[i]; }
  double n(int i, int j) const { return j < i ? 0.0 : static_cast<double>(tensors[j + 1] - tensors[i]); }
  double ex(int i, int j) const { return j < i ? 0.0 : exec[j + 1] - exec[i]; }
  double io(int i, int j, const CostModel& m) const {
    return m.alpha_ms_per_byte * static_cast<double>(b(i, j)) + m.block_ms;
  }
  double bind(int i, int j, const CostModel& m) const { return m.beta_ms_per_tensor * n(i, j); }
  double out(int i, int j, const CostModel& m) const { return m.eta_ms_per_tensor * n(i, j); }
};

}  // namespace detail
}  // namespace swapnet
