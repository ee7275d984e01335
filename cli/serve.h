// swapnet serve's state, shared by its set-up and drive (cmd_serve.cpp) and its report
// (serve_report.cpp): the scenario resolved, what the clients gathered while it ran.
#pragma once

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "scenario.h"
#include "swapnet/scheduler.h"

namespace swapnet {
namespace cli {

// The load the periods were scaled to (Note [Load and run rules] in serve_load.cpp).
struct LoadInfo {
  double target = 0;               // 0: the periods as written
  double written = 0;              // the written periods' load
  double scale = 1;                // every period, jitter and deadline times this
  int cores = 0;
  std::vector<double> direct_ms;   // per model: direct inference alone (0: not measured)
  // The disk: its sustained raw O_DIRECT rate when serve started (MB/s; 0: not measured), and
  // per model the least latency a plan in its budget at open can have there (the physical
  // bound: compute at direct_ms, and the bytes it must read at that rate; 0: not measured).
  double read_mb_s = 0;
  std::vector<double> bound_ms;
  std::vector<std::uint64_t> budget;  // per model, at open
  // What the load counts per model: the larger of direct_ms and bound_ms.
  double counted_ms(size_t i) const { return std::max(direct_ms[i], i < bound_ms.size() ? bound_ms[i] : 0.0); }
};

// The scenario with the command line's overrides, its images' facts, budgets in bytes, and the
// inputs (with direct inference's outputs for them when outputs are checked).
struct ServeSetup {
  LoadInfo load;
  double warmup_s = 0;  // arrivals before this are not counted
  int warmup_inferences = 0;  // per model, before the first arrival (Note [Warm-up inferences])
  int direct_threads = 1;     // intra-op threads of the direct runs --load measures (Note [Serve's defaults])
  Scenario s;
  std::vector<ImageInfo> infos;                            // per model, as its image records
  std::uint64_t total = 0;                                 // the initial total budget, bytes
  std::vector<std::pair<double, std::uint64_t>> schedule;  // (at_s, total budget bytes)
  std::vector<std::vector<c10::IValue>> inputs;            // per model
  std::vector<c10::IValue> reference;                      // per model, when checked
};

// One frame of a group, as its members answer (Note [Group makespan and score] in serve_report.cpp).
struct Frame {
  int pending = 0;     // members not answered yet
  bool ok = true;      // every member answered (not dropped, failed or unanswered)
  double last_ms = 0;  // the last member's answer after the frame's arrival
  bool counted = true; // arrived after the warm-up (Note [Counted requests and their score])
};

// One answered request, for --timeline.
struct Sample {
  double t_s;
  int model;
  double ms;
  std::uint64_t total;
};

// What became of one request.
struct Outcome {
  enum Fate { kAnswered, kDropped, kFailed, kUnanswered };
  double arrival_s = 0;  // since the clients started
  Fate fate = kAnswered;
  double ms = 0;         // arrival to answer (answered ones)
};

// What the clients gathered, per model unless said (written under the clients' mutex).
struct ServeLog {
  std::vector<std::vector<double>> lat;  // answered requests' latencies, ms
  std::vector<Sample> samples;           // every answered request
  std::vector<char> equal;               // every output equal to direct inference's (when checked)
  std::vector<std::string> diff;         // the first difference
  std::vector<double> max_diff;
  std::vector<std::uint64_t> dropped, sent, unanswered;
  std::vector<std::deque<Frame>> frames;  // per group
  std::vector<std::vector<Outcome>> outcomes;  // every request's, in the order they ended
  std::vector<std::uint64_t> counted;           // arrivals after the warm-up
  std::vector<ModelStatus> at_warmup;           // the models' status when the warm-up ended (or none)
  double driver_cpu_s = 0;  // CPU serve's own thread used while the run went on (Note [The driver sleeps])
  ServeLog(int models, size_t groups)
      : lat(models), equal(models, 1), diff(models), max_diff(models, 0), dropped(models, 0), sent(models, 0),
        unanswered(models, 0), frames(groups), outcomes(models), counted(models, 0) {}
};

// Direct (all in memory) inference of model m on `inputs`, on a thread with the model's
// intra-op threads, as its worker (some kernels' results depend on the thread count); with
// `timed_runs` > 0, that many more, the fastest one's time in *fastest_ms (serve_load.cpp).
c10::IValue direct_output(const ScenarioModel& m, const ImageInfo& info, const std::vector<c10::IValue>& inputs,
                          int timed_runs = 0, double* fastest_ms = nullptr);
// The disk's rate and each model's bound at the budget the runtime gave it (Note [A load that
// counts the disk] in serve_load.cpp), into setup->load.
void measure_disk(const Runtime& rt, ServeSetup* setup);
// Scales setup->s's periods, jitters and deadlines to its load from setup->load (counted_ms);
// returns what it did, for serve to say.
std::string apply_load(ServeSetup* setup);
// The warm-up: the scenario's, else two of its longest period, at most a fifth of the run.
double choose_warmup(const Scenario& s);
// Note [Warm-up inferences] (serve_load.cpp): setup.warmup_inferences uncounted requests per
// model before the run (kWarmUpInferences where the scenario has deadlines, else none).
constexpr int kWarmUpInferences = 2;
void warm_up(Runtime* rt, const ServeSetup& setup);

// The results (--json, or the table), --trace and --timeline after the run that began at
// `start`; the exit status: 1 where an output differed, a model went over its budget or an
// inference failed.
int serve_report(Runtime& rt, const ServeSetup& setup, ServeLog& log, Clock::time_point start, const Common& c,
                 const ServeOptions& o);

}  // namespace cli
}  // namespace swapnet
