// Costs learned in service: the CostLearner's window (Note [Learning the costs in service],
// Note [Noise in the window]) and the learned-costs store (Note [Learned costs kept]).
#include "cost_learner.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

namespace swapnet {

// Note [Learning the costs in service]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Plans are only as good as the layer times and the read rate they are made with: the image's
// times were measured once, when it was packed (on the packing machine, in whatever else it was
// doing then: a few busy seconds of this VM made vgg19's first layers 2-5x their time), and the
// read rate is the device profile's (measured on another day, or on a disk other than the one
// the image is on: a host-speed profile on a 400 MB/s disk made resnet101's plan predict 105 ms
// for 382). So every inference on the CPU times each layer from the moment its bytes have
// landed (what the pipeline really costs: the reads' own interference with the compute is in
// it) and the reader counts its bytes and the time the disk had them (past the bursts a
// throttle serves after idling: Note [A sustained read rate] in reader.cpp). Every `learn_after`
// inferences and learn_window_ms (a sliding window), the plan in force is predicted with the
// mean of the middle half of each layer's times and the window's read rate (Note [Noise in the
// window]); when that is more than `learn_threshold` off its prediction with the costs it was
// planned with, and more than twice the window's own noise, they replace those. The criterion is the
// plan's time, not each cost: three timings of a 0.2 ms layer differ by 30 % and mean nothing
// (resnet101's layer times summed |measured - planned| to 15-32 % of their sum between two
// windows on a quiet machine, with sums 83 and 88 ms), nor does a read rate where the plan
// computes far longer than it reads. Then the rest of the executor's life is planned with them: a re-plan at the same budget, between two inferences (nothing is
// read twice but what was read ahead for the next inference), or, with a budget grid, a new
// grid built on a thread of its own and adopted at the first inference boundary after it is
// done (seconds for a large model: the inferences do not wait for it). The window then starts
// again, so one more re-plan takes learn_after more inferences and another change as large.
// The read rate needs 4 MiB read in the window (a plan that keeps everything resident reads
// nothing: its rate stays). Outputs are the same under any plan; only the blocks change.
namespace {
std::atomic<int> g_grid_builds{0};
std::atomic<std::uint64_t> g_grid_epoch{0};
}  // namespace

GridBuild::GridBuild() {
  ++g_grid_builds;
  ++g_grid_epoch;
}
GridBuild::~GridBuild() {
  ++g_grid_epoch;
  --g_grid_builds;
}
std::uint64_t GridBuild::epoch() { return g_grid_epoch.load(); }
int GridBuild::running() { return g_grid_builds.load(); }

// Note [Noise in the window]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A window's costs are an estimate, and how good one depends on how much its inferences
// differ. Alone on this VM, resnet101's layer times summed 83-88 ms from inference to inference;
// with resnet18 and mobilenet_v2 served side by side on its two cores (four intra-op threads and
// two readers), each model's sum swung with whether the other was computing at the same time:
// mobilenet_v2's from 3 to 39 ms, resnet18's from 9 to 90, and the read rate from 636 to
// 3662 MB/s. A window of three drew its medians from that at random, and every window or two
// one of them was "off" by 30-100 %: 7 and 5 re-plans in 6 s of serve --learn 3, each splitting
// the budget again (9 splits), the doubled threshold (the learn gate) halving back within a
// second of mobilenet_v2's 85 inferences a second. And inputs of two sizes in turn (a
// detector's crops) make each layer's times two clusters, whose median is one or the other as
// the window's count tips: resnet18 given 128- and 64-pixel inputs in turn learned its layers at
// 8.8 ms, then 12.4, then again.
//
// So:
//  - A window spans ExecutorOptions::learn_window_ms (1 s) as well as learn_after inferences: a
//    second of mobilenet_v2's inferences is the mixture its plan runs in, where three were one
//    moment of it (resnet101, 300 ms an inference, still decides after four).
//  - Each layer's time is the mean of the middle half of its times in the window (a quarter set
//    aside at each end, one at least: of three, the median, as before): it sets a disturbed
//    inference aside as a median does, and moves by a step of 1/(n/2) of the gap between two
//    clusters where the count tips, not across all of it.
//  - Each inference's own costs predict the plan in force too (its layer times and its reads'
//    rate: one simulation per inference, as cheap as the plan's prediction), and the window's
//    noise is 1.2533 s / sqrt(n) / c, s the deviation of those predictions and c their middle
//    mean (the large-sample standard error of a median, relative). A window re-plans only when
//    its error is more than twice that, as well as more than the gate; a window too noisy to
//    tell grows, an inference at a time, up to kLearnWindowMost inferences, and slides by one;
//    once its noise is below the gate again it slides back to the least that spans its time.
// A model alone decides as before (twice the noise of resnet101's 83-88 ms is ~4 %, under the
// 10 % threshold).
constexpr std::size_t kLearnWindowMost = 256;  // inferences a window holds at most

namespace {

// The mean of the middle half of `v` (sorted here): a quarter of the values set aside at each
// end, one at least (three values: their median).
double middle_mean(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  if (n == 0) return 0;
  const std::size_t cut = n >= 3 ? std::max<std::size_t>(1, n / 4) : 0;
  double sum = 0;
  for (std::size_t i = cut; i < n - cut; ++i) sum += v[i];
  return sum / static_cast<double>(n - 2 * cut);
}

// 1.2533 s / sqrt(n) / middle_mean(x): the window's noise (Note [Noise in the window]).
double window_noise(const std::deque<double>& x) {
  const std::size_t n = x.size();
  if (n < 2) return 0;
  double mean = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(n);
  double var = 0;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= static_cast<double>(n - 1);
  std::vector<double> sorted(x.begin(), x.end());
  const double center = middle_mean(sorted);
  return center > 0 ? 1.2533 * std::sqrt(var / static_cast<double>(n)) / center : 0;
}

std::string learned_fingerprint(const ImageInfo& info) {
  std::vector<std::uint64_t> v;
  v.reserve(2 * info.layers.size() + 1);
  v.push_back(info.data_size);
  for (const ImageLayer& L : info.layers) {
    v.push_back(L.checksum);
    v.push_back(L.size);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(checksum(v.data(), v.size() * sizeof(std::uint64_t))));
  return hex;
}

}  // namespace

// Note [Learned costs kept]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// What an executor learns (Note [Learning the costs in service]) would otherwise die with it: a
// robot's program that starts again plans with the packing machine's layer times and the
// profile's read rate, and takes learn_after inferences and a re-plan (with a grid, a rebuild)
// to learn them again. With ExecutorOptions::learn_store, each time learned costs are taken they
// are written (whole, to a temporary file renamed over the old) as
//   {"swapnet_learned": 1, "fingerprint": F, "layers": L, "device": D, "threads": T,
//    "layer_ms": [...] or null, "read_mb_s": R or 0}
// and at open, with learning on, a file whose fingerprint (the image's layer checksums and
// sizes), device ("cpu" where a file has none; a GPU's with its name) and, on the CPU, intra-op
// thread count match is
// planned with from the first inference: layer times measured with other threads, on another
// device (a GPU's are 10-100x the CPU's: Note [Timing layers on the GPU]), or for another image
// (a re-pack changes the checksums), are not this executor's. Learning goes on from there: costs that no longer hold are learned
// again. A store that cannot be read or written is said once (warn) and changes nothing else;
// with learn_after 0 the store is neither read nor written (costs as packed and profiled).
std::optional<LearnedCosts> load_learned_costs(const std::string& path, const std::string& image,
                                               const ImageInfo& info, const std::string& device, bool times) {
  if (path.empty()) return std::nullopt;
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::nullopt;  // nothing learned yet
  std::ifstream in(path);
  if (!in) {
    log_once(LogLevel::kWarn, "learn_store_read:" + path,
             image + ": learned costs not read from " + path + ": " + std::strerror(errno));
    return std::nullopt;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    const std::string fp = learned_fingerprint(info);
    const int threads = at::get_num_threads();
    if (j.value("swapnet_learned", 0) != 1) throw Error("not a learned-costs file (no \"swapnet_learned\": 1)");
    if (j.at("fingerprint").get<std::string>() != fp) {
      throw Error("its costs were learned for another image (fingerprint " + j.at("fingerprint").get<std::string>() +
                  ", this image's " + fp + ")");
    }
    const std::string was = j.value("device", std::string("cpu"));
    if (was != device) throw Error("its costs were learned on " + was + ", this executor runs on " + device);
    if (device == "cpu" && j.at("threads").get<int>() != threads) {
      throw Error("its costs were learned with " + std::to_string(j.at("threads").get<int>()) +
                  " intra-op threads, this process has " + std::to_string(threads));
    }
    LearnedCosts out;
    const nlohmann::json& t = j.at("layer_ms");
    if (!t.is_null() && times) {
      if (t.size() != info.layers.size()) {
        throw Error("it has " + std::to_string(t.size()) + " layer times, the image " +
                    std::to_string(info.layers.size()) + " layers");
      }
      std::vector<double> ms;
      for (std::size_t i = 0; i < t.size(); ++i) {
        ms.push_back(t[i].get<double>());
        if (!(ms.back() >= 0) || !std::isfinite(ms.back())) throw Error("layer " + std::to_string(i) + "'s time is not a time");
      }
      out.layer_ms = std::move(ms);
    }
    const double mb_s = j.at("read_mb_s").get<double>();
    if (mb_s > 0 && std::isfinite(mb_s)) out.read_mb_s = mb_s;
    log(LogLevel::kInfo, image + ": planned with the costs learned before (" + path + ":" +
                             (out.layer_ms ? " layer times" : "") +
                             (out.read_mb_s > 0 ? " read rate " + std::to_string(mb_s) + " MB/s" : "") + ")");
    return out;
  } catch (const std::exception& e) {
    log_once(LogLevel::kWarn, "learn_store_read:" + path + ":" + e.what(),
             image + ": learned costs in " + path + " not used: " + e.what() + " (they are learned again)");
    return std::nullopt;
  }
}

bool store_learned_costs(const std::string& path, const std::string& image, const ImageInfo& info,
                         const std::string& device, const std::vector<double>* layer_ms, double read_mb_s) {
  nlohmann::json j;
  j["swapnet_learned"] = 1;
  j["image"] = image;
  j["fingerprint"] = learned_fingerprint(info);
  j["layers"] = info.layers.size();
  j["device"] = device;
  j["threads"] = at::get_num_threads();
  if (layer_ms != nullptr) {
    j["layer_ms"] = *layer_ms;
  } else {
    j["layer_ms"] = nullptr;
  }
  j["read_mb_s"] = read_mb_s;
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  std::string why;
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!(out << j.dump(1) << '\n') || !(out.flush())) why = std::strerror(errno);
  }
  if (why.empty() && std::rename(tmp.c_str(), path.c_str()) != 0) why = std::strerror(errno);
  if (!why.empty()) {
    (void)std::remove(tmp.c_str());
    log_once(LogLevel::kWarn, "learn_store_write:" + path,
             image + ": learned costs not kept in " + path + ": " + why + " (they are used in this process)");
    return false;
  }
  return true;
}

CostLearner::IoCount CostLearner::io_count(const BlockReader& r) {
  return {r.sustained(), {r.bytes_read(), r.busy_seconds()}, std::chrono::steady_clock::now()};
}

void CostLearner::begin() {
  layer_ms_now_.assign(layers_, std::nan(""));
  grid_epoch_ = GridBuild::epoch();
}

void CostLearner::time_layer(int k, double ms) {
  if (k >= 0 && static_cast<std::size_t>(k) < layer_ms_now_.size()) layer_ms_now_[k] = ms;
}

void CostLearner::restart(const IoCount& now) {
  window_.clear();
  pred_.clear();
  io_.clear();
  io_.push_back(now);
}

bool CostLearner::timed(bool whole) const {
  bool timed = whole && layer_ms_now_.size() == layers_;
  for (double v : layer_ms_now_) timed = timed && std::isfinite(v);
  return timed;
}

namespace {

// The disk's rate between two of the reader's counts: the sustained one, without the bursts a
// throttle serves after idling (Note [A sustained read rate] in reader.cpp), where at least
// `least` bytes of it were read; else all bytes over all busy time, where that many were (a
// pipeline whose disk idles between short reads leaves few sustained samples, and there the
// rate matters little to its plan); else 0.
double rate_between(const CostLearner::IoCount& a, const CostLearner::IoCount& b, double least) {
  for (auto part : {&CostLearner::IoCount::sustained, &CostLearner::IoCount::all}) {
    const double bytes = static_cast<double>((b.*part).bytes - (a.*part).bytes);
    const double seconds = (b.*part).seconds - (a.*part).seconds;
    if (bytes >= least && seconds > 0) return bytes / seconds;
  }
  return 0.0;
}

}  // namespace

double CostLearner::window_span_ms(std::size_t from) const {
  return std::chrono::duration<double, std::milli>(io_.back().at - io_[from].at).count();
}

void CostLearner::push(const IoCount& now, const std::vector<LayerCost>& planned, const CostModel& model,
                       const Predict& predict) {
  window_.push_back(layer_ms_now_);
  io_.push_back(now);
  // This inference's own costs, the plan in force predicted with them (Note [Noise in the window]).
  std::vector<LayerCost> c = planned;
  CostModel k = model;
  if (config_.times) {
    for (std::size_t i = 0; i < layers_; ++i) c[i].exec_ms = layer_ms_now_[i];
  }
  const double planned_rate = model.alpha_ms_per_byte > 0 ? 1e3 / model.alpha_ms_per_byte : 0;
  const double r = rate_between(io_[io_.size() - 2], io_.back(), 1 << 20);
  if (r > 0 && planned_rate > 0) k.alpha_ms_per_byte = 1e3 / r;
  pred_.push_back(predict(c, k));
}

void CostLearner::slide() {
  ++learned_.windows;
  // This inference's share of the half-life: 1/100, or its time over 10 s where that is less.
  const double per = std::min(0.01, window_span_ms(io_.size() - 2) / 1e4);
  gate_ = std::max(config_.threshold, std::pow(0.5, per) * gate_);
  // The window slides: by one where it is noisy or at its most, else back to the least that
  // still spans learn_window_ms (learn_after inferences at least).
  const bool noisy = 2 * learned_.noise > gate_;
  do {
    window_.pop_front();
    pred_.pop_front();
    io_.pop_front();
  } while (!noisy && static_cast<int>(window_.size()) >= config_.every && window_span_ms(1) >= config_.window_ms);
}

std::optional<CostLearner::Decision> CostLearner::observe(const IoCount& now, const std::vector<double>& planned_ms,
                                                          const std::vector<LayerCost>& planned,
                                                          const CostModel& model, const Predict& predict) {
  // An inference that overlapped a grid being built (this model's or another's: a thread of its
  // own, at the lowest priority, but a core all the same) is not timed at this plan's pace:
  // serve with two models learned mobilenet_v2's layers at 4, 12, 31 and 4 ms in turn, each
  // build slowing the inferences the next re-plan was made from. It does not count.
  if (grid_epoch_ != GridBuild::epoch() || GridBuild::running() > 0) return std::nullopt;
  push(now, planned, model, predict);
  const int every = config_.every;
  const double planned_rate = model.alpha_ms_per_byte > 0 ? 1e3 / model.alpha_ms_per_byte : 0;
  // A window is learn_after inferences and learn_window_ms at least (Note [Noise in the window]).
  const std::size_t most = std::max<std::size_t>(every, kLearnWindowMost);
  if (static_cast<int>(window_.size()) < every || (window_span_ms(0) < config_.window_ms && window_.size() < most)) {
    return std::nullopt;
  }
  Window w = measure(planned_ms, planned_rate);
  predict_window(w, planned, model, predict);
  if (!stands_out(most)) return std::nullopt;
  return decide(w, planned, model, predict);
}

// The window's costs (each layer's middle mean, the read rate) against those planned with,
// into stats(); `planned_rate` in bytes per second (0: none).
CostLearner::Window CostLearner::measure(const std::vector<double>& planned_ms, double planned_rate) {
  const std::size_t L = layers_;
  Window w;
  w.planned_rate = planned_rate;
  w.med.assign(L, 0.0);  // each layer's middle mean (Note [Noise in the window])
  std::vector<double> v;
  for (std::size_t i = 0; i < L; ++i) {
    v.clear();
    for (const auto& x : window_) v.push_back(x[i]);
    w.med[i] = middle_mean(v);
    const double t = planned_ms[i];
    w.planned_sum += t;
    w.measured += w.med[i];
    w.diff += std::fabs(w.med[i] - t);
  }
  w.rate = rate_between(io_.front(), io_.back(), 4.0 * (1 << 20));  // bytes per second
  Executor::Learning& l = learned_;
  l.layer_error = config_.times ? (w.planned_sum > 0 ? w.diff / w.planned_sum : (w.measured > 0 ? INFINITY : 0)) : 0;
  l.measured_layers_ms = w.measured;
  l.planned_layers_ms = w.planned_sum;
  l.read_mb_s = w.rate / 1e6;
  l.planned_read_mb_s = w.planned_rate / 1e6;
  l.window = window_.size();
  return w;
}

// The plan in force, predicted with the costs measured and with those planned with; their
// ratio into stats().plan_error.
void CostLearner::predict_window(Window& w, const std::vector<LayerCost>& planned, const CostModel& model,
                                 const Predict& predict) {
  w.costs = planned;
  w.cm = model;
  w.reads = w.rate > 0 && w.planned_rate > 0;
  if (config_.times) {
    for (std::size_t i = 0; i < layers_; ++i) w.costs[i].exec_ms = w.med[i];
  }
  if (w.reads) w.cm.alpha_ms_per_byte = 1e3 / w.rate;
  w.now_planned = predict(planned, model);
  w.now_measured = predict(w.costs, w.cm);
  learned_.plan_error = w.now_planned > 0 ? w.now_measured / w.now_planned - 1 : 0;
}

// Whether the window's plan error stands out of the gate and of its noise; where not, the
// window grows (noisy, not at its `most` inferences yet) or slides on.
bool CostLearner::stands_out(std::size_t most) {
  Executor::Learning& l = learned_;
  // Each re-plan doubles the error the next one needs; it halves back over 100 inferences or 10 s
  // without one, whichever is longer (down to learn_threshold). Costs that change from window to
  // window by more than the threshold (two small models sharing this VM's two cores:
  // mobilenet_v2's layers summed 3.3-12 ms from window to window, 7 re-plans in 4 s of serve
  // --learn 3; at 85 inferences a second, 100 of them had halved the gate back within 1.2 s)
  // stop re-planning; a model that kept still a while is as quick to learn as at first.
  if (gate_ < config_.threshold) gate_ = config_.threshold;
  // And the error must stand out of the window's own noise (Note [Noise in the window]): twice
  // the standard error of its center; a noisy window grows (up to kLearnWindowMost inferences)
  // before it decides.
  l.noise = window_noise(pred_);
  if (!(std::fabs(l.plan_error) > std::max(gate_, 2 * l.noise))) {
    if (2 * l.noise > gate_ && window_.size() < most) return false;  // the window grows
    slide();
    return false;
  }
  return true;
}

// A window that stands out: the costs to take, the gate doubled and the window started again.
CostLearner::Decision CostLearner::decide(const Window& w, const std::vector<LayerCost>& planned,
                                          const CostModel& model, const Predict& predict) {
  Executor::Learning& l = learned_;
  ++l.windows;
  gate_ = std::min(1e3, 2 * gate_);
  // Each kind of cost replaces the planned one where it alone moves the prediction enough (both
  // where neither does alone): the read rate by half the threshold, the layer times by all of
  // it. Layer times measured in the pipeline carry the reads' interference with the compute,
  // which changes with the plan: vgg19 with a host-speed profile at 1 GB/s learned layers 20 %
  // slower than packed and, with both learned, planned 1.03-1.04 x slower than with the right
  // profile; with the rate alone it plans as the right profile does (Note [Learning the costs in
  // service]).
  const double now_planned = w.now_planned;
  auto moves = [&](double p, double by) { return now_planned > 0 && std::fabs(p / now_planned - 1) > by; };
  Decision d;
  d.take_times = config_.times && moves(predict(w.costs, model), config_.threshold);
  d.take_reads = w.reads && moves(predict(planned, w.cm), 0.5 * config_.threshold);
  if (!d.take_times && !d.take_reads) d.take_times = config_.times, d.take_reads = w.reads;
  if (d.take_times) d.layer_ms = w.med;
  d.cost = d.take_reads ? w.cm : model;
  const IoCount last = io_.back();
  restart(last);
  ++l.replans;
  d.what = "the plan in force would take " + std::to_string(w.now_measured) + " ms with the costs measured, not the " +
           std::to_string(now_planned) + " planned (layers " + std::to_string(w.measured) + " ms in all, not " +
           std::to_string(w.planned_sum);
  if (w.reads) {
    d.what += "; reads at " + std::to_string(static_cast<long long>(w.rate / 1e6)) + " MB/s, not " +
              std::to_string(static_cast<long long>(w.planned_rate / 1e6));
  }
  d.what += "; noise " + std::to_string(static_cast<long long>(std::lround(100 * l.noise))) + " %";
  d.what += std::string("): ") + (d.take_times && d.take_reads ? "both" : d.take_times ? "the layer times" : "the read rate") +
            " learned";
  return d;
}

}  // namespace swapnet
