// `swapnet generate`'s draft model and text (Note [Speculative decoding] in
// assembly/src/speculate.cpp): the draft held whole in memory, its bytes and its measured
// activations taken out of the budget before the target's executor plans the rest; a vocabulary
// file turning text into token ids and back.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <regex>
#include <sstream>

#include "generate.h"

namespace swapnet {
namespace cli {

void open_draft(const std::string& path, const Common& c, const std::vector<std::string>& state_specs, Draft* d) {
  d->path = path;
  if (is_image(path)) {
    read_image_info(path, &d->info).throw_if_error();
    d->mem = std::make_unique<InMemory>(path, d->info);
    d->bytes = d->info.data_size;
    Skeleton* sk = &d->mem->sk;
    d->fwd = [sk](std::vector<c10::IValue> in) { return sk->forward(std::move(in)); };
    d->state0 = state_specs.empty() ? example_state(path, d->info) : swapnet::make_inputs(state_specs, c.seed + 2);
  } else {
    d->sk = std::make_unique<Skeleton>(Skeleton::load(path, nullptr, skeleton_options(c)));
    d->bytes = static_cast<std::uint64_t>(d->sk->total_bytes());
    Skeleton* sk = d->sk.get();
    d->fwd = [sk](std::vector<c10::IValue> in) { return sk->forward(std::move(in)); };
    if (state_specs.empty()) {
      throw Error(path + ": a TorchScript draft records no example input to take its initial state from: give "
                  "--draft-state SPEC (e.g. float32[1,2,1,2,0,32] for an empty KV cache), or pack it first");
    }
    d->state0 = swapnet::make_inputs(state_specs, c.seed + 2);
  }
}

std::uint64_t measure_draft(Draft& d, const at::Tensor& prompt, std::int64_t context) {
  const std::uint64_t base = cpu_meter().current;
  reset_cpu_meter_peak();
  std::vector<c10::IValue> first{prompt.clone()};
  for (const auto& v : clone_inputs(d.state0)) first.push_back(v);
  const c10::IValue after = d.fwd(std::move(first));
  if (!after.isTuple()) {
    throw Error(d.path + ": a draft needs forward(tokens, *state) -> (logits, *state); forward returned " + after.tagKind());
  }
  // A call at the final context: its cache is the largest the draft holds.
  std::vector<c10::IValue> last{at::zeros({1, 2}, at::TensorOptions().dtype(at::kLong))};
  for (auto& v : final_state(d.state0, after, prompt.size(1), context - 1)) last.push_back(std::move(v));
  d.fwd(std::move(last));
  d.activation_peak = cpu_meter().peak > base ? cpu_meter().peak - base : 0;
  return d.bytes + d.activation_peak;
}

Vocabulary Vocabulary::load(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open the vocabulary file");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    throw Error(path + ": not a JSON list of strings (" + e.what() + ")");
  }
  if (!j.is_array()) throw Error(path + ": not a JSON list of strings (id = index)");
  Vocabulary v;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string()) throw Error(path + ": entry " + std::to_string(i) + " is not a string");
    v.pieces.push_back(j[i].get<std::string>());
    v.ids.emplace(v.pieces.back(), static_cast<std::int64_t>(i));
  }
  v.path = path;
  return v;
}

std::vector<std::int64_t> Vocabulary::encode(const std::string& text) const {
  // models/textgen.py's pieces: a word with its leading space, a newline, a space, any other character.
  static const std::regex piece(" ?[A-Za-z0-9]+|\n|\\s|[^\\sA-Za-z0-9]");
  std::vector<std::int64_t> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), piece); it != std::sregex_iterator(); ++it) {
    const auto found = ids.find(it->str());
    if (found == ids.end()) {
      throw Error("--prompt-text: '" + it->str() + "' is not in the vocabulary " + path + " (" +
                  std::to_string(pieces.size()) + " pieces)");
    }
    out.push_back(found->second);
  }
  if (out.empty()) throw Error("--prompt-text: the text is empty");
  return out;
}

std::string Vocabulary::decode(const std::vector<std::int64_t>& tokens) const {
  std::string s;
  for (auto t : tokens) s += t >= 0 && static_cast<size_t>(t) < pieces.size() ? pieces[t] : "<" + std::to_string(t) + ">";
  return s;
}

}  // namespace cli
}  // namespace swapnet
