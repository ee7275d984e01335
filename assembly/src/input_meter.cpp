// Inputs of new shapes: the InputMeter (input_meter.h).
#include "input_meter.h"

#include <algorithm>

#include "cpu_meter.h"

namespace swapnet {

// Note [Dynamic shapes]
// ~~~~~~~~~~~~~~~~~~~~~
// The budget reserves activations for the inputs they were measured at: the image's input
// profiles (pack's example, and --input-profile's), each an input signature (describe_inputs:
// dtypes, sizes, structure) with its peak. An input *covered* by one (covers(): same structure,
// dtypes and other values, no dimension larger; activations do not grow when no dimension does)
// runs under the plan. Any other input is measured by the inference it is for, within the
// budget:
//  - before it, the plan becomes one with weights at their least (weights_min: the minimum
//    budget's ring and pinned slots) and activations allowed the rest of the budget;
//  - the CPU meter charges the inference's allocations to an account (the thread's, e.g. a
//    Runtime model's, or the executor's own) whose limit is that allowance: an allocation past
//    it throws, as out-of-memory would, so the inference fails with the input, the budget, the
//    least weights and the layer, and never runs over budget;
//  - after it, its peak joins the profiles and the reserve becomes the largest peak measured
//    (plans never shrink it: a smaller input later is covered), and the budget is re-planned.
//    The peak is what pack records (measure_activation_bytes): the most of the bytes live and of
//    the extent the activations reached in a zone (a scratch zone of the allowance's size is the
//    account's region meanwhile), plus the bytes outside it; the bytes live alone fell short of
//    the zone a later inference of that input places them in, and a chunk left out of the zone
//    is memory past the budget.
// An input larger only at run time costs one slower inference (the least-weight plan), then runs
// at full speed; a sequence growing by one token per call (generation) would be measured at
// every call, so such models record their largest input when packed (--input-profile). A budget
// change during the measuring inference keeps weights at their least and moves the limit (a
// budget below what the inference already holds is refused, as any budget below the minimum).
// The GPU's activations are in PyTorch's caching allocator, which the meter does not see: there
// an input no profile covers is refused, naming the profiles.

std::uint64_t InputMeter::largest(std::uint64_t at_least) const {
  for (const auto& p : profiles_) at_least = std::max(at_least, p.activation_bytes);
  return at_least;
}

bool InputMeter::covers(const std::vector<ImageInput>& in) const {
  bool covered = false;
  for (const auto& p : profiles_) covered = covered || swapnet::covers(p.inputs, in);
  return covered;
}

std::string InputMeter::profiles_text() const {
  if (profiles_.empty()) return "none recorded in the image";
  std::string out;
  for (const auto& p : profiles_) {
    out += (out.empty() ? "" : "; ") + (p.inputs.empty() ? std::string("no inputs") : inputs_text(p.inputs)) + ": " +
           format_bytes(p.activation_bytes);
  }
  return out;
}

InputMeter::Measurement InputMeter::prepare(std::vector<ImageInput> in, const std::vector<c10::IValue>& inputs,
                                            bool cuda, std::uint64_t budget, std::uint64_t weights_min,
                                            std::uint64_t reserve, const std::function<int()>& account_for) {
  const std::string what = path_ + ": input " + inputs_text(in) +
                           " is not covered by the inputs its activations were measured for (" + profiles_text() + ")";
  if (cuda) {
    throw Error(what + ", and activations on the GPU are not metered: re-pack with the largest input as the example "
                       "(swapnet pack --input ..., or --input-profile)");
  }
  std::uint64_t input_bytes = 0;
  for (const auto& v : inputs) {
    if (v.isTensor() && v.toTensor().defined()) input_bytes += v.toTensor().nbytes();
  }
  const std::uint64_t allowance = budget > weights_min ? budget - weights_min : 0;
  if (allowance <= input_bytes) {
    throw Error(what + "; the budget " + std::to_string(budget) + " bytes (" + format_bytes(budget) + ") leaves " +
                format_bytes(allowance) + " for activations after the least weights (" + format_bytes(weights_min) +
                "), and the input alone is " + format_bytes(input_bytes));
  }
  install_cpu_meter();
  const int account = account_for();
  if (account == 0) throw Error(what + ", and all CPU meter accounts are taken: it cannot be measured");
  Measurement ms;
  ms.inputs = std::move(in);
  ms.account = account;
  ms.base = cpu_account(account).current;
  ms.input_bytes = input_bytes;
  ms.reserve = reserve;
  ms.allowance = allowance;
  ms.started = what + ": measuring them in this inference, weights at their least (" + format_bytes(weights_min) +
               "), activations up to " + format_bytes(allowance);
  return ms;
}

void InputMeter::start(Measurement ms) {
  const int account = ms.account;
  if (detail::cpu_meter_active()) {
    ms.cache_cap = cpu_account_cache(account).cap;
    ms.scratch = detail::set_cpu_account_scratch_zone(account, ms.allowance, &ms.scratch_base);
    ms.scratch_bytes = ms.allowance;
    if (ms.scratch != 0) ms.unzoned0 = detail::cpu_zone_use(account, ms.scratch, true).unzoned;
  }
  reset_cpu_account_peak(account);
  detail::set_cpu_account_limit(account, ms.base + ms.allowance - ms.input_bytes);
  log(LogLevel::kInfo, ms.started);
  ms_ = std::move(ms);
}

std::pair<char*, std::uint64_t> InputMeter::scratch() const {
  if (!ms_ || ms_->scratch == 0) return {nullptr, 0};
  return {ms_->scratch_base, ms_->scratch_bytes};
}

std::uint64_t InputMeter::allowance_at(std::uint64_t budget, std::uint64_t weights_min) const {
  const Measurement& ms = *ms_;
  const std::uint64_t allowance = budget > weights_min ? budget - weights_min : 0;
  const CpuMeterStats now = cpu_account(ms.account);
  const std::uint64_t held = (now.current > ms.base ? now.current - ms.base : 0) + ms.input_bytes;
  if (allowance <= held) {
    throw Error(path_ + ": budget " + std::to_string(budget) + " bytes (" + format_bytes(budget) +
                ") is too small while an inference measures the activations of input " + inputs_text(ms.inputs) +
                ": it holds " + format_bytes(held) + " of them and the least weights need " + format_bytes(weights_min));
  }
  return allowance;
}

InputMeter::Measurement InputMeter::suspend() {
  Measurement ms = std::move(*ms_);
  ms_.reset();
  return ms;
}

void InputMeter::resume(Measurement ms, std::uint64_t allowance) {
  ms_ = std::move(ms);
  if (allowance > 0) {
    ms_->allowance = allowance;
    detail::set_cpu_account_limit(ms_->account, ms_->base + allowance - ms_->input_bytes);
  }
}

void InputMeter::note_reach() {
  if (!ms_ || ms_->scratch == 0) return;
  Measurement& ms = *ms_;
  ms.reach = std::max(ms.reach, detail::zone_reach(detail::cpu_zone_use(ms.account, ms.scratch, true), ms.unzoned0));
}

bool InputMeter::refused() const { return ms_ && detail::cpu_account_refused(ms_->account); }

std::string InputMeter::refusal(std::uint64_t budget, std::uint64_t weights_min, int k, const std::string& layer) const {
  return path_ + ": input " + inputs_text(ms_->inputs) + " needs more activations than the budget " +
         std::to_string(budget) + " bytes (" + format_bytes(budget) + ") leaves them: " + format_bytes(ms_->allowance) +
         " after the least weights (" + format_bytes(weights_min) + "), reached in layer " + std::to_string(k) + " (" +
         layer + "); measured before: " + profiles_text() + ". A larger budget or a smaller input runs";
}

std::uint64_t InputMeter::end(bool ok) {
  if (!ms_) return 0;
  const Measurement ms = std::move(*ms_);
  ms_.reset();
  const CpuMeterStats st = cpu_account(ms.account);
  detail::set_cpu_account_limit(ms.account, 0);
  // The scratch zone stops being the account's region (it goes with its last chunk); the cache
  // the account had before comes back.
  if (ms.scratch != 0) {
    if (detail::cpu_zone_use(ms.account, ms.scratch, false).attached) set_cpu_account_cache(ms.account, 0);
    if (ms.cache_cap > 0) set_cpu_account_cache(ms.account, ms.cache_cap);
  }
  std::uint64_t reserve = ms.reserve;
  if (!ok) return reserve;
  const std::uint64_t live = st.peak > ms.base ? st.peak - ms.base : 0;
  const std::uint64_t measured = std::max(live, ms.reach) + ms.input_bytes;
  log(LogLevel::kDebug, path_ + ": input " + inputs_text(ms.inputs) + ": activations " + format_bytes(live) +
                            " live at most, " + (ms.scratch ? format_bytes(ms.reach) + " as placed in a zone" : "no zone"));
  profiles_.push_back(InputProfile{measured, ms.inputs});
  ++remeasured_;
  reserve = std::max(reserve, measured);
  log(LogLevel::kInfo, path_ + ": input " + inputs_text(ms.inputs) + " needs " + format_bytes(measured) +
                           " of activations; the reserve is " + format_bytes(reserve) + " from now on");
  return reserve;
}

}  // namespace swapnet
