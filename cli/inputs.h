// Example inputs for the CLI's model commands (torch-facing helpers shared by cmd_model.cpp and
// cmd_run.cpp).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "commands.h"
#include "swapnet/assembly.h"

namespace swapnet {
namespace cli {

// The inputs the specs name (--input / --input-shape: make_inputs, Note [Input specs]), seeded.
std::vector<c10::IValue> random_inputs(const std::vector<std::string>& specs, std::uint64_t seed);
// Inputs are cloned for every run (clone_inputs in assembly.h): a model may modify its input in place.
using swapnet::clone_inputs;
// The run's inputs: --input-shape, else the example input the image records.
std::vector<c10::IValue> inputs_for(const Common& c, const ImageInfo& info, std::vector<std::string>* shapes);
std::vector<std::string> split(const std::string& s, char sep);

// The whole model in memory (direct mode, --check's reference, profiling): the image's data
// read once, every layer bound to it.
// Plans with a device profile (cmd_plan.cpp).
void use_profile(const DeviceProfile& p, ExecutorOptions* o);

struct InMemory {
  Skeleton sk;
  void* data = nullptr;
  // `cuda`: every weight then copied to GPU memory, as model.to(kCUDA) does (direct GPU inference).
  InMemory(const std::string& path, const ImageInfo& info, bool cuda = false);
  ~InMemory();
  InMemory(const InMemory&) = delete;
  InMemory& operator=(const InMemory&) = delete;
};

}  // namespace cli
}  // namespace swapnet
