// The Planner: the budget, reserve and costs plans are made with, the budget grid, and the plans.
#include "planner.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "cost_learner.h"
#include "planning.h"

namespace swapnet {

Planner::Planner(const ImageInfo& image, const Skeleton& sk, const ExecutorOptions& config, std::uint64_t reserve,
                 std::string path)
    : sk_(sk), path_(std::move(path)), view_(image), o_(config) {
  view_.activation_bytes = reserve;
  weights_min_ = min_budget_for(view_, sk_, o_.read_ahead) - reserve;
}

Planner::~Planner() = default;

std::vector<double> Planner::layer_ms() const {
  std::vector<double> t;
  t.reserve(view_.layers.size());
  for (const ImageLayer& L : view_.layers) t.push_back(L.time_ms);
  return t;
}

std::vector<LayerCost> Planner::layer_costs() const { return ::swapnet::layer_costs(view_, o_); }

std::uint64_t Planner::lend() const { return lend_for(view_, o_); }

void Planner::set_layer_ms(const std::vector<double>& ms) {
  for (std::size_t i = 0; i < ms.size() && i < view_.layers.size(); ++i) view_.layers[i].time_ms = ms[i];
}

ExecutorOptions Planner::options_at(std::uint64_t budget) const {
  ExecutorOptions o = o_;
  o.budget = budget;
  o.partition.clear();
  o.blocks = 0;
  o.resident.clear();
  o.retain_block = -1;
  return o;
}

void Planner::commit(std::uint64_t budget) { o_ = options_at(budget); }

ExecutionPlan Planner::first_plan() const { return plan_for(view_, sk_, o_, path_); }

ExecutionPlan Planner::plan(std::uint64_t budget, bool* from_grid) const {
  const ExecutorOptions o = options_at(budget);
  *from_grid = false;
  if (grid_ && budget > grid_reserve()) {
    const Partition& part = grid_->lookup(budget - grid_reserve());
    if (part.feasible) {
      ExecutionPlan p = finish_plan(view_, sk_, part.blocks, part.resident, ::swapnet::layer_costs(view_, o), o.cost,
                                    partition_options(view_, o), budget, part.retain_block, part.retained_bytes);
      if (p.total() <= budget) {
        p.min_budget = weights_min_ + view_.activation_bytes;
        *from_grid = true;
        return p;
      }
    }
  }
  return plan_for(view_, sk_, o, path_);  // throws if infeasible
}

double Planner::predict(const ExecutionPlan& p, const std::vector<LayerCost>& c, const CostModel& k) const {
  return finish_plan(view_, sk_, p.blocks, p.resident, c, k, partition_options(view_, o_), o_.budget, p.retain_block,
                     p.retained_bytes)
      .predicted_ms;
}

std::vector<std::pair<std::uint64_t, double>> Planner::latency_curve() const {
  std::unique_ptr<PartitionTable> local;
  const PartitionTable* table = grid_.get();
  std::uint64_t reserve = grid_reserve();
  if (table == nullptr) {
    reserve = planning_reserve(view_, sk_, o_);
    local = std::make_unique<PartitionTable>(layer_costs(), o_.cost, default_grid_step(view_),
                                             partition_options(view_, o_));
    table = local.get();
  }
  std::vector<std::pair<std::uint64_t, double>> curve;
  const std::uint64_t minimum = min_budget_for(view_, sk_, o_.read_ahead);
  curve.emplace_back(minimum, plan_for(view_, sk_, options_at(minimum), path_).predicted_ms);
  for (std::size_t i = 0; i < table->size(); ++i) {
    const Partition& p = table->at(i);
    const std::uint64_t budget = table->grid()[i] + reserve;
    if (!p.feasible || budget <= curve.back().first) continue;
    curve.emplace_back(budget, std::min(p.predicted_ms, curve.back().second));
  }
  return curve;
}

void Planner::build_grid() {
  if (o_.grid_step == 0 || o_.planner != ExecutorOptions::Planner::kOptimal) return;
  finest_pinned_ = planning_reserve(view_, sk_, o_) - view_.activation_bytes;
  grid_ = std::make_unique<PartitionTable>(layer_costs(), o_.cost, o_.grid_step, partition_options(view_, o_));
}

void Planner::rebuild_grid(double before_ms) {
  const PartitionOptions po = partition_options(view_, o_);
  std::vector<LayerCost> costs = layer_costs();
  const CostModel cm = o_.cost;
  const std::uint64_t step = o_.grid_step;
  next_before_ms_ = before_ms;
  auto build = std::make_shared<GridBuild>();  // counted from now until the table is built
  next_ = std::async(std::launch::async, [costs = std::move(costs), cm, step, po, build = std::move(build)]() mutable {
    const std::shared_ptr<GridBuild> done = std::move(build);
    // The lowest priority: the inferences come first (a core of a Jetson's six, or of this VM's two).
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
    return std::make_unique<PartitionTable>(costs, cm, step, po);
  });
}

bool Planner::take_rebuilt_grid(std::string* error) {
  if (!next_.valid() || next_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
  std::unique_ptr<PartitionTable> g;
  try {
    g = next_.get();
  } catch (const std::exception& e) {
    *error = e.what();
  }
  grid_ = std::move(g);
  return true;
}

}  // namespace swapnet
