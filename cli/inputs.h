// Example inputs for the CLI's model commands (torch-facing helpers shared by the cmd_*.cpp
// files; defined in inputs.cpp and naive.cpp).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "commands.h"
#include "swapnet/assembly.h"

namespace swapnet {
namespace cli {

// The run's inputs (make_inputs in assembly.h, Note [Input specs]): --input / --input-shape,
// else the specs the image records. Each run takes clone_inputs() of them (a model may modify
// its input in place).
std::vector<c10::IValue> inputs_for(const Common& c, const ImageInfo& info, std::vector<std::string>* shapes);
std::vector<std::string> split(const std::string& s, char sep);

// Each tensor input moved to the GPU (device 0), as the executor moves a CPU input of a GPU
// model (Executor::begin): for direct GPU inference beside it.
void inputs_to_cuda(std::vector<c10::IValue>* inputs);

// Plans with a device profile (cmd_plan.cpp).
void use_profile(const DeviceProfile& p, ExecutorOptions* o);

// The skeleton options --split-above asks for (Common::split_above).
SkeletonOptions skeleton_options(const Common& c);

// The whole model in memory (direct mode, --check's reference, profiling): the image's data
// read once, every layer bound to it.
struct InMemory {
  Skeleton sk;
  void* data = nullptr;
  // `cuda`: every weight then copied to GPU memory, as model.to(kCUDA) does (direct GPU inference).
  InMemory(const std::string& path, const ImageInfo& info, bool cuda = false);
  ~InMemory();
  InMemory(const InMemory&) = delete;
  InMemory& operator=(const InMemory&) = delete;
};

// The naive path of `run --mode naive` (naive.cpp): per block of `plan`, a buffered read into
// a fresh buffer (its pages dropped after), a copy into fresh tensors, bind, run, free.
c10::IValue naive_forward(Skeleton& sk, const std::string& path, const ImageInfo& info, const ExecutionPlan& plan,
                          std::vector<c10::IValue> inputs, std::uint64_t* bytes_read);
// Its plan (Note [An honest naive path]): blocks whose read buffer and copy, with activations
// and pinned weights, stay within options.budget; Error naming `path` and naive's minimum below it.
ExecutionPlan naive_plan(const ImageInfo& info, const ExecutorOptions& options, const std::string& path);
std::uint64_t naive_min_budget(const ImageInfo& info, const ExecutorOptions& options);
std::uint64_t largest_block(const ExecutionPlan& plan);     // bytes of its largest block
std::uint64_t naive_peak_bytes(const ExecutionPlan& plan);  // 2 x largest block + activations + pinned
std::uint64_t vm_hwm_bytes();  // the process's peak RSS (VmHWM)
void drop_page_cache(const std::string& path);

}  // namespace cli
}  // namespace swapnet
