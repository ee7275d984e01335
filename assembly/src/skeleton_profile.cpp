// Profiling a skeleton on example inputs: each layer's FLOPs (from the shapes one run sees), its
// median time and the activation bytes live after it (profile), and the activation reserve a
// forward needs as libtorch's allocator places it (measure_activation_bytes).
#include <torch/csrc/jit/ir/constants.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include "cpu_meter.h"
#include "flops.h"
#include "skeleton_impl.h"
#include "text.h"

namespace swapnet {

using detail::CompiledLayer;
using jit::Node;
using jit::Value;

c10::IValue Skeleton::profile(const std::vector<c10::IValue>& inputs, const ProfileOptions& options) {
  const int n = static_cast<int>(impl_->compiled.size());
  // One run of the profiling variant of each layer: every intermediate value is an output, so
  // FLOPs are computed from the shapes actually seen.
  {
    Run run = begin(inputs);
    for (int k = 0; k < n; ++k) {
      auto g = impl_->layer_graph(k, true);
      jit::Code code(g, "probe_" + std::to_string(k));
      const CompiledLayer& c = impl_->compiled[k];
      jit::Stack stack;
      for (int i : c.in_ids) stack.push_back(run.s_->env[i]);
      for (int s : impl_->layers[k].used_slots) stack.emplace_back(impl_->bound[s]);
      std::unordered_map<Value*, c10::IValue> vals;
      for (size_t i = 0; i < g->inputs().size(); ++i) vals[g->inputs()[i]] = stack[i];
      try {
        c10::InferenceMode guard;
        jit::InterpreterState(code).run(stack);
      } catch (const std::exception& e) {
        throw Error(impl_->origin + ": layer " + std::to_string(k) + " (" + impl_->layers[k].name +
                    ") failed: " + detail::torch_message(e));
      }
      size_t pos = c.out_ids.size();
      double flops = 0;
      for (Node* node : g->nodes()) {
        if (node->kind() == c10::prim::Constant) {
          vals[node->output()] = *jit::toIValue(node->output());
          continue;
        }
        std::vector<c10::IValue> in, out;
        for (Value* o : node->outputs()) vals[o] = stack[pos++];
        for (Value* v : node->inputs()) {
          auto it = vals.find(v);
          in.push_back(it == vals.end() ? c10::IValue() : it->second);
        }
        for (Value* o : node->outputs()) out.push_back(vals[o]);
        flops += detail::node_flops(node->kind().toQualString(), in, out);
      }
      impl_->layers[k].flops = flops;
      for (size_t i = 0; i < c.out_ids.size(); ++i) run.s_->env[c.out_ids[i]] = stack[i];
      for (size_t i = 0; i < c.in_ids.size(); ++i) {
        if (c.in_last_use[i]) run.s_->env[c.in_ids[i]] = c10::IValue();
      }
      run.s_->next = k + 1;
    }
  }
  // Timed runs through the real layer code.
  std::vector<std::vector<double>> times(n);
  c10::IValue out;
  for (int it = 0; it < options.warmup + options.iters; ++it) {
    Run run = begin(inputs);
    for (int k = 0; k < n; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      run_layer(run);
      auto t1 = std::chrono::steady_clock::now();
      if (it >= options.warmup) times[k].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (it == options.warmup + options.iters - 1) impl_->layers[k].live_bytes = run.live_bytes();
    }
    out = finish(run);
  }
  for (int k = 0; k < n; ++k) {
    auto& t = times[k];
    if (t.empty()) continue;
    std::sort(t.begin(), t.end());
    impl_->layers[k].time_ms = t[t.size() / 2];
  }
  return out;
}

std::uint64_t measure_activation_bytes(const Skeleton& sk, const std::vector<c10::IValue>& inputs,
                                       std::vector<std::uint64_t>* layer_peaks) {
  install_cpu_meter();
  // Note [Lending the activation reserve] (zone_lender.cpp): the reserve becomes a zone that places
  // chunks from its end, best fit; fragmentation makes their extent exceed the bytes live at
  // once. So the forward runs under an account of its own whose region is a zone too large to
  // fill (address space only: pages are touched where chunks land), and the reserve (and each
  // layer's peak) is the most of the bytes live and of the extent plus the account's bytes
  // outside the zone (allocations too small to place): what the executor measures a layer's
  // reach by. Where the meter is not libtorch's allocator, or no account is left, the bytes
  // live alone.
  struct Scratch {
    int account = 0;
    std::uint64_t zone = 0;
    ~Scratch() {
      if (account == 0) return;
      set_cpu_account_cache(account, 0);  // the zone goes (its pages with its last chunk)
      detail::release_cpu_account(account);
    }
  } scratch;
  if (detail::cpu_meter_active()) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const std::uint64_t bytes = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * page : 0;
    scratch.account = bytes ? new_cpu_account() : 0;
    char* base = nullptr;
    if (scratch.account != 0) scratch.zone = detail::set_cpu_account_scratch_zone(scratch.account, bytes, &base);
  }
  auto zone_reach = [&] {  // since the last call: the extent reached plus the bytes outside
    if (scratch.zone == 0) return std::uint64_t{0};
    return detail::zone_reach(detail::cpu_zone_use(scratch.account, scratch.zone, true));
  };
  std::uint64_t peak = 0;
  {
    detail::AccountScope charge(scratch.account);
    reset_cpu_meter_peak();
    (void)zone_reach();
    const std::uint64_t base = cpu_meter().current;
    std::vector<c10::IValue> copies;
    for (const auto& v : inputs) copies.emplace_back(v.isTensor() ? c10::IValue(v.toTensor().clone()) : v);
    // Held to the end, as a caller holds the inputs it passes (the run would free them once used,
    // and the reserve then fell short by the input's bytes).
    const std::vector<c10::IValue> held = copies;
    Skeleton::Run run = sk.begin(std::move(copies));
    std::uint64_t live_peak = 0, zone_peak = 0;
    auto since = [&] {  // the peak since the last call
      const std::uint64_t p = cpu_meter().peak, live = p > base ? p - base : 0, zone = zone_reach();
      live_peak = std::max(live_peak, live);
      zone_peak = std::max(zone_peak, zone);
      return std::max(live, zone);
    };
    peak = since();
    const int L = static_cast<int>(sk.layers().size());
    if (layer_peaks) layer_peaks->assign(L, 0);
    for (int k = 0; k < L; ++k) {
      reset_cpu_meter_peak();
      sk.run_layer(run);
      const std::uint64_t p = since();
      peak = std::max(peak, p);
      if (layer_peaks) (*layer_peaks)[k] = p;
    }
    reset_cpu_meter_peak();
    c10::IValue out = sk.finish(run);
    peak = std::max(peak, since());
    log(LogLevel::kDebug, "activations: " + format_bytes(live_peak) + " live at most, " +
                              (scratch.zone ? format_bytes(zone_peak) + " as placed in a zone" : "no zone (meter not in use)"));
  }
  return peak;
}

}  // namespace swapnet
