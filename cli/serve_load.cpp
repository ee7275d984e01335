// swapnet serve's load and run rules: direct inference of each model before the run (the
// reference outputs, and its latency alone), the periods scaled to the scenario's load on the
// machine at hand, and the warm-up chosen (Note [Load and run rules]).
//
// Note [Load and run rules]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A scenario's periods written in milliseconds mean a different load on every machine, and on
// this VM on every day: self_driving_slo.json, calibrated at 92 % busy on one day, met 0 of its
// deadlines under `threads` on a slower one. A scenario (or --load) may instead state its load:
// the share of time the machine would be busy serving its requests one at a time, each by
// direct inference on all its cores,
//   load = sum over streams of (sum over the stream's models of latency) / period,
// (where the disk decides, a model's latency is its swapped bound: Note [A load that counts the
// disk]),
// latencies measured by serve before the run (the fastest of three direct inferences after a
// first, with one intra-op thread per core: what the machine can do; this VM's speed drifts by
// 40 % from one minute to the next, and a median taken in a slow spell made yolov3 654 ms where
// it then ran in 360). Two passes through the models, the fastest of both: with one, three runs
// of the same 60 s budget trace measured vgg19 at 194, 517 and 276 ms and fcn_resnet101 at 518,
// 310 and 273 ms (2026-11-27), so the same scenario asked 1.9x different periods of vgg19 from
// one run to the next. Four runs of each build interleaved (self_driving_slo, 2026-11-27): the
// written load measured 0.570-0.877 with one pass (1.54x; fcn_resnet101 284-582 ms) and
// 0.524-0.604 with two (1.15x; yolov3 still 227-410 ms once), for ~4 s more at start with the
// paper's four models. Not the sum of one-thread latencies over the
// cores: this VM's two vCPUs run two one-thread inferences each about 2x slower than alone
// (the contention serve's estimates learn), so "0.9 of two cores" by one-thread latencies was
// 1.8 of what the machine can do, and every policy failed. Every period, jitter and deadline is scaled
// by one factor so that the written ones' load becomes the one asked: the scenario's periods
// give the streams' ratios and its deadlines their ratio to the periods. serve prints the
// latencies, the factor and the periods (stderr; "load" in --json).
// Run rules, after MLPerf's: requests arriving in the first warmup_s seconds are not counted
// (the schedulers' estimates and the page cache settle; default: two of the longest period, at
// most a fifth of the run); the run goes on past duration_s until every open-loop model has had
// min_requests counted arrivals (at most four times duration_s; said when it stops short), and
// arrivals' jitter comes from fixed seeds (one per stream), so two runs ask the same.
//
// Note [A load that counts the disk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Direct latencies are compute alone: the weights sit in memory. A swapped model also waits for
// the bytes its budget cannot keep, and where the disk is slow that, not compute, is its time:
// on 2026-11-28 this VM's disk read at ~0.85 GB/s, and self_driving_slo at "load 0.9" by direct
// latencies was overloaded under every policy (vgg19 dropped 15-23 requests in 30 s). So a model
// counts the least latency any plan in its budget can have on this disk, the physical bound
// that `run` and the demo compare with: the larger of its direct latency and what its budget
// leaves to read (min_read_bytes, and the memory bound's overlap of reads with compute) at the
// disk's sustained raw O_DIRECT rate (raw_read_mb_s over the largest image for 0.5 s, at most
// an emulated disk's rate), each model at the budget the runtime gave it at open. A bound, not
// the swapped latency measured: it is the same for every scheduler (`threads` and `lst` get the
// same periods: a model's latency under `threads` shares the cores with the others), it needs no
// run of the model, and "load 1" means the machine's compute and disk could do no more. Where the
// disk reads at memory speed the bound is the direct latency and nothing changes; a budget that
// changes during the run (a trace) does not change the periods. Where every model fits in its
// budget (nothing to read) the disk is not timed.
//
// Note [Warm-up inferences]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Before the first arrival, each model serves kWarmUpInferences requests of its input, one at
// a time and not counted. A block's first runs in a process are cold (TorchScript profiles and
// optimises a method at its first calls; oneDNN makes its primitives), and a model that arrives
// every second or so ran its blocks for the first time well into the warm-up seconds: with
// self_driving_slo.json at load 0.9 (2026-11-28) yolov3's blocks were mis-estimated by a mean
// 0.72 in the run's second five seconds against 0.12-0.19 later, vgg19's by 0.29 against
// 0.14-0.19. MLPerf's LoadGen likewise runs a warm-up before the timed run. Two: the cold run,
// and a warm one for the estimates to start from (Note [A block's first run] in
// scheduler/src/estimates.cpp). Every policy gets them, `threads` included; scenarios without
// deadlines do not (nothing there is estimated or dropped, and their first requests count).
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <thread>

#include "inputs.h"
#include "serve.h"

namespace swapnet {
namespace cli {

c10::IValue direct_output(const ScenarioModel& m, const ImageInfo& info, const std::vector<c10::IValue>& inputs,
                          int timed_runs, double* fastest_ms) {
  c10::IValue out;
  std::exception_ptr failed;
  std::thread([&] {
    try {
      at::internal::lazy_init_num_threads();
      at::set_num_threads(m.rt.threads);
      c10::InferenceMode g;
      const bool cuda = m.device == "cuda";
      InMemory direct(m.rt.image, info, cuda);
      auto once = [&] {
        std::vector<c10::IValue> in = clone_inputs(inputs);
        if (cuda) inputs_to_cuda(&in);  // as the executor moves them
        return direct.sk.forward(std::move(in));
      };
      out = once();
      std::vector<double> ms;
      for (int k = 0; k < timed_runs; ++k) {
        const auto t = Clock::now();
        (void)once();
        ms.push_back(ms_since(t));
      }
      if (fastest_ms && !ms.empty()) *fastest_ms = *std::min_element(ms.begin(), ms.end());
    } catch (...) {
      failed = std::current_exception();
    }
  }).join();
  if (failed) std::rethrow_exception(failed);
  return out;
}

namespace {

// The load the scenario's streams put on the machine with these (whole-machine) latencies.
double load_of(const Scenario& s, const LoadInfo& l) {
  double busy = 0;  // machine-ms per ms
  for (size_t i = 0; i < s.models.size(); ++i) {
    const ScenarioModel& m = s.models[i];
    if (m.group < 0 && m.period_ms > 0) busy += l.counted_ms(i) / m.period_ms;
  }
  for (const auto& g : s.groups) {
    double ms = 0;
    for (int i : g.members) ms += l.counted_ms(static_cast<size_t>(i));
    if (g.period_ms > 0) busy += ms / g.period_ms;
  }
  return busy;
}

}  // namespace

void measure_disk(const Runtime& rt, ServeSetup* setup) {
  LoadInfo& l = setup->load;
  const Scenario& s = setup->s;
  const std::vector<ModelStatus> st = rt.status();
  l.bound_ms.assign(s.models.size(), 0);
  l.budget.assign(s.models.size(), 0);
  std::vector<std::uint64_t> least(s.models.size(), 0);  // bytes a plan in the budget must read
  size_t largest = 0;
  for (size_t i = 0; i < s.models.size(); ++i) {
    l.budget[i] = st[i].budget;
    ExecutorOptions o = s.models[i].rt.options;
    o.budget = st[i].budget;
    if (st[i].budget > 0) least[i] = min_read_bytes(setup->infos[i], o);  // paused at open: its direct latency
    if (setup->infos[i].data_size > setup->infos[largest].data_size) largest = i;
  }
  // Every model in memory (a budget of 1000 %): nothing to read, no disk to time.
  if (*std::max_element(least.begin(), least.end()) == 0) return;
  const ImageInfo& big = setup->infos[largest];
  try {
    l.read_mb_s = raw_read_mb_s(s.models[largest].rt.image, big.data_offset, big.data_offset + big.data_size, 0.5);
  } catch (const std::exception& e) {  // no O_DIRECT or io_uring there: the engine's reader falls back, so do we
    l.read_mb_s = 0;
    std::fprintf(stderr, "swapnet: serve: the disk's rate not measured (%s): the load counts direct latencies only\n",
                 e.what());
    return;
  }
  for (size_t i = 0; i < s.models.size(); ++i) {
    if (st[i].budget == 0 || !(l.read_mb_s > 0)) continue;
    const double b = image_reserve_bound_ms(setup->infos[i], st[i].budget, l.direct_ms[i], l.read_mb_s, least[i]);
    if (std::isfinite(b)) l.bound_ms[i] = b;
  }
}

std::string apply_load(ServeSetup* setup) {
  Scenario& s = setup->s;
  LoadInfo& l = setup->load;
  l.target = s.load;
  l.cores = usable_cores();
  l.written = load_of(s, l);
  if (!(l.written > 0)) throw Error("serve: a load (" + std::to_string(s.load) + ") needs models or groups with period_ms");
  l.scale = l.written / l.target;
  for (auto& m : s.models) {
    m.period_ms *= l.scale;
    m.jitter_ms *= l.scale;
    m.slo_ms *= l.scale;
  }
  for (auto& g : s.groups) {
    g.period_ms *= l.scale;
    g.jitter_ms *= l.scale;
    g.slo_ms *= l.scale;
  }
  char buf[160];
  std::string said = "measured direct latencies (ms, one request on all " + std::to_string(l.cores) + " cores):";
  for (size_t i = 0; i < s.models.size(); ++i) {
    std::snprintf(buf, sizeof buf, " %s %.0f", s.models[i].rt.name.c_str(), l.direct_ms[i]);
    said += buf;
  }
  if (l.read_mb_s > 0) {
    std::snprintf(buf, sizeof buf, "; at its budget on this disk (%.0f MB/s), the least latency:", l.read_mb_s);
    said += buf;
    for (size_t i = 0; i < s.models.size(); ++i) {
      std::snprintf(buf, sizeof buf, " %s %.0f", s.models[i].rt.name.c_str(), l.counted_ms(i));
      said += buf;
    }
  }
  std::snprintf(buf, sizeof buf, "; load %.2f (written %.2f): periods and deadlines x%.3f:", l.target, l.written,
                l.scale);
  said += buf;
  for (const auto& m : s.models) {
    if (m.group >= 0 || m.period_ms <= 0) continue;
    std::snprintf(buf, sizeof buf, " %s every %.0f ms, due in %.0f", m.rt.name.c_str(), m.period_ms, m.slo_ms);
    said += buf;
  }
  for (const auto& g : s.groups) {
    std::snprintf(buf, sizeof buf, " group %s every %.0f ms, due in %.0f", g.name.c_str(), g.period_ms, g.slo_ms);
    said += buf;
  }
  return said;
}

void warm_up(Runtime* rt, const ServeSetup& setup) {
  if (setup.warmup_inferences <= 0) return;
  const auto t = Clock::now();
  for (size_t i = 0; i < setup.s.models.size(); ++i) {
    for (int k = 0; k < setup.warmup_inferences; ++k) {
      try {
        (void)rt->submit(static_cast<int>(i), clone_inputs(setup.inputs[i])).get();
      } catch (const std::exception& e) {  // a paused model; a failing one fails its requests too
        std::fprintf(stderr, "swapnet: serve: %s: warm-up inference failed: %s\n", setup.s.models[i].rt.name.c_str(),
                     e.what());
        break;
      }
    }
  }
  std::fprintf(stderr, "swapnet: serve warmed up: %d uncounted inferences per model before the first arrival (%.1f s)\n",
               setup.warmup_inferences, ms_since(t) / 1000);
}

double choose_warmup(const Scenario& s) {
  if (s.warmup_s >= 0) return s.warmup_s;
  double longest = 0;
  for (const auto& m : s.models) longest = std::max(longest, m.period_ms);
  for (const auto& g : s.groups) longest = std::max(longest, g.period_ms);
  return std::min(2 * longest / 1000, s.duration_s / 5);
}

}  // namespace cli
}  // namespace swapnet
