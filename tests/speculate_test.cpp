// generate_tokens (assembly/src/speculate.cpp, Note [Speculative decoding]) on toy decoders whose
// greedy choice is known: a target whose next token is a function of the last token and its
// position, a draft that agrees except where told, a state that holds the tokens seen (so a
// state cut back wrongly changes the tokens that follow). What it shows:
//  - speculative tokens equal plain greedy decoding for every k, with the draft partly right;
//  - a draft always right gives k + 1 tokens per pass; auto's k rises to max_k with it and falls
//    to plain decoding (k 0, with probes of 1) with a draft always wrong, which is then dropped;
//  - a state that breaks the contract (does not grow, grows along two dimensions) and a draft of
//    another vocabulary are refused with errors naming them.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "swapnet/assembly.h"

namespace swapnet {
namespace {

constexpr std::int64_t kVocab = 16;

std::int64_t next_of(std::int64_t token, std::int64_t pos) { return (token * 5 + pos) % kVocab; }

enum class Draft { kSame, kWrongEvery3, kWrong };

// forward(tokens [1, T], seen [1, S]) -> (logits [1, T, vocab], seen + tokens [1, S + T]).
TokenModel toy(Draft how, std::int64_t vocab = kVocab, double pass_ms = 0, int grow = 1) {
  return [=](std::vector<c10::IValue> in) -> c10::IValue {
    if (pass_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(pass_ms));
    const at::Tensor tokens = in[0].toTensor();
    const at::Tensor seen = in[1].toTensor();
    const std::int64_t t = tokens.size(1), s = seen.size(1);
    at::Tensor logits = at::zeros({1, t, vocab});
    for (std::int64_t i = 0; i < t; ++i) {
      std::int64_t next = next_of(tokens[0][i].item<std::int64_t>(), s + i);
      if (how == Draft::kWrong || (how == Draft::kWrongEvery3 && (s + i) % 3 == 2)) next = (next + 1) % kVocab;
      logits[0][i][next % vocab] = 1;
    }
    at::Tensor after = grow == 1 ? at::cat({seen, tokens.to(at::kLong)}, 1)
                       : grow == 0 ? seen
                                   : at::zeros({seen.size(0) + t, s + t}, at::kLong);  // two dimensions grow
    return c10::ivalue::Tuple::create({logits, after});
  };
}

const at::Tensor kPrompt = at::tensor(std::vector<std::int64_t>{3, 1, 4, 1, 5}).unsqueeze(0);
std::vector<c10::IValue> empty_state() { return {at::zeros({1, 0}, at::kLong)}; }

GenerationResult gen(const TokenModel& target, const TokenModel& draft, int k, int n = 40, int max_k = 8) {
  GenerationOptions o;
  o.new_tokens = n;
  o.k = k;
  o.max_k = max_k;
  return generate_tokens(target, draft, kPrompt, empty_state(), empty_state(), o);
}

TEST(Speculate, TokensEqualPlainGreedyDecodingForEveryK) {
  const GenerationResult plain = gen(toy(Draft::kSame), {}, 0);
  ASSERT_EQ(plain.tokens.size(), 40u);
  EXPECT_EQ(plain.pass_ms.size(), 40u);  // one token per pass
  for (int k = 0; k <= 6; ++k) {
    SCOPED_TRACE("k " + std::to_string(k));
    const GenerationResult r = gen(toy(Draft::kSame), toy(Draft::kWrongEvery3), k);
    EXPECT_EQ(r.tokens, plain.tokens);
    EXPECT_GT(r.accepted, 0u);
    EXPECT_LT(r.accepted, r.proposed);
    int made = 0;
    for (int t : r.pass_tokens) made += t;
    EXPECT_GE(made, 40);
  }
}

TEST(Speculate, ADraftAlwaysRightGivesKPlusOneTokensAPass) {
  const GenerationResult r = gen(toy(Draft::kSame), toy(Draft::kSame), 4, 41);
  EXPECT_EQ(r.tokens, gen(toy(Draft::kSame), {}, 0, 41).tokens);
  ASSERT_EQ(r.pass_tokens.size(), 9u);  // the prompt's pass, then 8 of 5 tokens
  for (size_t i = 1; i < r.pass_tokens.size(); ++i) EXPECT_EQ(r.pass_tokens[i], 5) << "pass " << i;
  EXPECT_EQ(r.accepted, r.proposed);
}

TEST(Speculate, AutoKRisesWithAGoodDraftAndFallsWithABadOne) {
  // The target's passes cost 2 ms whatever their tokens (as reads do), a draft's call 0.5 ms.
  const GenerationResult good = gen(toy(Draft::kSame, kVocab, 2), toy(Draft::kSame, kVocab, 0.5), 0, 60, 6);
  ASSERT_GE(good.pass_k.size(), 6u);
  int at_most = 0;  // passes at max_k once acceptance is learned, the last (cut to what is left) aside
  for (size_t i = 3; i + 1 < good.pass_k.size(); ++i) at_most += good.pass_k[i] == 6;
  EXPECT_GE(at_most, static_cast<int>(good.pass_k.size() - 4) * 3 / 4) << "k: " << c10::str(good.pass_k);
  EXPECT_EQ(good.draft_dropped_at, -1);
  GenerationOptions o;
  o.new_tokens = 60;
  o.max_k = 6;
  int dropped = 0;
  o.drop_draft = [&] { ++dropped; };
  const GenerationResult bad = generate_tokens(toy(Draft::kSame, kVocab, 2), toy(Draft::kWrong, kVocab, 0.5), kPrompt,
                                               empty_state(), empty_state(), o);
  EXPECT_EQ(bad.tokens, gen(toy(Draft::kSame), {}, 0, 60).tokens);
  // A draft that never pays is dropped (its memory may go to the target), once.
  EXPECT_EQ(dropped, 1);
  EXPECT_GT(bad.draft_dropped_at, 0);
  for (size_t i = static_cast<size_t>(std::max(bad.draft_dropped_at, 0)) + 1; i < bad.pass_k.size(); ++i) {
    EXPECT_EQ(bad.pass_k[i], 0) << "pass " << i << " after the draft was dropped";
  }
  EXPECT_EQ(bad.accepted, 0u);
  int plain_passes = 0;
  for (size_t i = 20; i < bad.pass_k.size(); ++i) plain_passes += bad.pass_k[i] == 0;
  EXPECT_GE(plain_passes, static_cast<int>(bad.pass_k.size() - 20) * 3 / 4)
      << "k stays up with a draft always wrong: " << c10::str(bad.pass_k);
}

TEST(Speculate, StatesThatDoNotGrowByTheTokensAreRefused) {
  for (int grow : {0, 2}) {
    try {
      gen(toy(Draft::kSame, kVocab, 0, grow), toy(Draft::kSame), 3);
      ADD_FAILURE() << "grow " << grow << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the target: speculative decoding needs each state tensor to grow"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Speculate, ADraftOfAnotherVocabularyIsRefused) {
  try {
    gen(toy(Draft::kSame), toy(Draft::kSame, 8), 3);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the draft's vocabulary (8 logits) is not the target's (16)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace swapnet
