// Example inputs for the CLI's model commands (torch-facing helpers shared by cmd_model.cpp and
// cmd_run.cpp).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace swapnet {
namespace cli {

// Random normal tensors of the given shapes ("1,3,224,224" each), seeded.
std::vector<c10::IValue> random_inputs(const std::vector<std::string>& shapes, std::uint64_t seed);
// Inputs are cloned for every run: a model may modify its input in place.
std::vector<c10::IValue> clone_inputs(const std::vector<c10::IValue>& in);

}  // namespace cli
}  // namespace swapnet
