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
#include <memory>
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

// Isolated reads of random layer ranges, bound and unbound: what t_in and t_out are fitted to.
struct IoSamples {
  std::vector<std::pair<int, int>> ranges;  // [first, last] layers
  std::vector<std::vector<double>> X_read, X_bind, X_out;
  std::vector<double> y_read, y_bind, y_out;  // medians over the repeats, ms
  std::vector<double> pred_in;                // t_in as fitted, per sample
};

IoSamples sample_reads(BlockReader& reader, void* buf, Skeleton& sk, const ImageInfo& info, const MeasureOptions& o) {
  const int L = static_cast<int>(info.layers.size());
  const std::uint64_t largest = std::max<std::uint64_t>(std::min<std::uint64_t>(info.data_size / 2, 64ull << 20), 1);
  std::mt19937 rng(o.seed);
  IoSamples io;
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
      Status st = reader.read(info.layers[i].offset, bytes, buf);
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
    io.ranges.emplace_back(i, j);
    io.X_read.push_back({static_cast<double>(bytes), 1.0});
    io.y_read.push_back(median(t_read));
    io.X_bind.push_back({static_cast<double>(tensors)});
    io.y_bind.push_back(median(t_bind));
    io.X_out.push_back({static_cast<double>(tensors)});
    io.y_out.push_back(median(t_out));
  }
  return io;
}

// beta, eta and the per-block cost from the samples (alpha is the sustained rate's), and how
// well t_in and t_out predict them.
void fit_io(const std::string& path, IoSamples* io, DeviceProfile* p) {
  std::vector<double> meas_in, pred_out;
  if (io->X_read.size() < 4) {
    // A model too small to fit on: the sustained read rate and default per-tensor and
    // per-block costs.
    log(LogLevel::kWarn, path + ": only " + std::to_string(io->X_read.size()) +
                             " layer ranges with weights; using the read rate and default per-block costs");
  } else {
    p->cost.beta_ms_per_tensor = fit_nonnegative(io->X_bind, io->y_bind)[0];
    p->cost.eta_ms_per_tensor = fit_nonnegative(io->X_out, io->y_out)[0];
    // The fixed cost of a read beyond its bytes at the sustained rate (never negative: reads
    // after idling may beat that rate).
    std::vector<double> extra;
    for (size_t s = 0; s < io->X_read.size(); ++s) extra.push_back(io->y_read[s] - p->cost.alpha_ms_per_byte * io->X_read[s][0]);
    p->cost.block_ms = std::max(0.0, median(extra));
  }
  for (size_t s = 0; s < io->X_read.size(); ++s) {
    io->pred_in.push_back(p->cost.alpha_ms_per_byte * io->X_read[s][0] + p->cost.block_ms +
                          p->cost.beta_ms_per_tensor * io->X_bind[s][0]);
    meas_in.push_back(io->y_read[s] + io->y_bind[s]);
    pred_out.push_back(p->cost.eta_ms_per_tensor * io->X_out[s][0]);
  }
  p->t_in_error = median_rel_error(io->pred_in, meas_in);
  p->t_out_error = median_rel_error(pred_out, io->y_out);
}

// Execution times of the sampled ranges now, by gamma * FLOPs and by the image's recorded times.
struct ExecSamples {
  std::vector<double> meas, by_flops, by_image;
  double total_now = 0, total_image = 0;  // the whole forward, ms
};

// Per-layer times now (the whole model read into `buf` and bound), gamma fitted to FLOPs.
ExecSamples time_layers(const Common& c, BlockReader& reader, void* buf, Skeleton& sk, const ImageInfo& info,
                        const std::vector<std::pair<int, int>>& ranges, const MeasureOptions& o, DeviceProfile* p) {
  const int L = static_cast<int>(info.layers.size());
  Status st = reader.read(info.data_offset, info.data_size, buf);
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
  p->gamma_ms_per_flop = ff > 0 ? ft / ff : 0;
  ExecSamples ex;
  for (const auto& [i, j] : ranges) {
    double m = 0, f = 0, im = 0;
    for (int k = i; k <= j; ++k) {
      m += sk.layers()[k].time_ms;
      f += p->gamma_ms_per_flop * sk.layers()[k].flops;
      im += info.layers[k].time_ms;
    }
    ex.meas.push_back(m);
    ex.by_flops.push_back(f);
    ex.by_image.push_back(im);
  }
  for (int k = 0; k < L; ++k) {
    ex.total_now += sk.layers()[k].time_ms;
    ex.total_image += info.layers[k].time_ms;
  }
  sk.unbind_layers(0, L - 1);
  return ex;
}

// FLOPs or the image's recorded times: p->exec_source.
void choose_exec_source(ExecSamples ex, DeviceProfile* p) {
  // The choice holds for every image planned with this profile, and FLOPs describe
  // convolutions only: they predict resnet101's layer ranges within ~6 %, but yolov3's 35 %,
  // fcn_resnet101's 27 % and vgg19's 97 % off their packed times (GEMVs, batch norms,
  // upsampling are bound by memory, not FLOPs). So the image's recorded times are compared by
  // their shape (scaled to this run's total: a machine running 20 % slower than when the
  // image was packed slows every layer alike, and that drift passes) and kept unless they are
  // off by more than FLOPs are, and by more than 15 %: an image packed elsewhere. The planner
  // uses the recorded times as they are, so a scale beyond drift (more than a third either way:
  // another machine) compares them unscaled, as they will be used.
  const double scale = ex.total_image > 0 && ex.total_now > 0 ? ex.total_now / ex.total_image : 1.0;
  const bool drift = scale >= 0.75 && scale <= 4.0 / 3.0;
  if (drift) {
    for (double& v : ex.by_image) v *= scale;
  }
  p->exec_error_flops = median_rel_error(ex.by_flops, ex.meas);
  p->exec_error_measured = median_rel_error(ex.by_image, ex.meas);
  p->exec_source =
      p->exec_error_measured <= (drift ? std::max(p->exec_error_flops, 0.15) : p->exec_error_flops) ? "measured" : "flops";
}

// Note [Calibrating on whole swapped runs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Isolated reads miss what the pipeline adds per block (the compute thread waiting for the
// reader thread, which must first get a core from the compute threads), and that cost decides
// how many blocks the planner cuts. So: for several per-block costs, plan at a third of the
// model (coarse to fine blocks), run each swapped (interleaved rounds: this machine's speed
// drifts), and fit the per-block and per-inference costs so that the ring pipeline's
// prediction (simulate_ms) matches what they measured.
struct Calibration {
  std::vector<double> cand_ms;             // per candidate plan: the per-block cost it was planned with
  std::vector<Partition> cand_parts;       // its blocks
  std::vector<std::vector<double>> times;  // per candidate, per round: overhead over in-memory, ms
  std::vector<double> direct_times;        // per round: the whole model in memory, ms
  std::vector<double> meas_pipe, swapped_pipe, pred_pipe;  // per candidate, as reported
};

// One executor per distinct plan the candidate per-block costs give, each run once (its first
// fetches verify checksums: not timed).
std::vector<std::unique_ptr<Executor>> open_candidates(const std::string& path, const ImageInfo& info,
                                                       const MeasureOptions& o, const DeviceProfile& p,
                                                       const std::vector<c10::IValue>& pipe_inputs, Calibration* cal) {
  std::vector<std::unique_ptr<Executor>> exs;
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
    for (const auto& q : cal->cand_parts) seen |= q.blocks == plan.blocks && q.resident == plan.resident;
    if (seen || plan.read_bytes == 0) continue;
    exs.push_back(Executor::open(path, eo));
    exs.back()->forward(clone_inputs(pipe_inputs));  // first fetches verify checksums: not timed
    if (exs.back()->plan().blocks != plan.blocks) throw Error(path + ": internal: the calibration plan moved");
    Partition part;
    part.blocks = plan.blocks;
    part.resident = plan.resident;
    part.ring_bytes = plan.read_ahead == ReadAhead::kPaper ? 0 : plan.arena_bytes;
    part.ring_depth = plan.read_ahead == ReadAhead::kTwoEnded ? 2 : 0;
    cal->cand_parts.push_back(part);
    cal->cand_ms.push_back(cms);
  }
  return exs;
}

// The candidates timed in interleaved rounds, each beside the whole model in memory, then closed.
void time_candidates(const std::string& path, const MeasureOptions& o, const std::vector<c10::IValue>& pipe_inputs,
                     std::vector<std::unique_ptr<Executor>> exs, Calibration* cal) {
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
  cal->times.resize(exs.size());
  for (int r = 0; r < o.pipeline_iters && direct; ++r) {
    auto t0 = Clock::now();
    direct->forward(clone_inputs(pipe_inputs));
    cal->direct_times.push_back(ms_since(t0));
    for (size_t e = 0; e < exs.size(); ++e) {
      t0 = Clock::now();
      exs[e]->forward(clone_inputs(pipe_inputs));
      cal->times[e].push_back(ms_since(t0) - cal->direct_times.back());  // overhead over in-memory, this round
    }
  }
  exs.clear();
  direct.reset();
}

// overhead(run) = simulate(block_ms) - execution + inference_ms: for each block_ms on a grid,
// inference_ms is the median residual (>= 0); the pair with the least median error wins.
void fit_pipeline(const ImageInfo& info, double isolated_block_ms, Calibration* cal, DeviceProfile* p) {
  if (cal->times.empty()) return;
  ExecutorOptions eo;
  eo.measured_exec = p->exec_source == "measured";
  eo.gamma_ms_per_flop = p->gamma_ms_per_flop;
  const auto costs = layer_costs(info, eo);
  double exec_total = 0;
  for (const auto& l : costs) exec_total += l.exec_ms;
  for (size_t e = 0; e < cal->times.size(); ++e) {
    cal->meas_pipe.push_back(median(cal->times[e]));
    int swapped = 0;
    for (char r : cal->cand_parts[e].resident) swapped += !r;
    cal->swapped_pipe.push_back(swapped);
  }
  const double direct_ms = median(cal->direct_times);
  auto overheads = [&](double block_ms) {
    CostModel cm = p->cost;
    cm.block_ms = block_ms;
    cm.inference_ms = 0;
    std::vector<double> v;
    for (auto part : cal->cand_parts) {
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
    for (size_t e = 0; e < base.size(); ++e) resid.push_back(cal->meas_pipe[e] - base[e]);
    const double inf = std::max(0.0, median(resid));
    std::vector<double> pred, real;
    for (size_t e = 0; e < base.size(); ++e) {
      pred.push_back(direct_ms + base[e] + inf);
      real.push_back(direct_ms + cal->meas_pipe[e]);
    }
    const double err = median_rel_error(pred, real);
    if (err < best_err - 1e-9) {
      best_err = err;
      p->cost.block_ms = g;
      p->cost.inference_ms = inf;
      cal->pred_pipe = pred;
    }
  }
  p->pipeline_extra_block_ms = p->cost.block_ms - isolated_block_ms;
  for (auto& m : cal->meas_pipe) m += direct_ms;  // reported as whole latencies
  p->pipeline_error = best_err;
  p->calibration_direct_ms = direct_ms;
  p->calibration_exec_ms = exec_total;
}

json measure_report(const IoSamples& io, const ExecSamples& ex, const Calibration& cal) {
  json pipe = json::array();
  for (size_t r = 0; r < cal.meas_pipe.size(); ++r) {
    pipe.push_back({{"block_ms", cal.cand_ms[r]}, {"swapped_blocks", cal.swapped_pipe[r]}, {"measured_ms", cal.meas_pipe[r]},
                    {"predicted_ms", cal.pred_pipe[r]}});
  }
  json report = {{"samples", io.X_read.size()},
                 {"pipeline_runs", pipe},
                 {"forward_ms_now", ex.total_now},
                 {"forward_ms_image", ex.total_image},
                 {"t_in_samples", json::array()}};
  for (size_t s = 0; s < io.X_read.size(); ++s) {
    report["t_in_samples"].push_back({{"bytes", io.X_read[s][0]}, {"tensors", io.X_bind[s][0]},
                                      {"t_read_ms", io.y_read[s]}, {"t_bind_ms", io.y_bind[s]},
                                      {"pred_ms", io.pred_in[s]}, {"t_out_ms", io.y_out[s]}});
  }
  return report;
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
  std::unique_ptr<BlockReader> reader;
  BlockReader::open(path, ReaderOptions{}, &reader).throw_if_error();
  void* buf = alloc_aligned(std::max<std::uint64_t>(info.data_size, kImageAlign));
  if (buf == nullptr) throw Error(path + ": cannot allocate " + format_bytes(info.data_size) + " to profile with");
  Skeleton sk = Skeleton::from_image(info, path);
  IoSamples io = sample_reads(*reader, buf, sk, info, o);
  fit_io(path, &io, &p);

  // ---- execution: per-layer times now vs FLOPs and vs the image's recorded times ----
  const ExecSamples ex = time_layers(c, *reader, buf, sk, info, io.ranges, o, &p);
  free_aligned(buf);
  choose_exec_source(ex, &p);

  // ---- calibration on whole swapped runs (Note [Calibrating on whole swapped runs]) ----
  std::vector<std::string> shapes;
  const auto pipe_inputs = inputs_for(c, info, &shapes);
  Calibration cal;
  const double isolated_block_ms = p.cost.block_ms;
  time_candidates(path, o, pipe_inputs, open_candidates(path, info, o, p, pipe_inputs, &cal), &cal);
  fit_pipeline(info, isolated_block_ms, &cal, &p);
  if (report) *report = measure_report(io, ex, cal);
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
