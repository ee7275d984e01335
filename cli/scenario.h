// A serve scenario file (docs/scheduler.md, the format at the top of cmd_serve.cpp): its models,
// budget, schedule and groups, read and checked without loading any model (so that a fuzzer can
// run it on its own: tests/fuzz_scenario.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "swapnet/scheduler.h"

namespace swapnet {
namespace cli {

struct ScenarioModel {
  RuntimeModel rt;
  std::vector<std::string> shapes;
  double rate_hz = 0;  // 0: closed loop
  std::string device = "cpu";
  double period_ms = 0;  // > 0: open-loop arrivals
  double jitter_ms = 0;
  double slo_ms = 0;     // 0: no deadline
  int group = -1;        // index into Scenario::groups; -1: none
};

// Puzzle's periodic model group: every member gets the same frame at one period; a frame's
// makespan is its arrival to the last member's answer.
struct ScenarioGroup {
  std::string name;
  std::vector<int> members;  // indices into Scenario::models
  double period_ms = 0;
  double jitter_ms = 0;
  double slo_ms = 0;  // the frame's deadline after arrival (default: the period, as in Puzzle)
};

struct Scenario {
  std::string name;
  std::string total;   // size or percentage
  std::string policy = "paper";
  std::string scheduler;  // empty: chosen (choose_defaults in cmd_serve.cpp)
  int workers = 0;        // 0: chosen (Note [Serve's defaults]: one, on every core)
  double duration_s = 10;
  // Note [Load and run rules] in serve_load.cpp: the load the periods are scaled to (0: as
  // written), requests arriving before warmup_s not counted (-1: chosen), and the run going on
  // past duration_s until every open-loop model has had min_requests counted arrivals.
  double load = 0;
  double warmup_s = -1;
  int min_requests = 0;
  std::vector<ScenarioModel> models;
  std::vector<std::pair<double, std::string>> schedule;  // (at_s, budget)
  std::vector<ScenarioGroup> groups;
};

// Reads and checks a scenario file; errors (swapnet::Error) name the file and the field.
// Relative image paths are looked up next to the file, then in `models_dir`.
Scenario load_scenario(const std::string& path, const std::string& models_dir);

// Whether any model or group of the scenario has a deadline (slo_ms).
bool has_deadlines(const Scenario& s);

// A budget: a size ("843MiB", bytes) or a percentage of `whole`; errors start with `what`.
std::uint64_t budget_value(const std::string& text, std::uint64_t whole, const std::string& what);

}  // namespace cli
}  // namespace swapnet
