// swapnet generate: greedy token generation from a decoder's swap image within a memory budget.
//
// Note [Generation]
// ~~~~~~~~~~~~~~~~~
// Any model whose forward follows forward(tokens, *state) -> (logits, *state) generates: tokens
// int64 [1, T], logits [1, T, vocab], the state (a KV cache, as tensors) whatever the model
// returns for the next call. The first call takes the prompt (--prompt-tokens N ids drawn
// uniformly from the vocabulary with --seed, or @FILE) and the initial state: tensors of the
// sizes the image's example input has after the tokens (models/gpt.py: an empty cache), zeros,
// or --state SPECs. Each call's last logits give the next token (argmax, ties to the lowest id);
// --new-tokens M calls in all (the prompt's, then M - 1 with one token each).
//
// The weights are swapped per call. The state grows with every token, so every call's input is
// larger than the last: before timing, the prompt call and one call at the final context (a
// zero state of that length) run once, so that the executor measures their activations within
// the budget (Note [Dynamic shapes] in input_meter.cpp) and plans the whole generation with them; a
// cache that cannot fit is refused there, with the numbers, before any token is generated. Then
// the generation is timed: time to first token (the prompt's call), tokens/s over the other
// calls, bytes read per token, and the peak of weights + activations (the state included). The
// same generation in memory (the whole image read once) gives the reference ids: `equal`.
// --mode direct times that in-memory run instead, --mode naive the paper's naive path
// (buffered reads of every block per call, pages dropped).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "generate.h"
#include "swapnet/allocator.h"
#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {
namespace {

using json = nlohmann::json;
using Forward = std::function<c10::IValue(std::vector<c10::IValue>)>;

struct Generation {
  GenerationResult r;                // the ids, each pass's time ([0]: the prompt's), proposals kept
  std::vector<std::uint64_t> read;   // bytes read after each pass (cumulative; swapnet/naive)
};

}  // namespace

std::int64_t vocabulary(const Skeleton& sk) {
  for (const auto& L : sk.layers()) {
    if (std::find(L.ops.begin(), L.ops.end(), "aten::embedding") == L.ops.end()) continue;
    for (int s : L.used_slots) {
      if (sk.slots()[s].sizes.size() == 2) return sk.slots()[s].sizes[0];
    }
  }
  return 0;
}

namespace {

// The generation of Note [Generation] (generate_tokens; with a draft, speculative: Note
// [Speculative decoding]). `read` reports bytes read so far (empty: none).
// `drop_draft`: called if the draft is dropped (GenerationOptions::drop_draft).
Generation generate(const Forward& fwd, const Draft* draft, const at::Tensor& prompt,
                    const std::vector<c10::IValue>& state0, const GenerateOptions& o,
                    const std::function<std::uint64_t()>& read, const std::function<void()>& drop_draft = {}) {
  Generation g;
  GenerationOptions go;
  go.new_tokens = o.new_tokens;
  go.k = o.speculate.empty() || o.speculate == "auto" ? 0 : std::stoi(o.speculate);
  go.max_k = o.max_k;
  go.after_pass = [&] { g.read.push_back(read ? read() : 0); };
  go.drop_draft = drop_draft;
  g.r = generate_tokens(fwd, draft ? draft->fwd : TokenModel(), prompt, state0,
                        draft ? draft->state0 : std::vector<c10::IValue>{}, go);
  return g;
}

}  // namespace

std::vector<c10::IValue> final_state(const std::vector<c10::IValue>& state0, const c10::IValue& after_prompt,
                                     std::int64_t prompt_tokens, std::int64_t context) {
  std::vector<c10::IValue> out;
  const auto& items = after_prompt.toTupleRef().elements();
  for (size_t k = 1; k < items.size(); ++k) {
    if (!items[k].isTensor()) {
      out.push_back(items[k]);
      continue;
    }
    const at::Tensor t = items[k].toTensor();
    std::vector<std::int64_t> sizes = t.sizes().vec();
    const at::Tensor* before = k - 1 < state0.size() && state0[k - 1].isTensor() ? &state0[k - 1].toTensor() : nullptr;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const std::int64_t was = before && before->dim() == t.dim() ? before->size(static_cast<std::int64_t>(d)) : sizes[d];
      if (sizes[d] == was + prompt_tokens) sizes[d] = was + context;
    }
    out.push_back(at::zeros(sizes, t.options()));
  }
  return out;
}

std::vector<c10::IValue> example_state(const std::string& path, const ImageInfo& info) {
  if (info.input_profiles.empty()) {
    throw Error(path + ": the image records no example input to take the initial state from: give --state SPEC");
  }
  std::vector<c10::IValue> state0;
  const auto& ex = info.input_profiles.front().inputs;
  for (size_t k = 1; k < ex.size(); ++k) {
    if (ex[k].kind == ImageInput::kNone) {
      state0.emplace_back();
    } else if (ex[k].kind == ImageInput::kTensor) {
      state0.push_back(at::zeros(ex[k].sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(ex[k].dtype))));
    } else {
      throw Error(path + ": the example input's argument " + std::to_string(k) + " (" + inputs_text({ex[k]}) +
                  ") is not a tensor or None: give --state SPEC");
    }
  }
  return state0;
}

namespace {

void check_options(const GenerateOptions& o) {
  if (o.new_tokens < 1) throw Error("--new-tokens " + std::to_string(o.new_tokens) + ": at least 1");
  if (o.prompt_tokens < 1) throw Error("--prompt-tokens " + std::to_string(o.prompt_tokens) + ": at least 1");
  if (o.mode != "swapnet" && o.mode != "direct" && o.mode != "naive") {
    throw Error("--mode '" + o.mode + "' is not one of swapnet|direct|naive");
  }
  if (o.mode != "direct" && o.budget.empty()) throw Error("--budget is required for mode " + o.mode);
  if (!o.speculate.empty() && o.draft.empty()) throw Error("--speculate " + o.speculate + " needs --draft MODEL");
  if (o.speculate.empty()) return;
  if (o.speculate != "auto") {
    size_t used = 0;
    int k = 0;
    try {
      k = std::stoi(o.speculate, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != o.speculate.size() || k < 1 || k > 64) {
      throw Error("--speculate '" + o.speculate + "': give auto or a number of tokens from 1 to 64");
    }
  }
  if (o.max_k < 1 || o.max_k > 64) throw Error("--max-k " + std::to_string(o.max_k) + ": from 1 to 64");
}

// The initial state: --state, else the image's example input after the tokens, as zeros.
std::vector<c10::IValue> initial_state(const std::string& path, const Common& c, const GenerateOptions& o,
                                       const ImageInfo& info) {
  std::vector<c10::IValue> state0 =
      !o.state.empty() ? swapnet::make_inputs(o.state, c.seed + 1) : example_state(path, info);
  if (static_cast<int>(state0.size()) + 1 != static_cast<int>(info.num_inputs)) {
    throw Error(path + ": forward takes " + std::to_string(info.num_inputs) + " inputs; tokens and " +
                std::to_string(state0.size()) + " state tensors were given");
  }
  return state0;
}

// What the generation runs on (--mode): the executor, naive's path, or the whole model in memory.
// Neither copied nor moved: `fwd` and `read` refer to its members.
struct Backend {
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  ExecutorOptions eo;
  std::unique_ptr<Executor> ex;
  std::unique_ptr<InMemory> mem;
  Forward fwd;
  std::function<std::uint64_t()> read;  // bytes read so far; empty in direct mode
  std::uint64_t naive_read = 0;
  ExecutionPlan nplan;
  std::unique_ptr<Skeleton> naive_sk;
};

// Opens `b` for o.mode. `path` and `info` must outlive it (its naive forward refers to them).
// `draft_share`: what the draft holds of the budget (its weights and activations), not the target's.
void open_backend(const std::string& path, const Common& c, const GenerateOptions& o, const ImageInfo& info,
                  std::uint64_t draft_share, Backend* b) {
  if (o.mode == "swapnet" || o.mode == "naive") {
    const std::uint64_t budget = parse_size(o.budget);
    if (draft_share >= budget) {
      throw Error("--budget " + o.budget + " (" + format_bytes(budget) + "): the draft " + o.draft + " alone holds " +
                  format_bytes(draft_share) + " (weights and activations), nothing is left for the target " + path);
    }
    b->eo.budget = budget - draft_share;
    use_profile(device_profile(path, c, o.profile), &b->eo);
    set_executor_option(&b->eo, "--read-ahead", o.read_ahead);
  }
  if (o.mode == "swapnet") {
    b->ex = Executor::open(path, b->eo);
    b->fwd = [b](std::vector<c10::IValue> in) { return b->ex->forward(std::move(in)); };
    b->read = [b] { return b->ex->bytes_used(); };
  } else if (o.mode == "naive") {
    b->nplan = naive_plan(info, b->eo, path);  // as run --mode naive: buffer + copy within the budget
    b->naive_sk = std::make_unique<Skeleton>(Skeleton::from_image(info, path));
    b->fwd = [b, &path, &info](std::vector<c10::IValue> in) {
      return naive_forward(*b->naive_sk, path, info, b->nplan, std::move(in), &b->naive_read);
    };
    b->read = [b] { return b->naive_read; };
  } else {
    b->mem = std::make_unique<InMemory>(path, info);
    b->fwd = [b](std::vector<c10::IValue> in) { return b->mem->sk.forward(std::move(in)); };
  }
}

// Warm-up (Note [Generation]): the prompt's call and one at the final context. Returns its ms.
// With a draft, the call at the final context checks max_k + 1 tokens, the most a pass does.
double warm_up(const std::string& path, const GenerateOptions& o, const Forward& fwd, const at::Tensor& prompt,
               const std::vector<c10::IValue>& state0, std::int64_t context) {
  const std::int64_t last_tokens =
      o.draft.empty() ? 1 : 1 + (o.speculate.empty() || o.speculate == "auto" ? o.max_k : std::stoi(o.speculate));
  const auto t_warm = Clock::now();
  std::vector<c10::IValue> first{prompt.clone()};
  for (const auto& v : state0) first.push_back(v.isTensor() ? c10::IValue(v.toTensor().clone()) : v);
  const c10::IValue after_prompt = fwd(std::move(first));
  if (!after_prompt.isTuple()) {
    throw Error(path + ": generate needs forward(tokens, *state) -> (logits, *state); forward returned " +
                after_prompt.tagKind());
  }
  std::vector<c10::IValue> last{at::zeros({1, last_tokens}, at::TensorOptions().dtype(at::kLong))};
  for (auto& v : final_state(state0, after_prompt, o.prompt_tokens, context - 1)) last.push_back(std::move(v));
  try {
    fwd(std::move(last));
  } catch (const std::exception& e) {
    throw Error(path + ": the KV cache of " + std::to_string(context) + " tokens (prompt " +
                std::to_string(o.prompt_tokens) + " + " + std::to_string(o.new_tokens - 1) +
                " generated) does not fit: " + e.what());
  }
  return ms_since(t_warm);
}

// What the timed generation measured, and its check against the in-memory one.
struct GenerationOutcome {
  Generation g;
  std::uint64_t read0 = 0;         // bytes read before it
  std::uint64_t act_peak = 0;      // libtorch's peak above where it began
  std::uint64_t weights_peak = 0;
  std::uint64_t cache_before = 0, cache_after = 0;  // the image's bytes in the page cache
  std::uint64_t rss = 0;
  double warm_ms = 0;
  bool equal = false;  // tokens as in the in-memory generation
  long first_difference = -1;  // the first token that is not, -1 if none
  double raw = 0;      // the disk's raw rate, MB/s (0 in direct mode)
  Draft* draft = nullptr;  // with --draft
  bool draft_dropped = false;
  std::uint64_t peak = 0;  // weights + activations at most (the larger phase's, a draft dropped)
};

// The timed generation, and what it took.
void timed_generation(const std::string& path, const GenerateOptions& o, const ImageInfo& info, Backend& b,
                      const at::Tensor& prompt, const std::vector<c10::IValue>& state0, GenerationOutcome* r) {
  // Memory: the weights' peak (the executor's; the whole model in memory; naive's largest block
  // buffer) + what libtorch allocated at most since the generation began (activations, the
  // growing KV cache, naive's copies of the weights).
  reset_memory_peak();
  if (b.ex) b.ex->reset_weight_peak();
  const std::uint64_t base = cpu_meter().current;
  reset_cpu_meter_peak();
  r->read0 = b.read ? b.read() : 0;
  auto weights_now = [&] {
    return b.ex ? b.ex->weight_memory().peak : o.mode == "direct" ? info.data_size : largest_block(b.nplan);
  };
  auto act_now = [&] { return cpu_meter().peak > base ? cpu_meter().peak - base : 0; };
  const std::uint64_t draft_bytes = r->draft ? r->draft->bytes : 0;
  // A draft that does not pay is dropped (Note [Choosing k]): its weights and state freed, the
  // whole budget the target's. Memory is then measured afresh: the peak is the larger of the two
  // phases' (each phase's weights + activations), never their sum.
  std::uint64_t phase_weights = 0, phase_act = 0, phase_peak = 0;
  auto drop = [&] {
    if (!r->draft) return;
    phase_weights = weights_now() + draft_bytes;
    phase_act = act_now();
    phase_peak = phase_weights + phase_act;
    r->draft->mem.reset();
    r->draft->sk.reset();
    r->draft_dropped = true;
    if (b.ex) {
      b.ex->reset_weight_peak();
      b.ex->set_budget(parse_size(o.budget));
    }
    reset_cpu_meter_peak();
  };
  r->g = generate(b.fwd, r->draft, prompt, state0, o, b.read, drop);
  const std::uint64_t w = weights_now() + (r->draft && !r->draft_dropped ? draft_bytes : 0), a = act_now();
  r->weights_peak = std::max(w, phase_weights);
  r->act_peak = std::max(a, phase_act);
  r->peak = std::max(w + a, phase_peak);
  page_cache_bytes(path, &r->cache_after).throw_if_error();
  r->rss = vm_hwm_bytes();
}

// The reference: the same generation in memory (after the timed run: its memory is not counted).
void check_generation(const std::string& path, const GenerateOptions& o, const ImageInfo& info,
                      const at::Tensor& prompt, const std::vector<c10::IValue>& state0, GenerationOutcome* r) {
  Generation ref;
  if (o.mode == "direct" && !r->draft) {
    ref = r->g;
  } else {  // plain greedy generation by the target alone, in memory
    InMemory reference(path, info);
    GenerateOptions plain = o;
    plain.speculate.clear();
    ref = generate([&](std::vector<c10::IValue> in) { return reference.sk.forward(std::move(in)); }, nullptr, prompt,
                   state0, plain, {});
  }
  r->equal = ref.r.tokens == r->g.r.tokens;
  for (size_t i = 0; i < ref.r.tokens.size() && r->first_difference < 0; ++i) {
    if (i >= r->g.r.tokens.size() || ref.r.tokens[i] != r->g.r.tokens[i]) r->first_difference = static_cast<long>(i);
  }
  r->raw = o.mode == "direct" ? 0 : raw_read_mb_s(path, info.data_offset, info.data_offset + info.data_size, 1.0);
}

// With a draft: how the speculation went (Note [Speculative decoding]).
void speculation_json(const GenerateOptions& o, const Draft& d, const Generation& g, int decoded, double decode_ms,
                      json* j) {
  const GenerationResult& r = g.r;
  const size_t passes = r.pass_ms.size() - 1;  // after the prompt's
  double k_sum = 0;
  for (size_t i = 1; i < r.pass_k.size(); ++i) k_sum += r.pass_k[i];
  (*j)["draft"] = d.path;
  (*j)["speculate"] = o.speculate.empty() ? "auto" : o.speculate;
  (*j)["draft_bytes"] = d.bytes;
  (*j)["draft_activation_bytes"] = d.activation_peak;
  (*j)["proposed"] = r.proposed;
  (*j)["accepted"] = r.accepted;
  (*j)["acceptance_rate"] = r.proposed ? static_cast<double>(r.accepted) / static_cast<double>(r.proposed) : 0.0;
  (*j)["tokens_per_pass"] = passes ? static_cast<double>(decoded) / static_cast<double>(passes) : 0.0;
  (*j)["k_mean"] = passes ? k_sum / static_cast<double>(passes) : 0.0;
  (*j)["pass_k"] = r.pass_k;
  (*j)["pass_tokens"] = r.pass_tokens;
  (*j)["draft_ms_share"] = decode_ms > 0 ? r.draft_ms / decode_ms : 0.0;
  (*j)["draft_dropped_at_pass"] = r.draft_dropped_at;
}

json report_json(const std::string& path, const GenerateOptions& o, const ImageInfo& info, std::int64_t vocab,
                 const Backend& b, const GenerationOutcome& r, double per_token_bytes) {
  const Generation& g = r.g;
  double decode_ms = 0;
  for (size_t i = 1; i < g.r.pass_ms.size(); ++i) decode_ms += g.r.pass_ms[i];
  const int decoded = o.new_tokens - 1;
  json j;
  j["image"] = path;
  j["mode"] = o.mode;
  j["budget_bytes"] = o.mode == "direct" ? json(nullptr) : json(parse_size(o.budget));
  j["target_budget_bytes"] = o.mode == "direct" ? json(nullptr) : json(b.eo.budget);  // less the draft's share
  j["model_bytes"] = info.data_size;
  j["vocab"] = vocab;
  j["prompt_tokens"] = o.prompt_tokens;
  j["new_tokens"] = o.new_tokens;
  j["tokens"] = g.r.tokens;
  j["equal"] = r.equal;
  j["time_to_first_token_ms"] = g.r.pass_ms.front();
  j["tokens_per_s"] = decoded > 0 && decode_ms > 0 ? decoded * 1e3 / decode_ms : 0.0;
  j["ms_per_token"] = decoded > 0 ? decode_ms / decoded : g.r.pass_ms.front();
  j["call_ms"] = g.r.pass_ms;
  j["bytes_read_per_token"] = per_token_bytes;
  j["raw_io_mb_s"] = r.raw;
  j["io_bound_ms_per_token"] = r.raw > 0 ? per_token_bytes / (r.raw * 1e3) : 0.0;
  j["peak_model_bytes"] = r.peak;
  j["weights_peak_bytes"] = r.weights_peak;
  j["activation_peak_bytes"] = r.act_peak;  // the state (KV cache) included
  j["peak_rss_bytes"] = r.rss;
  j["page_cache_growth_bytes"] = static_cast<std::int64_t>(r.cache_after) - static_cast<std::int64_t>(r.cache_before);
  j["warmup_ms"] = r.warm_ms;
  j["threads"] = at::get_num_threads();
  if (b.ex) {
    const ExecutionPlan& p = b.ex->plan();
    j["num_blocks"] = p.blocks.size();
    j["resident_bytes"] = p.resident_bytes;
    j["arena_bytes"] = p.arena_bytes;
    j["activation_reserve_bytes"] = p.activation_bytes;
    j["remeasured_inputs"] = b.ex->remeasured();
    j["plan_read_bytes"] = p.read_bytes;
  }
  j["first_difference"] = r.first_difference;
  j["target_passes"] = g.r.pass_ms.size();
  if (r.draft) speculation_json(o, *r.draft, g, decoded, decode_ms, &j);
  return j;
}

void report(const std::string& path, const Common& c, const GenerateOptions& o, const ImageInfo& info,
            std::int64_t vocab, const Backend& b, const GenerationOutcome& r, const Vocabulary* vocab_text) {
  const Generation& g = r.g;
  const int decoded = o.new_tokens - 1;
  const double per_token_bytes =
      decoded > 0 ? static_cast<double>(g.read.back() - g.read.front()) / decoded
                  : static_cast<double>(g.read.front() - r.read0);
  json j = report_json(path, o, info, vocab, b, r, per_token_bytes);
  if (vocab_text) j["text"] = vocab_text->decode(g.r.tokens);
  if (c.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: %s, budget %s, prompt %lld tokens, %d new tokens\n", path.c_str(), o.mode.c_str(),
                o.budget.empty() ? "-" : o.budget.c_str(), static_cast<long long>(o.prompt_tokens), o.new_tokens);
    std::printf("time to first token %.1f ms; %.2f tokens/s (%.1f ms/token); %.1f MB read per token, I/O bound %.1f ms/token at %.0f MB/s\n",
                j["time_to_first_token_ms"].get<double>(), j["tokens_per_s"].get<double>(),
                j["ms_per_token"].get<double>(), per_token_bytes / 1e6, j["io_bound_ms_per_token"].get<double>(), r.raw);
    if (r.draft) {
      std::printf("speculative: draft %s (%s) proposed %llu tokens, the target kept %llu (%.0f %%); %.2f tokens per pass "
                  "of the target (k %s, mean %.1f)\n",
                  r.draft->path.c_str(), format_bytes(r.draft->bytes).c_str(),
                  static_cast<unsigned long long>(g.r.proposed), static_cast<unsigned long long>(g.r.accepted),
                  100 * j["acceptance_rate"].get<double>(), j["tokens_per_pass"].get<double>(),
                  j["speculate"].get<std::string>().c_str(), j["k_mean"].get<double>());
    }
    std::printf("peak model memory %s (weights %s, activations and KV cache %s); tokens %s greedy generation in memory",
                format_bytes(r.peak).c_str(), format_bytes(r.weights_peak).c_str(),
                format_bytes(r.act_peak).c_str(), r.equal ? "identical to" : "DIFFER from");
    std::printf(r.equal ? "\n" : " (from token %ld)\n", r.first_difference);
    if (vocab_text) std::printf("text: %s\n", vocab_text->decode(g.r.tokens).c_str());
  }
}

}  // namespace

int generate(const std::string& path, const Common& c, const GenerateOptions& o) {
  apply_common(c);
  install_cpu_meter();
  c10::InferenceMode inference;
  ImageInfo info;
  read_image_info(path, &info).throw_if_error();
  check_options(o);
  const Skeleton shape_of = Skeleton::from_image(info, path);
  std::int64_t vocab = o.vocab > 0 ? o.vocab : vocabulary(shape_of);
  if (vocab <= 0) throw Error(path + ": no embedding layer tells the vocabulary size: give --vocab");
  const std::vector<c10::IValue> state0 = initial_state(path, c, o, info);
  std::unique_ptr<Vocabulary> text;
  if (!o.vocab_file.empty()) text = std::make_unique<Vocabulary>(Vocabulary::load(o.vocab_file));
  if (!o.prompt_text.empty() && !text) throw Error("--prompt-text needs --vocab-file (the ids of its pieces)");
  at::manual_seed(c.seed);
  const at::Tensor prompt =
      text && !o.prompt_text.empty()
          ? at::tensor(text->encode(o.prompt_text), at::TensorOptions().dtype(at::kLong)).unsqueeze(0)
          : at::randint(0, vocab, {1, o.prompt_tokens}, at::TensorOptions().dtype(at::kLong));
  GenerateOptions oo = o;
  oo.prompt_tokens = static_cast<int>(prompt.size(1));
  if (!o.draft.empty() && oo.speculate.empty()) oo.speculate = "auto";
  const std::int64_t context = prompt.size(1) + o.new_tokens - 1;  // tokens the last call's cache holds

  Backend b;
  GenerationOutcome r;
  Draft draft;
  std::uint64_t draft_share = 0;
  if (!o.draft.empty()) {
    open_draft(o.draft, c, o.draft_state, &draft);
    const std::int64_t dv = vocabulary(draft.mem ? draft.mem->sk : *draft.sk);
    if (dv > 0 && dv != vocab) {
      throw Error(o.draft + ": the draft's vocabulary (" + std::to_string(dv) + " ids) is not the target's (" +
                  std::to_string(vocab) + ", " + path + ")");
    }
    draft_share = measure_draft(draft, prompt, context);
    r.draft = &draft;
  }
  drop_page_cache(path);
  page_cache_bytes(path, &r.cache_before).throw_if_error();
  open_backend(path, c, oo, info, draft_share, &b);
  r.warm_ms = warm_up(path, oo, b.fwd, prompt, state0, context);
  timed_generation(path, oo, info, b, prompt, state0, &r);
  check_generation(path, oo, info, prompt, state0, &r);
  report(path, c, oo, info, vocab, b, r, text.get());
  return r.equal ? 0 : 1;
}

}  // namespace cli
}  // namespace swapnet
