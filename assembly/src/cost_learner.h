// Costs learned in service (internal to the assembly module; Note [Learning the costs in
// service] in cost_learner.cpp). The CostLearner watches what each inference cost (its layer
// times, the reader's bytes and busy time) and decides, window by window, whether the costs a
// plan was made with should be replaced: it returns that decision and never re-plans itself (the
// Executor does, through its one re-plan path). The learned-costs store keeps what was learned
// across processes (Note [Learned costs kept]).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "swapnet/assembly.h"

namespace swapnet {

class CostLearner {
 public:
  struct Config {
    int every = 0;             // ExecutorOptions::learn_after (0: never)
    double window_ms = 0;      // ExecutorOptions::learn_window_ms
    double threshold = 0;      // ExecutorOptions::learn_threshold
    bool times = true;         // ExecutorOptions::measured_exec: layer times are learned too
  };
  // The reader's counts when an inference ended: sustained (Note [A sustained read rate] in
  // reader.cpp), all bytes over all busy time, and when.
  struct IoCount {
    BlockReader::Sustained sustained;
    BlockReader::Sustained all;
    std::chrono::steady_clock::time_point at;
  };
  static IoCount io_count(const BlockReader& r);
  // The costs planning is to take (each kind only where it moves the plan's prediction enough).
  struct Decision {
    bool take_times = false;
    bool take_reads = false;
    std::vector<double> layer_ms;  // with take_times: each layer's learned time
    CostModel cost;                // with take_reads: the cost model with the learned read rate
    std::string what;              // why, for the log
  };
  // The plan in force predicted with layer costs `c` and cost model `k`.
  using Predict = std::function<double(const std::vector<LayerCost>& c, const CostModel& k)>;

  CostLearner(Config config, std::size_t layers) : config_(config), layers_(layers) {}

  // An inference begins: its layer times are not known yet.
  void begin();
  void time_layer(int k, double ms);
  // A new window from the reader's count `now` (a new plan or grid: what was measured under the
  // plan before says nothing of this one).
  void restart(const IoCount& now);
  // The inference that ended ran whole (`whole`: not one measuring a new input) and timed
  // every layer: only such an inference is observed.
  bool timed(bool whole) const;
  // After a timed inference: adds it to the window and, when the window shows that the plan in
  // force is more than the threshold (and twice the window's noise) off its prediction, returns
  // the costs to take; the window starts again then. `planned_ms` are the layer times in force,
  // `planned` the layer costs and `model` the cost model in force. An inference that overlapped
  // a budget grid being built (GridBuild) is not observed.
  std::optional<Decision> observe(const IoCount& now, const std::vector<double>& planned_ms,
                                  const std::vector<LayerCost>& planned, const CostModel& model,
                                  const Predict& predict);

  Executor::Learning& stats() { return learned_; }
  const Executor::Learning& stats() const { return learned_; }
  // The costs in force were learned (here or loaded from a store).
  bool times_learned = false;
  bool rate_learned = false;

 private:
  double window_span_ms(std::size_t from) const;  // from io_[from] to the newest count
  void push(const IoCount& now, const std::vector<LayerCost>& planned, const CostModel& model, const Predict& predict);
  void slide();  // the window said nothing: it slides on, and the gate halves back
  // observe()'s steps: a full window measured against the costs planned with (measure,
  // predict_window), whether its error stands out, and the costs it takes (decide).
  struct Window {
    std::vector<double> med;                         // each layer's middle mean
    double planned_sum = 0, measured = 0, diff = 0;  // layer times: planned, measured, |difference|
    double rate = 0, planned_rate = 0;               // read rates, bytes per second (0: none)
    std::vector<LayerCost> costs;                    // planned, with the times measured (Config::times)
    CostModel cm;                                    // model, with the rate measured (where `reads`)
    bool reads = false;                              // both rates known
    double now_planned = 0, now_measured = 0;        // the plan in force predicted with each
  };
  Window measure(const std::vector<double>& planned_ms, double planned_rate);
  void predict_window(Window& w, const std::vector<LayerCost>& planned, const CostModel& model,
                      const Predict& predict);
  bool stands_out(std::size_t most);
  Decision decide(const Window& w, const std::vector<LayerCost>& planned, const CostModel& model,
                  const Predict& predict);

  Config config_;
  std::size_t layers_;
  std::vector<double> layer_ms_now_;            // this inference's layer times (NaN: not run)
  std::deque<std::vector<double>> window_;      // the window's layer times
  std::deque<IoCount> io_;                      // the reader's counts at each inference of it
  std::deque<double> pred_;                     // the plan in force with each inference's own costs
  std::uint64_t grid_epoch_ = 0;                // grid_builds_epoch() when this inference began
  double gate_ = 0;                             // the plan error that re-plans now (0: threshold)
  Executor::Learning learned_;
};

// Budget grids being built for learned costs in this process (Note [Learning the costs in
// service]): an inference that overlapped one ran on fewer cores than its plan will.
class GridBuild {
 public:
  GridBuild();   // one starts
  ~GridBuild();  // it ends
  GridBuild(const GridBuild&) = delete;
  GridBuild& operator=(const GridBuild&) = delete;
  static std::uint64_t epoch();  // counts starts and ends
  static int running();
};

// Note [Learned costs kept]: the costs learned for `info` on `device` ("cpu", "cuda:0 (NAME)") read
// from `path` (nothing where the file is absent, or learned for another image, device or thread
// count: said once, as a warning).
struct LearnedCosts {
  std::optional<std::vector<double>> layer_ms;
  double read_mb_s = 0;  // 0: none
};
std::optional<LearnedCosts> load_learned_costs(const std::string& path, const std::string& image,
                                               const ImageInfo& info, const std::string& device, bool times);
// Writes them (whole, renamed over the old); false (said once, as a warning) when it cannot.
bool store_learned_costs(const std::string& path, const std::string& image, const ImageInfo& info,
                         const std::string& device, const std::vector<double>* layer_ms, double read_mb_s);

}  // namespace swapnet
