// swapnet profile: measures this device once and fits the partitioner's cost model by least
// squares (partitioner.h): t_in = alpha*bytes + beta*tensors + block_ms from fetches of random
// layer ranges of an image (read with the executor's reader, then bound by reference),
// t_out = eta*tensors from unbinding them, and gamma from per-layer execution times vs FLOPs.
// It also reports how well gamma*FLOPs and the image's own per-layer times (measured when it
// was packed) predict the execution time of those ranges, and keeps the better one.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>

#include <unistd.h>

#include "commands.h"
#include "inputs.h"
#include "swapnet/assembly.h"
#include "swapnet/partitioner.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {
namespace {

using json = nlohmann::json;

double median_rel_error(const std::vector<double>& pred, const std::vector<double>& meas) {
  std::vector<double> e;
  for (size_t i = 0; i < pred.size(); ++i) {
    if (meas[i] > 0) e.push_back(std::fabs(pred[i] - meas[i]) / meas[i]);
  }
  return median(e);
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

DeviceProfile measure_profile(const std::string& path, const Common& c, const MeasureOptions& o, json* report) {
  c10::InferenceMode guard;
  ImageInfo info;
  read_image_info(path, &info).throw_if_error();
  if (info.layers.empty() || info.data_size == 0) throw Error(path + ": the image has no weights to profile with");
  DeviceProfile p;
  p.threads = at::get_num_threads();
  p.created = utc_now();
  p.image = path;
  // Two passes back to back: the first is what a read after idling gets (throttled and flash
  // storage burst then), the second what a disk kept busy delivers, which a pipeline that is
  // I/O bound sees: alpha comes from it.
  p.raw_read_mb_s = raw_read_mb_s(path, info.data_offset, info.data_offset + info.data_size);
  p.sustained_read_mb_s = raw_read_mb_s(path, info.data_offset, info.data_offset + info.data_size, 1.0);
  p.cost.alpha_ms_per_byte = 1.0 / (p.sustained_read_mb_s * 1e3);

  // ---- isolated reads of random layer ranges, binding and unbinding them ----
  const int L = static_cast<int>(info.layers.size());
  const std::uint64_t largest = std::max<std::uint64_t>(std::min<std::uint64_t>(info.data_size / 2, 64ull << 20), 1);
  std::unique_ptr<BlockReader> reader;
  BlockReader::open(path, ReaderOptions{}, &reader).throw_if_error();
  void* buf = alloc_aligned(std::max<std::uint64_t>(info.data_size, kImageAlign));
  if (buf == nullptr) throw Error(path + ": cannot allocate " + format_bytes(info.data_size) + " to profile with");
  Skeleton sk = Skeleton::from_image(info, path);
  std::mt19937 rng(o.seed);
  std::vector<std::pair<int, int>> ranges;
  std::vector<std::vector<double>> X_read, X_bind, X_out;
  std::vector<double> y_read, y_bind, y_out;
  for (int s = 0; s < o.samples; ++s) {
    // Target sizes log-uniform from 64 KiB to `largest`, starting anywhere.
    const double lo = std::log(64.0 * 1024), hi = std::log(static_cast<double>(largest));
    const double target = std::exp(std::uniform_real_distribution<double>(lo, std::max(lo, hi))(rng));
    int i = std::uniform_int_distribution<int>(0, L - 1)(rng), j = i;
    std::uint64_t bytes = info.layers[i].size;
    while (j + 1 < L && static_cast<double>(bytes) < target && bytes + info.layers[j + 1].size <= largest) {
      bytes += info.layers[++j].size;
    }
    if (bytes == 0) continue;
    std::uint32_t tensors = 0;
    for (int k = i; k <= j; ++k) tensors += info.layers[k].num_tensors;
    std::vector<double> t_read, t_bind, t_out;
    for (int r = 0; r < o.repeats; ++r) {
      auto t0 = Clock::now();
      Status st = reader->read(info.layers[i].offset, bytes, buf);
      if (!st.ok()) {
        free_aligned(buf);
        throw Error(st.message());
      }
      t_read.push_back(ms_since(t0));
      t0 = Clock::now();
      sk.bind_layers(i, j, buf, info.layers[i].offset);
      t_bind.push_back(ms_since(t0));
      t0 = Clock::now();
      sk.unbind_layers(i, j);
      t_out.push_back(ms_since(t0));
    }
    ranges.emplace_back(i, j);
    X_read.push_back({static_cast<double>(bytes), 1.0});
    y_read.push_back(median(t_read));
    X_bind.push_back({static_cast<double>(tensors)});
    y_bind.push_back(median(t_bind));
    X_out.push_back({static_cast<double>(tensors)});
    y_out.push_back(median(t_out));
  }
  std::vector<double> pred_in, meas_in, pred_out;
  if (X_read.size() < 4) {
    // A model too small to fit on: the sustained read rate and default per-tensor and
    // per-block costs.
    log(LogLevel::kWarn, path + ": only " + std::to_string(X_read.size()) +
                             " layer ranges with weights; using the read rate and default per-block costs");
  } else {
    p.cost.beta_ms_per_tensor = fit_nonnegative(X_bind, y_bind)[0];
    p.cost.eta_ms_per_tensor = fit_nonnegative(X_out, y_out)[0];
    // The fixed cost of a read beyond its bytes at the sustained rate (never negative: reads
    // after idling may beat that rate).
    std::vector<double> extra;
    for (size_t s = 0; s < X_read.size(); ++s) extra.push_back(y_read[s] - p.cost.alpha_ms_per_byte * X_read[s][0]);
    p.cost.block_ms = std::max(0.0, median(extra));
  }
  for (size_t s = 0; s < X_read.size(); ++s) {
    pred_in.push_back(p.cost.alpha_ms_per_byte * X_read[s][0] + p.cost.block_ms +
                      p.cost.beta_ms_per_tensor * X_bind[s][0]);
    meas_in.push_back(y_read[s] + y_bind[s]);
    pred_out.push_back(p.cost.eta_ms_per_tensor * X_out[s][0]);
  }
  p.t_in_error = median_rel_error(pred_in, meas_in);
  p.t_out_error = median_rel_error(pred_out, y_out);

  // ---- execution: per-layer times now vs FLOPs and vs the image's recorded times ----
  Status st = reader->read(info.data_offset, info.data_size, buf);
  if (!st.ok()) {
    free_aligned(buf);
    throw Error(st.message());
  }
  sk.bind_layers(0, L - 1, buf, info.data_offset);
  std::vector<std::string> shapes;
  ProfileOptions po;
  po.warmup = 1;
  po.iters = o.exec_runs;
  sk.profile(inputs_for(c, info, &shapes), po);
  double ff = 0, ft = 0;
  for (const auto& layer : sk.layers()) {
    ff += layer.flops * layer.flops;
    ft += layer.flops * layer.time_ms;
  }
  p.gamma_ms_per_flop = ff > 0 ? ft / ff : 0;
  std::vector<double> meas, by_flops, by_image;
  for (const auto& [i, j] : ranges) {
    double m = 0, f = 0, im = 0;
    for (int k = i; k <= j; ++k) {
      m += sk.layers()[k].time_ms;
      f += p.gamma_ms_per_flop * sk.layers()[k].flops;
      im += info.layers[k].time_ms;
    }
    meas.push_back(m);
    by_flops.push_back(f);
    by_image.push_back(im);
  }
  double total_now = 0, total_image = 0;
  for (int k = 0; k < L; ++k) {
    total_now += sk.layers()[k].time_ms;
    total_image += info.layers[k].time_ms;
  }
  sk.unbind_layers(0, L - 1);
  free_aligned(buf);
  // The choice holds for every image planned with this profile, and FLOPs describe
  // convolutions only: they predict resnet101's layer ranges within ~6 %, but yolov3's 35 %,
  // fcn_resnet101's 27 % and vgg19's 97 % off their packed times (GEMVs, batch norms,
  // upsampling are bound by memory, not FLOPs). So the image's recorded times are compared by
  // their shape (scaled to this run's total: a machine running 20 % slower than when the
  // image was packed slows every layer alike, and that drift passes) and kept unless they are
  // off by more than FLOPs are, and by more than 15 %: an image packed elsewhere. The planner
  // uses the recorded times as they are, so a scale beyond drift (more than a third either way:
  // another machine) compares them unscaled, as they will be used.
  const double scale = total_image > 0 && total_now > 0 ? total_now / total_image : 1.0;
  const bool drift = scale >= 0.75 && scale <= 4.0 / 3.0;
  if (drift) {
    for (double& v : by_image) v *= scale;
  }
  p.exec_error_flops = median_rel_error(by_flops, meas);
  p.exec_error_measured = median_rel_error(by_image, meas);
  p.exec_source =
      p.exec_error_measured <= (drift ? std::max(p.exec_error_flops, 0.15) : p.exec_error_flops) ? "measured" : "flops";

  // ---- calibration on whole swapped runs ----
  // Isolated reads miss what the pipeline adds per block (the compute thread waiting for the
  // reader thread, which must first get a core from the compute threads), and that cost decides
  // how many blocks the planner cuts. So: for several per-block costs, plan at a third of the
  // model (coarse to fine blocks), run each swapped (interleaved rounds: this machine's speed
  // drifts), and fit the per-block and per-inference costs so that the ring pipeline's
  // prediction (simulate_ms) matches what they measured.
  std::vector<double> cand_ms, meas_pipe, swapped_pipe;
  std::vector<Partition> cand_parts;
  const auto pipe_inputs = inputs_for(c, info, &shapes);
  std::vector<std::unique_ptr<Executor>> exs;
  const double isolated_block_ms = p.cost.block_ms;
  {
    std::vector<double> candidates;
    if (o.calibrate) {
      candidates = o.pipeline_block_ms;
      candidates.insert(candidates.begin(), p.cost.block_ms);
    }
    const std::uint64_t minimum = min_budget(info);
    for (double cms : candidates) {
      ExecutorOptions eo;
      eo.cost = p.cost;
      eo.cost.block_ms = cms;
      eo.measured_exec = p.exec_source == "measured";
      eo.gamma_ms_per_flop = p.gamma_ms_per_flop;
      eo.budget = std::max<std::uint64_t>(minimum, info.data_size / 3 + info.activation_bytes);
      ExecutionPlan plan = plan_execution(info, eo);
      bool seen = false;
      for (const auto& q : cand_parts) seen |= q.blocks == plan.blocks && q.resident == plan.resident;
      if (seen || plan.read_bytes == 0) continue;
      exs.push_back(Executor::open(path, eo));
      exs.back()->forward(clone_inputs(pipe_inputs));  // first fetches verify checksums: not timed
      if (exs.back()->plan().blocks != plan.blocks) throw Error(path + ": internal: the calibration plan moved");
      Partition part;
      part.blocks = plan.blocks;
      part.resident = plan.resident;
      part.ring_bytes = plan.read_ahead == ReadAhead::kPaper ? 0 : plan.arena_bytes;
      part.ring_depth = plan.read_ahead == ReadAhead::kTwoEnded ? 2 : 0;
      cand_parts.push_back(part);
      cand_ms.push_back(cms);
    }
  }
  // The whole model in memory, timed in the same rounds: the swapped runs are fitted by their
  // difference from it, round by round, so a machine that slows down for a while (this one
  // does, by up to 40 %) shifts both and leaves the swap overhead.
  std::unique_ptr<Executor> direct;
  if (!exs.empty()) {
    ExecutorOptions eo;
    eo.budget = UINT64_MAX / 4;
    eo.planner = ExecutorOptions::Planner::kEqual;  // one block, kept
    direct = Executor::open(path, eo);
    direct->forward(clone_inputs(pipe_inputs));
  }
  std::vector<std::vector<double>> times(exs.size());
  std::vector<double> direct_times;
  for (int r = 0; r < o.pipeline_iters && direct; ++r) {
    auto t0 = Clock::now();
    direct->forward(clone_inputs(pipe_inputs));
    direct_times.push_back(ms_since(t0));
    for (size_t e = 0; e < exs.size(); ++e) {
      t0 = Clock::now();
      exs[e]->forward(clone_inputs(pipe_inputs));
      times[e].push_back(ms_since(t0) - direct_times.back());  // overhead over in-memory, this round
    }
  }
  exs.clear();
  direct.reset();
  std::vector<double> pred_pipe;
  if (!times.empty()) {
    // overhead(run) = simulate(block_ms) - execution + inference_ms: for each block_ms on a grid,
    // inference_ms is the median residual (>= 0); the pair with the least median error wins.
    ExecutorOptions eo;
    eo.measured_exec = p.exec_source == "measured";
    eo.gamma_ms_per_flop = p.gamma_ms_per_flop;
    const auto costs = layer_costs(info, eo);
    double exec_total = 0;
    for (const auto& l : costs) exec_total += l.exec_ms;
    for (size_t e = 0; e < times.size(); ++e) {
      meas_pipe.push_back(median(times[e]));
      int swapped = 0;
      for (char r : cand_parts[e].resident) swapped += !r;
      swapped_pipe.push_back(swapped);
    }
    const double direct_ms = median(direct_times);
    auto overheads = [&](double block_ms) {
      CostModel cm = p.cost;
      cm.block_ms = block_ms;
      cm.inference_ms = 0;
      std::vector<double> v;
      for (auto part : cand_parts) {
        evaluate(costs, cm, &part);
        v.push_back(part.predicted_ms - exec_total);
      }
      return v;
    };
    // A swapped block costs at least kMinBlockMs (submit, wait, bind, unbind, pop). Noisy runs can
    // fit 0, and at 0 the planner cuts the model as finely as it can: resnet101 at 1/3 on host
    // storage in 177 blocks ran 148 ms, against 84 ms in 26 blocks.
    constexpr double kMinBlockMs = 0.1;
    double best_err = std::numeric_limits<double>::infinity();
    for (double g = kMinBlockMs; g <= 4.0001; g += 0.025) {
      const std::vector<double> base = overheads(g);
      std::vector<double> resid;
      for (size_t e = 0; e < base.size(); ++e) resid.push_back(meas_pipe[e] - base[e]);
      const double inf = std::max(0.0, median(resid));
      std::vector<double> pred, real;
      for (size_t e = 0; e < base.size(); ++e) {
        pred.push_back(direct_ms + base[e] + inf);
        real.push_back(direct_ms + meas_pipe[e]);
      }
      const double err = median_rel_error(pred, real);
      if (err < best_err - 1e-9) {
        best_err = err;
        p.cost.block_ms = g;
        p.cost.inference_ms = inf;
        pred_pipe = pred;
      }
    }
    p.pipeline_extra_block_ms = p.cost.block_ms - isolated_block_ms;
    for (auto& m : meas_pipe) m += direct_ms;  // reported as whole latencies
    p.pipeline_error = best_err;
    p.calibration_direct_ms = direct_ms;
    p.calibration_exec_ms = exec_total;
  }
  if (report) {
    json pipe = json::array();
    for (size_t r = 0; r < meas_pipe.size(); ++r) {
      pipe.push_back({{"block_ms", cand_ms[r]}, {"swapped_blocks", swapped_pipe[r]}, {"measured_ms", meas_pipe[r]},
                      {"predicted_ms", pred_pipe[r]}});
    }
    *report = {{"samples", X_read.size()},
               {"pipeline_runs", pipe},
               {"forward_ms_now", total_now},
               {"forward_ms_image", total_image},
               {"t_in_samples", json::array()}};
    for (size_t s = 0; s < X_read.size(); ++s) {
      (*report)["t_in_samples"].push_back({{"bytes", X_read[s][0]}, {"tensors", X_bind[s][0]},
                                           {"t_read_ms", y_read[s]}, {"t_bind_ms", y_bind[s]},
                                           {"pred_ms", pred_in[s]}, {"t_out_ms", y_out[s]}});
    }
  }
  return p;
}

int profile(const std::vector<std::string>& images, const Common& c, const std::string& out, int samples) {
  apply_common(c);
  if (images.empty()) throw Error("profile: give a swap image to measure with");
  MeasureOptions o;
  o.samples = std::max(4, samples);
  json report;
  DeviceProfile p = measure_profile(images[0], c, o, &report);
  const std::string path = out.empty() ? default_profile_path() : out;
  save_profile(path, p).throw_if_error();
  load_profile(path, &p).throw_if_error();  // what was written is what plan and run will read
  json j;
  {
    std::ifstream f(path);
    j = json::parse(f);  // the file as written, plus what the measurement saw
  }
  j["fitted_read_mb_s"] = 1.0 / (p.cost.alpha_ms_per_byte * 1e3);
  j["path"] = path;
  j["forward_ms_now"] = report["forward_ms_now"];
  j["forward_ms_image"] = report["forward_ms_image"];
  j["samples"] = report["samples"];
  j["pipeline_runs"] = report["pipeline_runs"];
  // The other images: how well this profile predicts their execution (no refit).
  MeasureOptions others = o;
  others.calibrate = false;  // the calibration belongs to the fitted image
  for (size_t i = 1; i < images.size(); ++i) {
    json r;
    DeviceProfile q = measure_profile(images[i], c, others, &r);
    j["also"].push_back({{"image", images[i]}, {"gamma_ms_per_flop", q.gamma_ms_per_flop},
                         {"exec_error_flops", q.exec_error_flops}, {"exec_error_measured", q.exec_error_measured},
                         {"t_in_error_with_this_profile", q.t_in_error}});
  }
  if (c.json) {
    j["t_in_samples"] = report["t_in_samples"];
    std::cout << j.dump() << "\n";
  } else {
    std::printf("device profile written to %s (%d threads)\n", path.c_str(), p.threads);
    std::printf("  raw O_DIRECT read      %.0f MB/s (one pass), %.0f MB/s sustained (passes back to back, 1 s)\n",
                p.raw_read_mb_s, p.sustained_read_mb_s);
    std::printf("  t_in  = %.3g ms/B * bytes + %.3g ms/tensor * tensors + %.3g ms   (isolated reads: median error %.1f %%)\n",
                p.cost.alpha_ms_per_byte, p.cost.beta_ms_per_tensor, p.cost.block_ms, 100 * p.t_in_error);
    std::printf("  t_out = %.3g ms/tensor * tensors   (median error %.1f %%)\n", p.cost.eta_ms_per_tensor,
                100 * p.t_out_error);
    std::printf("  t_ex  = %.3g ms/FLOP * FLOPs: median error %.1f %%; the image's per-layer times: %.1f %% -> using %s\n",
                p.gamma_ms_per_flop, 100 * p.exec_error_flops, 100 * p.exec_error_measured, p.exec_source.c_str());
    std::printf("  whole swapped runs: %.3f ms per swapped block, %.2f ms per inference (median error after: %.1f %%)\n",
                p.cost.block_ms, p.cost.inference_ms, 100 * p.pipeline_error);
  }
  return 0;
}

DeviceProfile device_profile(const std::string& image, const Common& c, const std::string& path_option) {
  const std::string path = path_option.empty() ? default_profile_path() : path_option;
  DeviceProfile p;
  Status s = load_profile(path, &p);
  std::string why;
  if (!s.ok()) {
    if (::access(path.c_str(), F_OK) == 0) throw Error(s.message());  // there but unreadable: refuse
    why = "there is no device profile at " + path;
  } else {
    why = profile_mismatch(p, at::get_num_threads());
    if (why.empty()) return p;
    why = "the device profile " + path + " is stale: " + why;
  }
  std::fprintf(stderr, "swapnet: %s; measuring one now from %s%s\n", why.c_str(), image.c_str(),
               s.ok() ? " (not saved; `swapnet profile IMAGE` replaces it)" : " (saved there)");
  MeasureOptions o;
  o.samples = 12;
  o.repeats = 2;
  o.exec_runs = 1;
  o.pipeline_block_ms = {0.5, 2};
  o.pipeline_iters = 2;
  p = measure_profile(image, c, o, nullptr);
  if (!s.ok()) {
    Status w = save_profile(path, p);
    if (!w.ok()) std::fprintf(stderr, "swapnet: %s (using the profile without saving it)\n", w.message().c_str());
  }
  return p;
}

}  // namespace cli
}  // namespace swapnet
