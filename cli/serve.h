// swapnet serve's state, shared by its set-up and drive (cmd_serve.cpp) and its report
// (serve_report.cpp): the scenario resolved, what the clients gathered while it ran.
#pragma once

#include <ATen/core/ivalue.h>

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

// The scenario with the command line's overrides, its images' facts, budgets in bytes, and the
// inputs (with direct inference's outputs for them when outputs are checked).
struct ServeSetup {
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
};

// One answered request, for --timeline.
struct Sample {
  double t_s;
  int model;
  double ms;
  std::uint64_t total;
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
  ServeLog(int models, size_t groups)
      : lat(models), equal(models, 1), diff(models), max_diff(models, 0), dropped(models, 0), sent(models, 0),
        unanswered(models, 0), frames(groups) {}
};

// The results (--json, or the table), --trace and --timeline after the run that began at
// `start`; the exit status: 1 where an output differed, a model went over its budget or an
// inference failed.
int serve_report(Runtime& rt, const ServeSetup& setup, ServeLog& log, Clock::time_point start, const Common& c,
                 const ServeOptions& o);

}  // namespace cli
}  // namespace swapnet
