// FLOP estimates per TorchScript node from the values seen in one run.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace swapnet {
namespace detail {

// Floating-point operations of one node (multiply-add = 2). Matrix products and convolutions
// are exact; normalisations, activations and pooling count one or a few per element;
// view, shape and copy ops count zero. Nodes with nested blocks count zero (their inner
// shapes are not seen).
double node_flops(const std::string& kind, const std::vector<c10::IValue>& in,
                  const std::vector<c10::IValue>& out);

}  // namespace detail
}  // namespace swapnet
