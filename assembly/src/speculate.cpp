// Greedy generation, plain or speculative (swapnet/assembly.h's generate_tokens).
//
// Note [Speculative decoding]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A swapped decoder reads every byte it does not hold once per pass, so plain generation costs
// one read of the model per token. A small draft model held in memory proposes k tokens (k
// calls of one token each, cheap); the target then runs ONE pass over its pending token and the
// k proposals, which gives its own greedy choice after each of them. The draft's proposals are
// kept up to the first that differs from the target's choice, and the target's choice there is
// added: 1 to k + 1 tokens per read of the model, every one of them the token greedy decoding by
// the target would have chosen (the target decides each; the draft only guesses ahead).
//
// State. Both models carry state (a KV cache) that a call extends by the tokens it was given.
// After a pass, the target's state holds the pending token and all k proposals; it is cut back to
// the tokens kept (narrow along the sequence dimension). The draft's state is cut likewise; the
// tokens it has not seen yet (the target's correction, and its own last proposal when all k were
// kept) are its next call's input. The contract (Note [Generation] in cli/cmd_generate.cpp for
// the calling convention): every state tensor grows by exactly the number of tokens of a call
// along exactly one dimension, the same one every call (found at the prompt's call, checked at
// every later call); None stays None. A model whose state breaks it (a recurrent state that is
// overwritten rather than extended, a cache that grows along two dimensions) is refused, naming
// the state and its sizes before and after, since cutting it back would be wrong.
//
// Floating point. The target scores k + 1 tokens in one call, where plain generation scores one
// per call; matrix products over k + 1 rows may round differently from k + 1 products over one
// row, so the logits can differ in their last bits, and an argmax between two near-equal logits
// could flip. What happened on our models is measured, not assumed: `swapnet generate --draft`
// compares every run's tokens with plain greedy generation in memory and reports where they
// first differ (bench/results/generate_speculative.md).
//
// Note [Choosing k]
// ~~~~~~~~~~~~~~~~~
// With a per-token acceptance a, a pass with k proposals yields E(k) = (1 - a^(k+1)) / (1 - a)
// tokens and costs p0 + p1 (k + 1) + k d: p0 the target's fixed cost per pass (its reads, when
// swapped), p1 its compute per token, d one draft call. k (1..max_k) maximises E(k) / cost.
// a is estimated from decayed counts (accepted proposals, and passes where one was refused:
// the geometric law's estimate, starting at 1/2); d is a decayed mean of draft calls; p0 and p1
// a decayed least-squares fit of pass time against tokens per pass (p1 = 0 until passes of two
// sizes were seen: a swapped target's passes are mostly reads). k = 0 (plain decoding) is chosen
// when no k pays, and a pass of k = 1 is tried every 8th pass so that the estimate can recover.
// A draft that has not paid for 16 passes in a row (its probes included) is dropped for the rest
// of the generation: it holds memory the target could read less with (GenerationOptions::
// drop_draft gives it back).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "swapnet/assembly.h"

namespace swapnet {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A model's state between calls, and where its sequence dimension is (Note [Speculative decoding]).
class SequenceState {
 public:
  // `cut_back`: the state will be cut back, so it must keep the contract (plain decoding needs not).
  SequenceState(std::string who, std::vector<c10::IValue> initial, bool cut_back)
      : who_(std::move(who)), state_(std::move(initial)), cut_back_(cut_back) {}

  // The call's input: `tokens` then the state.
  std::vector<c10::IValue> input(const std::vector<std::int64_t>& tokens) const {
    std::vector<c10::IValue> in{at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).unsqueeze(0)};
    for (const auto& v : state_) in.push_back(v.isTensor() ? c10::IValue(v.toTensor()) : v);
    return in;
  }

  // The call's output (logits, *state) for `n` tokens given: keeps the state, checks the contract.
  at::Tensor absorb(const c10::IValue& out, std::int64_t n) {
    if (!out.isTuple() || out.toTupleRef().elements().size() != state_.size() + 1 ||
        !out.toTupleRef().elements()[0].isTensor()) {
      throw Error(who_ + ": generation needs forward(tokens, *state) -> (logits, *state) with " +
                  std::to_string(state_.size()) + " state values; forward returned " + out.tagKind());
    }
    const auto& items = out.toTupleRef().elements();
    const at::Tensor logits = items[0].toTensor();
    if (logits.dim() != 3 || logits.size(0) != 1 || logits.size(1) != n) {
      throw Error(who_ + ": generation needs logits [1, " + std::to_string(n) + ", vocab] for " + std::to_string(n) +
                  " tokens; forward's first output has sizes " + c10::str(logits.sizes()));
    }
    if (!cut_back_) {
      for (size_t k = 0; k < state_.size(); ++k) state_[k] = items[k + 1];
      length_ += n;
      return logits;
    }
    const bool first = dims_.empty();
    if (first) dims_.assign(state_.size(), -1);
    for (size_t k = 0; k < state_.size(); ++k) {
      const c10::IValue& after = items[k + 1];
      if (state_[k].isNone() && after.isNone()) continue;
      if (!state_[k].isTensor() || !after.isTensor()) {
        throw Error(who_ + ": speculative decoding needs each state value to be a tensor (or None); state " +
                    std::to_string(k) + " is " + state_[k].tagKind() + " before a call and " + after.tagKind() + " after");
      }
      const int d = grown_dim(state_[k].toTensor(), after.toTensor(), n);
      if (d < 0 || (!first && d != dims_[k])) {
        throw Error(who_ + ": speculative decoding needs each state tensor to grow by the call's tokens along one "
                    "dimension, the same at every call (Note [Speculative decoding]); state " + std::to_string(k) +
                    " had sizes " + c10::str(state_[k].toTensor().sizes()) + " before a call with " + std::to_string(n) +
                    " tokens and " + c10::str(after.toTensor().sizes()) + " after" +
                    (d >= 0 ? " (dimension " + std::to_string(d) + ", not " + std::to_string(dims_[k]) + ")" : ""));
      }
      dims_[k] = d;
      state_[k] = after;
    }
    length_ += n;
    return logits;
  }

  // Forgets all but the first `length` tokens.
  void cut(std::int64_t length) {
    if (length >= length_) return;
    for (size_t k = 0; k < state_.size(); ++k) {
      if (!state_[k].isTensor()) continue;
      const at::Tensor& t = state_[k].toTensor();
      // A view: the next call extends it into a new tensor anyway (a copy here would be a second).
      state_[k] = t.narrow(dims_[k], 0, t.size(dims_[k]) - (length_ - length));
    }
    length_ = length;
  }

  std::int64_t length() const { return length_; }
  void clear() { state_.clear(); }  // frees the state (a dropped draft's)

 private:
  // The one dimension `after` exceeds `before` in, by n; -1 if there is not exactly one so.
  static int grown_dim(const at::Tensor& before, const at::Tensor& after, std::int64_t n) {
    if (before.dim() != after.dim()) return -1;
    int found = -1;
    for (std::int64_t d = 0; d < before.dim(); ++d) {
      if (before.size(d) == after.size(d)) continue;
      if (after.size(d) != before.size(d) + n || found >= 0) return -1;
      found = static_cast<int>(d);
    }
    return found;
  }

  std::string who_;
  std::vector<c10::IValue> state_;
  bool cut_back_;
  std::vector<int> dims_;    // each state tensor's sequence dimension, found at the first call
  std::int64_t length_ = 0;  // tokens the state holds (since the initial state)
};

// Note [Choosing k].
class KChooser {
 public:
  explicit KChooser(int max_k) : max_k_(std::max(1, max_k)) {}

  int next() {
    ++passes_;
    double best = value(0);
    int k = 0;
    for (int c = 1; c <= max_k_; ++c) {
      const double v = value(c);
      if (v > best) best = v, k = c;
    }
    unpaid_ = k == 0 ? unpaid_ + 1 : 0;
    if (k == 0 && passes_ % 8 == 0) k = 1;  // a probe, so the estimates can recover
    return k;
  }
  bool draft_unpaid() const { return unpaid_ >= 16; }

  void observe_pass(int k, int accepted, double target_ms, double draft_ms) {
    acc_ = acc_ * kKeep + accepted;
    rej_ = rej_ * kKeep + (accepted < k ? 1 : 0);
    if (k > 0) {
      d_ = d_n_ > 0 ? d_ * kKeep + (draft_ms / k) * (1 - kKeep) : draft_ms / k;
      ++d_n_;
    }
    const double n = k + 1;
    sw_ = sw_ * kKeep + 1, sx_ = sx_ * kKeep + n, sy_ = sy_ * kKeep + target_ms;
    sxx_ = sxx_ * kKeep + n * n, sxy_ = sxy_ * kKeep + n * target_ms;
  }

 private:
  static constexpr double kKeep = 0.9;  // each pass's weight decays by this much per pass

  double value(int k) const {
    const double a = std::min(acc_ / (acc_ + rej_), 0.999);
    const double tokens = (1 - std::pow(a, k + 1)) / (1 - a);
    const double mx = sx_ / sw_, vx = sxx_ / sw_ - mx * mx;
    const double p1 = vx > 0.05 ? std::max(0.0, (sxy_ / sw_ - mx * sy_ / sw_) / vx) : 0.0;
    const double p0 = std::max(1e-3, sy_ / sw_ - p1 * mx);
    return tokens / (p0 + p1 * (k + 1) + k * d_);
  }

  int max_k_;
  long passes_ = 0;
  int unpaid_ = 0;  // passes in a row where no k paid
  double acc_ = 1, rej_ = 1;  // decayed: proposals kept, passes that refused one
  double d_ = 0;              // one draft call, ms
  long d_n_ = 0;
  double sw_ = 1e-9, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;  // decayed sums: pass tokens x, ms y
};

std::int64_t argmax_at(const at::Tensor& logits, std::int64_t i) {
  return logits.select(0, 0).select(0, i).argmax().item<std::int64_t>();
}

std::vector<std::int64_t> as_ids(const at::Tensor& prompt) {
  if (prompt.dim() != 2 || prompt.size(0) != 1 || prompt.size(1) < 1 || prompt.scalar_type() != at::kLong) {
    throw Error("generation needs a prompt of int64 [1, T] with T >= 1; it has " + std::string(toString(prompt.scalar_type())) +
                " " + c10::str(prompt.sizes()));
  }
  const at::Tensor p = prompt.contiguous();
  return std::vector<std::int64_t>(p.data_ptr<std::int64_t>(), p.data_ptr<std::int64_t>() + p.size(1));
}

// One speculative pass: the draft's k proposals, the target's check of them; appends the tokens
// kept to `out` and cuts both states back (Note [Speculative decoding]).
struct Pass {
  SequenceState& target;
  SequenceState& draft;
  std::vector<std::int64_t>& draft_pending;  // tokens the draft has not seen yet
  const TokenModel& target_fwd;
  const TokenModel& draft_fwd;
  std::int64_t vocab;     // the target's
  const bool& drafting;  // the draft is in use (not dropped: Note [Choosing k])

  int run(int k, std::vector<std::int64_t>* out, double* draft_ms) {
    const std::int64_t pending = out->back();  // the target has not seen it yet
    std::vector<std::int64_t> proposals;
    const auto t_draft = Clock::now();
    std::vector<std::int64_t> feed = draft_pending;
    for (int i = 0; i < k; ++i) {
      const at::Tensor lg = draft.absorb(draft_fwd(draft.input(feed)), static_cast<std::int64_t>(feed.size()));
      if (lg.size(2) != vocab) {
        throw Error("speculative decoding: the draft's vocabulary (" + std::to_string(lg.size(2)) +
                    " logits) is not the target's (" + std::to_string(vocab) + ")");
      }
      proposals.push_back(argmax_at(lg, lg.size(1) - 1));
      feed = {proposals.back()};
    }
    if (k > 0) draft_pending = feed;  // its last proposal, not yet seen
    *draft_ms = ms_since(t_draft);
    std::vector<std::int64_t> check{pending};
    check.insert(check.end(), proposals.begin(), proposals.end());
    const std::int64_t before = target.length();
    const at::Tensor lg = target.absorb(target_fwd(target.input(check)), static_cast<std::int64_t>(check.size()));
    int kept = 0;
    std::int64_t choice = argmax_at(lg, 0);
    while (kept < k && proposals[kept] == choice) {
      out->push_back(proposals[kept]);
      ++kept;
      choice = argmax_at(lg, kept);
    }
    out->push_back(choice);
    target.cut(before + 1 + kept);
    if (k == 0) {
      if (drafting) draft_pending.push_back(choice);
    } else if (kept < k) {  // the draft saw pending and proposals[0 .. kept-1] correctly
      draft.cut(before + 1 + kept);
      draft_pending = {choice};
    } else {
      draft_pending.push_back(choice);  // it saw all but its last proposal
    }
    return kept;
  }
};

}  // namespace

GenerationResult generate_tokens(const TokenModel& target, const TokenModel& draft, const at::Tensor& prompt,
                                 const std::vector<c10::IValue>& target_state,
                                 const std::vector<c10::IValue>& draft_state, const GenerationOptions& o) {
  if (o.new_tokens < 1) throw Error("generation needs new_tokens >= 1; it is " + std::to_string(o.new_tokens));
  if (draft && (o.k < 0 || o.max_k < 1 || o.k > 64)) {
    throw Error("speculative decoding needs 0 <= k <= 64 and max_k >= 1; k is " + std::to_string(o.k) + ", max_k " +
                std::to_string(o.max_k));
  }
  GenerationResult r;
  const std::vector<std::int64_t> ids = as_ids(prompt);
  const bool speculate = static_cast<bool>(draft);
  SequenceState ts("the target", clone_inputs(target_state), speculate);
  SequenceState ds("the draft", clone_inputs(draft_state), speculate);
  auto t0 = Clock::now();
  at::Tensor first = ts.absorb(target(ts.input(ids)), static_cast<std::int64_t>(ids.size()));
  r.tokens.push_back(argmax_at(first, first.size(1) - 1));
  const std::int64_t vocab = first.size(2);
  first.reset();  // the prompt's logits are no longer needed (they count in the budget)
  r.pass_ms.push_back(ms_since(t0));
  r.pass_tokens.push_back(1);
  r.pass_k.push_back(0);
  if (o.after_pass) o.after_pass();
  std::vector<std::int64_t> draft_pending = ids;  // the draft's first call: the prompt and the first token
  draft_pending.push_back(r.tokens.front());
  KChooser chooser(o.k > 0 ? o.k : o.max_k);
  bool drafting = speculate;
  Pass pass{ts, ds, draft_pending, target, draft, vocab, drafting};
  while (static_cast<int>(r.tokens.size()) < o.new_tokens) {
    const int room = o.new_tokens - static_cast<int>(r.tokens.size()) - 1;  // proposals that can still count
    int k = !drafting ? 0 : std::min(o.k > 0 ? o.k : chooser.next(), room);
    if (drafting && o.k == 0 && chooser.draft_unpaid()) {  // Note [Choosing k]: dropped
      drafting = false;
      k = 0;
      r.draft_dropped_at = static_cast<int>(r.pass_ms.size()) - 1;
      draft_pending.clear();
      ds.clear();
      if (o.drop_draft) o.drop_draft();
    }
    t0 = Clock::now();
    const size_t had = r.tokens.size();
    double draft_ms = 0;
    const int kept = pass.run(k, &r.tokens, &draft_ms);
    r.pass_ms.push_back(ms_since(t0));
    r.pass_tokens.push_back(static_cast<int>(r.tokens.size() - had));
    r.pass_k.push_back(k);
    r.proposed += static_cast<std::uint64_t>(k);
    r.accepted += static_cast<std::uint64_t>(kept);
    r.draft_ms += draft_ms;
    if (drafting) chooser.observe_pass(k, kept, r.pass_ms.back() - draft_ms, draft_ms);
    if (o.after_pass) o.after_pass();
  }
  r.tokens.resize(static_cast<size_t>(o.new_tokens));
  return r;
}

}  // namespace swapnet
