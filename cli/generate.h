// `swapnet generate`'s parts shared by cmd_generate.cpp and generate_draft.cpp.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "inputs.h"
#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

// The state after the prompt, with every dimension the prompt grew stretched to `context`
// tokens: what the last call of the generation holds (zeros).
std::vector<c10::IValue> final_state(const std::vector<c10::IValue>& state0, const c10::IValue& after_prompt,
                                     std::int64_t prompt_tokens, std::int64_t context);
// The rows of the first embedding's weight: the vocabulary, for a model that embeds its tokens (0: none).
std::int64_t vocabulary(const Skeleton& sk);
// The initial state from the image's example input after the tokens, as zeros.
std::vector<c10::IValue> example_state(const std::string& path, const ImageInfo& info);

// The draft of speculative decoding (--draft), whole in memory.
struct Draft {
  std::string path;
  ImageInfo info;                   // a .swapnet draft's
  std::unique_ptr<InMemory> mem;    // a .swapnet draft
  std::unique_ptr<Skeleton> sk;     // a TorchScript draft
  TokenModel fwd;
  std::vector<c10::IValue> state0;
  std::uint64_t bytes = 0;            // its weights
  std::uint64_t activation_peak = 0;  // what its calls allocate at most (its KV cache included)
};
// Loads the draft (a swap image, read whole, or a TorchScript file); its initial state from
// `state_specs`, else an image's example input.
void open_draft(const std::string& path, const Common& c, const std::vector<std::string>& state_specs, Draft* d);
// Runs the draft on the prompt and once at the final context, measuring its activations; returns
// what it holds of the budget (weights + activations).
std::uint64_t measure_draft(Draft& d, const at::Tensor& prompt, std::int64_t context);

// Token ids <-> text for models/textgen.py's models (--vocab-file: the JSON list export.py writes).
struct Vocabulary {
  std::string path;
  std::vector<std::string> pieces;
  std::map<std::string, std::int64_t> ids;
  static Vocabulary load(const std::string& path);
  std::vector<std::int64_t> encode(const std::string& text) const;  // Error naming a piece not in it
  std::string decode(const std::vector<std::int64_t>& tokens) const;
};

}  // namespace cli
}  // namespace swapnet
