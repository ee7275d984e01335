// The Planner (internal to the assembly module): what an executor plans with, and its plans.
//
// The executor's image table and options are fixed at open. What changes while it serves lives
// here, in one place: the budget in force, the activation reserve (Note [Dynamic shapes] in
// input_meter.cpp), the costs learned in service (layer times and the read rate, Note [Learning
// the costs in service] in cost_learner.cpp), the budget grid built for them and its latency
// curve. Planning itself is the pure functions of planning.h over `view()`, the image's table
// with that reserve and those times in place.
//
// The Planner returns plans and predictions; it never puts a plan in force. The Executor does,
// through its one re-plan path (Note [One re-plan path] in executor.cpp), and tells the Planner
// the budget it committed to.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "swapnet/assembly.h"

namespace swapnet {

class Planner {
 public:
  // `image` as read, `config` the executor's options resolved at open (its partition, block
  // count and residency are for the first plan only), `reserve` the activation reserve to begin
  // with (the largest input measured).
  Planner(const ImageInfo& image, const Skeleton& sk, const ExecutorOptions& config, std::uint64_t reserve,
          std::string path);
  ~Planner();
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // ---- what plans are made with
  // The image's table as planning uses it: the activation reserve in force and the layer times
  // learned (the rest as read).
  const ImageInfo& view() const { return view_; }
  std::uint64_t reserve() const { return view_.activation_bytes; }
  std::uint64_t budget() const { return o_.budget; }
  const CostModel& cost() const { return o_.cost; }
  // The least weight memory any plan needs (the minimum budget less the reserve at open).
  std::uint64_t weights_min() const { return weights_min_; }
  std::vector<double> layer_ms() const;
  std::vector<LayerCost> layer_costs() const;
  // The activation reserve the deep ring is lent (0: none; Note [Lending the activation reserve]).
  std::uint64_t lend() const;

  // ---- changes (each takes effect for the next plan; the plan in force is the Executor's)
  void set_reserve(std::uint64_t bytes) { view_.activation_bytes = bytes; }
  void set_layer_ms(const std::vector<double>& ms);
  void set_cost(const CostModel& k) { o_.cost = k; }
  // `budget` is in force: plans are searched for it from now on (no partition given at open).
  void commit(std::uint64_t budget);

  // ---- plans
  // The first plan, as the options at open say (a partition, a block count, or the search).
  ExecutionPlan first_plan() const;
  // The plan for `budget`: the budget grid's where it has one that fits, else a search
  // (`from_grid` says which). Throws Error, naming the budget and the minimum, if none fits.
  ExecutionPlan plan(std::uint64_t budget, bool* from_grid) const;
  // `p`'s blocks, residency and kept part predicted at the budget in force with costs `c`, `k`
  // (by default those in force).
  double predict(const ExecutionPlan& p, const std::vector<LayerCost>& c, const CostModel& k) const;
  double predict(const ExecutionPlan& p) const { return predict(p, layer_costs(), cost()); }
  // Executor::latency_curve.
  std::vector<std::pair<std::uint64_t, double>> latency_curve() const;

  // ---- the budget grid (ExecutorOptions::grid_step with the optimal planner)
  // At open, once the costs learned before are set: the grid, where the options ask for one.
  void build_grid();
  bool has_grid() const { return grid_ != nullptr; }
  void drop_grid() { grid_.reset(); }
  // Starts rebuilding the grid with the costs in force on a thread of the lowest priority; the
  // grid in use stays until take_rebuilt_grid(). Throws where no thread can start. `before_ms`:
  // the plan in force's prediction now, kept for Executor::Learning.
  void rebuild_grid(double before_ms);
  bool rebuilding() const { return next_.valid(); }
  // A rebuilt grid ready now replaces the grid in use (true); where the rebuild failed there is
  // no grid from now on (plans search) and `error` says why.
  bool take_rebuilt_grid(std::string* error);
  double rebuilt_from_ms() const { return next_before_ms_; }

 private:
  // The grid's capacity is the budget less the reserve in force and the finest partition's
  // pinned slots, which no reserve change moves.
  std::uint64_t grid_reserve() const { return view_.activation_bytes + finest_pinned_; }
  ExecutorOptions options_at(std::uint64_t budget) const;

  const Skeleton& sk_;
  const std::string path_;
  ImageInfo view_;
  ExecutorOptions o_;  // the options resolved at open, with the budget and cost model in force
  std::uint64_t weights_min_ = 0;
  std::uint64_t finest_pinned_ = 0;
  std::unique_ptr<PartitionTable> grid_;
  std::future<std::unique_ptr<PartitionTable>> next_;
  double next_before_ms_ = 0;
};

}  // namespace swapnet
