// swapnet — command-line front end.
//
//   swapnet inspect MODEL.pt --input-shape 1,3,224,224 [--json]   the model info table
//   swapnet verify  MODEL.pt --input-shape 1,3,224,224 [--json]   layered run == forward, bit for bit
//   swapnet info [--json]                                         build and device facts
//
// Output: human text by default, one JSON object on stdout with --json. Errors: one line
// "swapnet: error: ..." on stderr and exit status 2; verify exits 1 when outputs differ.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/script.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include "swapnet/allocator.h"
#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Common {
  std::vector<std::string> input_shapes;
  bool json = false;
  int threads = 0;
  std::uint64_t seed = 0;
  std::string log_level = "warn";
};

void add_common(CLI::App* app, Common& c, bool model_inputs) {
  if (model_inputs) {
    app->add_option("--input-shape", c.input_shapes,
                    "shape of forward's input, e.g. 1,3,224,224 (repeat for several inputs)")
        ->required();
    app->add_option("--seed", c.seed, "seed of the random input (default 0)");
  }
  app->add_flag("--json", c.json, "print one JSON object on stdout");
  app->add_option("--threads", c.threads, "intra-op threads (default: all cores)");
  app->add_option("--log-level", c.log_level, "off|error|warn|info|debug (default warn)");
}

void apply_common(const Common& c) {
  swapnet::set_log_level(swapnet::parse_log_level(c.log_level));
  int threads = c.threads > 0 ? c.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
}

std::vector<c10::IValue> make_inputs(const Common& c) {
  torch::manual_seed(c.seed);
  std::vector<c10::IValue> in;
  for (const auto& s : c.input_shapes) in.emplace_back(torch::randn(swapnet::parse_shape(s)));
  return in;
}

// Inputs are cloned for every run: a model may modify its input in place.
std::vector<c10::IValue> clone_inputs(const std::vector<c10::IValue>& in) {
  std::vector<c10::IValue> out;
  for (const auto& v : in) out.emplace_back(v.toTensor().clone());
  return out;
}

std::string join_shapes(const std::vector<std::string>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? " " : "") + s[i];
  return out;
}

int cmd_inspect(const std::string& path, const Common& c, int iters) {
  apply_common(c);
  auto t0 = Clock::now();
  swapnet::Skeleton sk = swapnet::Skeleton::load(path);
  double build_ms = ms_since(t0);
  auto inputs = make_inputs(c);
  t0 = Clock::now();
  swapnet::ProfileOptions opt;
  opt.iters = iters;
  try {
    sk.profile(inputs, opt);
  } catch (const swapnet::Error& e) {
    throw swapnet::Error(std::string(e.what()) + " (input shape " + join_shapes(c.input_shapes) + ")");
  }
  double profile_ms = ms_since(t0);

  const auto& layers = sk.layers();
  std::int64_t total_bytes = 0, total_tensors = 0;
  double total_flops = 0, total_ms = 0;
  int largest = 0;
  for (const auto& L : layers) {
    total_bytes += L.bytes;
    total_tensors += L.tensors;
    total_flops += L.flops;
    total_ms += L.time_ms;
    if (L.bytes > layers[largest].bytes) largest = L.index;
  }
  int shared = 0;
  for (const auto& s : sk.slots()) shared += s.used_by.size() > 1;

  if (c.json) {
    json j;
    j["model"] = path;
    j["input_shapes"] = c.input_shapes;
    j["threads"] = at::get_num_threads();
    j["num_layers"] = layers.size();
    j["total_bytes"] = total_bytes;
    j["total_tensors"] = total_tensors;
    j["module_bytes"] = sk.total_bytes();
    j["parameters"] = sk.num_parameters();
    j["buffers"] = sk.num_buffers();
    j["shared_slots"] = shared;
    j["total_flops"] = total_flops;
    j["total_time_ms"] = total_ms;
    j["largest_layer"] = {{"index", largest}, {"name", layers[largest].name}, {"bytes", layers[largest].bytes}};
    j["build_ms"] = build_ms;
    j["profile_ms"] = profile_ms;
    json arr = json::array();
    for (const auto& L : layers) {
      arr.push_back({{"index", L.index}, {"name", L.name}, {"bytes", L.bytes}, {"tensors", L.tensors},
                     {"flops", L.flops}, {"time_ms", L.time_ms}, {"live_bytes", L.live_bytes},
                     {"ops", L.ops}, {"live_in", L.live_in}});
    }
    j["layers"] = std::move(arr);
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  std::printf("%s: %zu layers, %s in %lld tensors (%d parameters, %d buffers), input %s, %d threads\n",
              path.c_str(), layers.size(), swapnet::format_bytes(total_bytes).c_str(),
              static_cast<long long>(total_tensors), sk.num_parameters(), sk.num_buffers(),
              join_shapes(c.input_shapes).c_str(), at::get_num_threads());
  std::printf("%5s  %-40s %12s %7s %12s %9s %12s\n", "index", "name", "bytes", "tensors", "MFLOPs", "time_ms",
              "live_bytes");
  for (const auto& L : layers) {
    std::string name = L.name.size() > 40 ? "..." + L.name.substr(L.name.size() - 37) : L.name;
    std::printf("%5d  %-40s %12lld %7lld %12.2f %9.3f %12lld\n", L.index, name.c_str(),
                static_cast<long long>(L.bytes), static_cast<long long>(L.tensors), L.flops / 1e6, L.time_ms,
                static_cast<long long>(L.live_bytes));
  }
  std::printf("total  %-40s %12lld %7lld %12.2f %9.3f\n", "", static_cast<long long>(total_bytes),
              static_cast<long long>(total_tensors), total_flops / 1e6, total_ms);
  std::printf("largest layer: %d (%s), %s; skeleton built in %.1f ms, profiled in %.1f ms\n", largest,
              layers[largest].name.c_str(), swapnet::format_bytes(layers[largest].bytes).c_str(), build_ms,
              profile_ms);
  return 0;
}

int cmd_verify(const std::string& path, const Common& c, int runs) {
  apply_common(c);
  torch::jit::Module module;
  auto t0 = Clock::now();
  swapnet::Skeleton sk = swapnet::Skeleton::load(path, &module);
  double build_ms = ms_since(t0);
  auto inputs = make_inputs(c);

  // The layered path first: the reference's executor optimises after its first runs, and we
  // compare against every reference run (cold and optimised), so order does not matter.
  std::vector<c10::IValue> layered;
  std::vector<double> layered_ms, forward_ms;
  for (int r = 0; r < runs; ++r) {
    t0 = Clock::now();
    try {
      layered.push_back(sk.forward(clone_inputs(inputs)));
    } catch (const swapnet::Error& e) {
      throw swapnet::Error(std::string(e.what()) + " (input shape " + join_shapes(c.input_shapes) + ")");
    }
    layered_ms.push_back(ms_since(t0));
  }
  swapnet::Comparison worst;
  worst.equal = true;
  for (int r = 0; r < runs; ++r) {
    c10::IValue ref;
    t0 = Clock::now();
    try {
      c10::InferenceMode guard;
      ref = module.forward(clone_inputs(inputs));
    } catch (const c10::Error& e) {
      throw swapnet::Error(path + ": forward failed on input shape " + join_shapes(c.input_shapes) + ": " +
                           e.what_without_backtrace());
    }
    forward_ms.push_back(ms_since(t0));
    for (const auto& out : layered) {
      swapnet::Comparison cmp = swapnet::compare_outputs(ref, out);
      if (!cmp.equal && worst.equal) worst.difference = cmp.difference;
      worst.equal = worst.equal && cmp.equal;
      worst.max_abs_diff = std::max(worst.max_abs_diff, cmp.max_abs_diff);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  if (c.json) {
    json j;
    j["model"] = path;
    j["equal"] = worst.equal;
    j["max_abs_diff"] = std::isinf(worst.max_abs_diff) ? json(nullptr) : json(worst.max_abs_diff);
    j["layers"] = sk.layers().size();
    j["runs"] = runs;
    if (!worst.equal) j["difference"] = worst.difference;
    j["build_ms"] = build_ms;
    j["forward_ms_median"] = median(forward_ms);
    j["layered_ms_median"] = median(layered_ms);
    j["threads"] = at::get_num_threads();
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: %s over %zu layers (%d runs each), max_abs_diff %g%s%s\n", path.c_str(),
                worst.equal ? "bit-identical to forward" : "DIFFERS from forward", sk.layers().size(), runs,
                worst.max_abs_diff, worst.equal ? "" : "; first difference: ", worst.difference.c_str());
    std::printf("forward %.1f ms, layered %.1f ms (medians), skeleton built in %.1f ms\n", median(forward_ms),
                median(layered_ms), build_ms);
  }
  return worst.equal ? 0 : 1;
}

int cmd_info(const Common& c) {
  apply_common(c);
  const swapnet::DeviceInfo& d = swapnet::cuda_device();
  if (c.json) {
    json j;
    j["built_with_cuda"] = d.built_with_cuda;
    j["cuda_usable"] = d.usable;
    j["cuda_devices"] = d.count;
    j["cuda_device"] = d.name;
    j["integrated"] = d.integrated;
    j["reason"] = d.reason;
    j["threads"] = at::get_num_threads();
    j["torch_parallel"] = at::get_parallel_info();
    std::cout << j.dump() << "\n";
  } else {
    std::printf("CUDA: %s\n", d.usable ? (d.name + (d.integrated ? " (integrated)" : " (discrete)")).c_str()
                                       : ("not usable: " + d.reason).c_str());
    std::printf("threads: %d\n%s", at::get_num_threads(), at::get_parallel_info().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swapnet: run DNNs larger than their memory budget by swapping blocks of layers"};
  app.require_subcommand(1);
  Common common;
  std::string model;
  int iters = 3, runs = 2;

  auto* inspect = app.add_subcommand("inspect", "print the model info table (layers, bytes, FLOPs, time)");
  inspect->add_option("model", model, "TorchScript file (.pt)")->required();
  inspect->add_option("--iters", iters, "timed runs for per-layer time (median; default 3)");
  add_common(inspect, common, true);

  auto* verify = app.add_subcommand("verify", "check that the layer-by-layer run equals forward bit for bit");
  verify->add_option("model", model, "TorchScript file (.pt)")->required();
  verify->add_option("--runs", runs, "runs of each path; every pair is compared (default 2)");
  add_common(verify, common, true);

  auto* info = app.add_subcommand("info", "build and device facts (CUDA, threads)");
  add_common(info, common, false);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (*inspect) return cmd_inspect(model, common, std::max(1, iters));
    if (*verify) return cmd_verify(model, common, std::max(1, runs));
    if (*info) return cmd_info(common);
  } catch (const swapnet::Error& e) {
    std::fprintf(stderr, "swapnet: error: %s\n", e.what());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "swapnet: error: %s\n", e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swapnet: error: %s\n", e.what());
    return 2;
  }
  return 2;
}
