// Inputs of new shapes (internal to the assembly module; Note [Dynamic shapes] in
// input_meter.cpp). The InputMeter knows the inputs the activation reserve was measured for
// (profiles), and measures a new input's activations in the inference it is for, within the
// budget. It returns reserves (what to plan with while measuring, and after); the Executor
// re-plans with them. It never plans itself.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "swapnet/assembly.h"

namespace swapnet {

class InputMeter {
 public:
  // A measurement: prepared before the re-plan for it, started after.
  struct Measurement {
    std::vector<ImageInput> inputs;
    int account = 0;
    std::uint64_t base = 0;         // the account's bytes at begin()
    std::uint64_t input_bytes = 0;  // forward's input tensors (counted as pack counts them)
    std::uint64_t reserve = 0;      // the reserve before (restored if the measurement fails)
    std::uint64_t allowance = 0;    // what activations may reach: the budget less the least weights
    // A zone of the allowance's size is the account's region while it measures (so that the
    // reserve recorded holds the activations as a zone places them). 0: none (meter not in use).
    std::uint64_t scratch = 0;
    char* scratch_base = nullptr;
    std::uint64_t scratch_bytes = 0;
    std::uint64_t cache_cap = 0;     // the account's activation cache before (restored after)
    std::uint64_t unzoned0 = 0;      // the account's bytes outside any zone at begin()
    std::uint64_t reach = 0;         // the most extent + bytes outside it that a layer reached
    std::string started;             // logged by start()
  };

  explicit InputMeter(std::string path) : path_(std::move(path)) {}

  // The image's profiles (or the legacy input shapes' one); largest(): the reserve they need.
  void set_profiles(std::vector<InputProfile> profiles) { profiles_ = std::move(profiles); }
  const std::vector<InputProfile>& profiles() const { return profiles_; }
  std::uint64_t largest(std::uint64_t at_least) const;
  bool covers(const std::vector<ImageInput>& in) const;
  std::uint64_t remeasured() const { return remeasured_; }

  // Before an inference whose input `in` no profile covers: the measurement (its allowance is the
  // reserve to plan with), charged to the account `account_for()` gives once the meter is on.
  // Throws Error naming the input, the profiles, the budget and the least weights where it
  // cannot be measured (on the GPU, the input alone fills the allowance, no account is free).
  Measurement prepare(std::vector<ImageInput> in, const std::vector<c10::IValue>& inputs, bool cuda,
                      std::uint64_t budget, std::uint64_t weights_min, std::uint64_t reserve,
                      const std::function<int()>& account_for);
  // After the executor planned with ms.allowance: the allocator refuses past it from now on.
  void start(Measurement ms);

  bool measuring() const { return ms_.has_value(); }
  int account() const { return ms_ ? ms_->account : 0; }
  // Scratch zone outputs must leave before the inference returns ({nullptr, 0}: none).
  std::pair<char*, std::uint64_t> scratch() const;
  // A budget move while measuring: the allowance at `budget`; throws where it is no more than
  // what the inference holds already.
  std::uint64_t allowance_at(std::uint64_t budget, std::uint64_t weights_min) const;
  // The re-plan for a budget move plans as for any reserve: the measurement is set aside
  // meanwhile and put back with its new allowance (or as it was, `allowance` 0).
  Measurement suspend();
  void resume(Measurement ms, std::uint64_t allowance);
  // After a layer (or finish) of the measuring inference: how far its activations reached.
  void note_reach();
  // The allocator refused an allocation past the allowance.
  bool refused() const;
  // The error for a refused inference at layer k.
  std::string refusal(std::uint64_t budget, std::uint64_t weights_min, int k, const std::string& layer) const;
  // The measurement ends: with `ok`, the input's measure joins the profiles; returns the reserve
  // to plan with from now on (the reserve before where !ok).
  std::uint64_t end(bool ok);

 private:
  std::string profiles_text() const;

  std::string path_;
  std::vector<InputProfile> profiles_;
  std::optional<Measurement> ms_;
  std::uint64_t remeasured_ = 0;
};

}  // namespace swapnet
