// swapnet plan: the partition `run` would use for a budget (partitioner.h, through the
// executor's planning so that activations and pinned weights are reserved exactly as in run),
// next to the paper's full re-read and the equal-bytes default, with the search time, the
// budget grid's build and lookup times, and optionally the paper's lookup table.
#include <ATen/Parallel.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "inputs.h"
#include "swapnet/assembly.h"
#include "swapnet/partitioner.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

using json = nlohmann::json;

void use_profile(const DeviceProfile& p, ExecutorOptions* o) {
  o->cost = p.cost;
  o->measured_exec = p.exec_source == "measured";
  o->gamma_ms_per_flop = p.gamma_ms_per_flop;
}

double image_memory_bound_ms(const ImageInfo& info, std::uint64_t budget, double compute_ms, double read_mb_s,
                             bool constant_reserve) {
  std::vector<LayerCost> costs = layer_costs(info, ExecutorOptions{});
  double image_ms = 0;
  for (size_t k = 0; k < costs.size(); ++k) {
    costs[k].bytes = info.layers[k].data_bytes;
    if (constant_reserve) costs[k].peak_bytes = costs[k].live_bytes = info.activation_bytes;
    image_ms += costs[k].exec_ms;
  }
  if (compute_ms > 0 && image_ms > 0) {
    for (auto& l : costs) l.exec_ms *= compute_ms / image_ms;
  }
  return memory_bound_ms(costs, budget, 1.0 / (read_mb_s * 1e3));
}

double image_reserve_bound_ms(const ImageInfo& info, std::uint64_t budget, double compute_ms, double read_mb_s,
                              std::uint64_t least_read_bytes) {
  return std::max({compute_ms, image_memory_bound_ms(info, budget, compute_ms, read_mb_s, true),
                   static_cast<double>(least_read_bytes) / (read_mb_s * 1e3)});
}

namespace {

json plan_json(const ExecutionPlan& p) {
  json resident = json::array();
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    if (!p.resident[b]) continue;
    for (int k = p.blocks[b].first; k <= p.blocks[b].second; ++k) resident.push_back(k);
  }
  return {{"blocks", p.blocks},
          {"resident", p.resident},
          {"resident_layers", resident},
          {"predicted_ms", p.predicted_ms},
          {"bytes_read_per_inference", p.read_bytes},
          {"arena_bytes", p.arena_bytes},
          {"retain_block", p.retain_block},
          {"retained_bytes", p.retained_bytes},
          {"pair_bytes", p.pair_bytes},
          {"read_ahead", to_string(p.read_ahead)},
          {"min_read_bytes", p.min_read_bytes},
          {"resident_bytes", p.resident_bytes},
          {"activation_bytes", p.activation_bytes},
          {"pinned_bytes", p.pinned_bytes},
          {"total_bytes", p.total()}};
}

json profile_json(const DeviceProfile& prof) {
  return {{"alpha_ms_per_byte", prof.cost.alpha_ms_per_byte}, {"beta_ms_per_tensor", prof.cost.beta_ms_per_tensor},
          {"block_ms", prof.cost.block_ms}, {"eta_ms_per_tensor", prof.cost.eta_ms_per_tensor},
          {"exec_source", prof.exec_source}, {"threads", prof.threads}};
}

// The least latency any schedule reaches in this budget (partitioner's memory_bound_ms), on the
// device `bound_device` of `j` describes.
void add_memory_bound(json& j, const ImageInfo& info, std::uint64_t budget, double bound_compute, double bound_rate) {
  const double mem = image_memory_bound_ms(info, budget, bound_compute, bound_rate);
  j["memory_bound_ms"] = std::isfinite(mem) ? json(mem) : json(nullptr);
  j["physical_bound_ms"] = std::isfinite(mem) ? json(std::max(bound_compute, mem)) : json(nullptr);
  j["bound_device"] = {{"read_mb_s", bound_rate}, {"compute_ms", bound_compute}};
}

// The plan run would use, next to the plans without residency, of equal bytes and of the paper's
// two-block pipeline; placeholders when the budget is below the minimum.
void add_plans(json& j, const ImageInfo& info, const ExecutorOptions& eo, std::uint64_t budget, std::uint64_t minimum) {
  if (budget >= minimum) {
    auto t0 = Clock::now();
    ExecutionPlan best = plan_execution(info, eo);
    j["plan_ms"] = ms_since(t0);
    j.update(plan_json(best));
    ExecutorOptions paper = eo;
    paper.residency = false;
    j["no_residency"] = plan_json(plan_execution(info, paper));
    ExecutorOptions equal = eo;
    equal.planner = ExecutorOptions::Planner::kEqual;
    j["equal_bytes"] = plan_json(plan_execution(info, equal));
    ExecutorOptions two = eo;
    two.read_ahead = ReadAhead::kPaper;
    // Below the two-block pipeline's minimum (a pair of layers) only the ring runs.
    j["paper_pipeline"] = budget >= min_budget(info, two) ? plan_json(plan_execution(info, two)) : json(nullptr);
  } else {
    j["blocks"] = json::array();
    j["resident_layers"] = json::array();
    j["predicted_ms"] = nullptr;
    j["bytes_read_per_inference"] = nullptr;
  }
}

// Search from scratch vs the budget grid (every 1 MiB) vs the paper's table (`table`: its rows
// too). Returns the grid's size.
size_t add_search(json& j, const ImageInfo& info, const std::vector<LayerCost>& costs, const CostModel& cost,
                  std::uint64_t capacity, bool table) {
  auto t0 = Clock::now();
  Partition fresh = optimal_partition(costs, capacity, cost);
  j["search_ms"] = ms_since(t0);
  t0 = Clock::now();
  PartitionTable grid(costs, cost, 1 << 20);
  j["grid_points"] = grid.size();
  j["grid_build_ms"] = ms_since(t0);
  const Partition& looked = grid.lookup(capacity);
  j["grid_predicted_ms"] = looked.feasible ? json(looked.predicted_ms) : json(nullptr);
  const int lookups = 200000;
  std::uint64_t sink = 0;
  const std::uint64_t span = info.data_size + 1;
  t0 = Clock::now();
  for (int i = 0; i < lookups; ++i) {
    sink += grid.lookup(grid.min_capacity() + (static_cast<std::uint64_t>(i) * 7919u * 4096u) % span).read_bytes;
  }
  j["lookup_us"] = ms_since(t0) * 1e3 / lookups;
  const auto rows = paper_table(costs, cost, static_cast<int>(info.layers.size()));
  t0 = Clock::now();
  for (int i = 0; i < lookups / 100; ++i) {
    const Partition* p = paper_lookup(rows, grid.min_capacity() + (static_cast<std::uint64_t>(i) * 7919u * 4096u) % span);
    sink += p ? p->read_bytes : 0;
  }
  j["paper_lookup_us"] = ms_since(t0) * 1e3 / (lookups / 100);
  const Partition* pp = paper_lookup(rows, capacity);
  j["paper_predicted_ms"] = pp ? json(pp->predicted_ms) : json(nullptr);
  j["fresh_predicted_ms"] = fresh.feasible ? json(fresh.predicted_ms) : json(nullptr);
  if (sink == 42) j["sink"] = sink;  // keeps the timed loops from being optimised away
  if (table) {
    for (const auto& r : rows) {
      j["paper_table"].push_back({{"n", r.n}, {"memory_bytes", r.partition.memory()},
                                  {"predicted_ms", r.partition.predicted_ms}, {"blocks", r.partition.blocks}});
    }
  }
  return grid.size();
}

// The text report of a feasible budget (`grid_points`: the budget grid's size).
void print_plan(const std::string& path, json& j, std::uint64_t budget, size_t grid_points) {
  std::printf("%s at %s: %zu blocks (%zu resident layers, %s), predicted %.1f ms, reads %s per inference\n",
              path.c_str(), format_bytes(budget).c_str(), j["blocks"].size(), j["resident_layers"].size(),
              format_bytes(j["resident_bytes"].get<std::uint64_t>()).c_str(), j["predicted_ms"].get<double>(),
              format_bytes(j["bytes_read_per_inference"].get<std::uint64_t>()).c_str());
  std::printf("  ring %s (%s; least %s), no plan in this budget reads fewer than %s\n",
              format_bytes(j["arena_bytes"].get<std::uint64_t>()).c_str(), j["read_ahead"].get<std::string>().c_str(),
              format_bytes(j["pair_bytes"].get<std::uint64_t>()).c_str(),
              format_bytes(j["min_read_bytes"].get<std::uint64_t>()).c_str());
  if (j["retain_block"].get<int>() >= 0) {
    std::printf("  keeps %s of block %d across inferences, reads the rest of it\n",
                format_bytes(j["retained_bytes"].get<std::uint64_t>()).c_str(), j["retain_block"].get<int>());
  }
  char paper_pipeline[96] = "does not fit (it needs the largest pair of adjacent layers)";
  if (!j["paper_pipeline"].is_null()) {
    std::snprintf(paper_pipeline, sizeof paper_pipeline, "%.1f ms", j["paper_pipeline"]["predicted_ms"].get<double>());
  }
  std::printf("  without residency %.1f ms (reads %s); equal bytes %.1f ms; the paper's two-block pipeline %s\n",
              j["no_residency"]["predicted_ms"].get<double>(),
              format_bytes(j["no_residency"]["bytes_read_per_inference"].get<std::uint64_t>()).c_str(),
              j["equal_bytes"]["predicted_ms"].get<double>(), paper_pipeline);
  if (!j["physical_bound_ms"].is_null()) {
    std::printf("  no schedule in this budget is faster than %.1f ms (memory bound %.1f ms, at %.0f MB/s and %.1f ms "
                "of compute)\n",
                j["physical_bound_ms"].get<double>(), j["memory_bound_ms"].get<double>(),
                j["bound_device"]["read_mb_s"].get<double>(), j["bound_device"]["compute_ms"].get<double>());
    if (j.contains("reserve_bound_ms") && !j["reserve_bound_ms"].is_null()) {
      std::printf("  no plan with a constant activation reserve (swapnet's) is faster than %.1f ms\n",
                  j["reserve_bound_ms"].get<double>());
    }
  }
  std::printf("  search %.2f ms; grid of %zu in %.0f ms, lookup %.3f us (paper's table: %.3f us)\n",
              j["search_ms"].get<double>(), grid_points, j["grid_build_ms"].get<double>(),
              j["lookup_us"].get<double>(), j["paper_lookup_us"].get<double>());
}

}  // namespace

int plan(const std::string& path, const Common& c, const std::string& budget_text, const std::string& profile_path,
         bool table, const BoundOptions& bound) {
  apply_common(c);
  ImageInfo info;
  read_image_info(path, &info).throw_if_error();
  const std::uint64_t budget = parse_size(budget_text);
  const DeviceProfile prof = device_profile(path, c, profile_path);
  ExecutorOptions eo;
  eo.budget = budget;
  use_profile(prof, &eo);
  const std::uint64_t minimum = min_budget(info, eo);
  json j = {{"image", path}, {"budget_bytes", budget}, {"min_budget_bytes", minimum}, {"feasible", budget >= minimum}};
  j["profile"] = profile_json(prof);
  const std::vector<LayerCost> costs = layer_costs(info, eo);
  double exec_ms = 0;
  for (const auto& l : costs) exec_ms += l.exec_ms;
  j["exec_ms"] = exec_ms;  // the execution time the image (or gamma * FLOPs) predicts
  // The memory bound on this profile's disk and compute, or on the what-if device given.
  const double bound_rate = bound.read_mb_s > 0 ? bound.read_mb_s : 1.0 / (prof.cost.alpha_ms_per_byte * 1e3);
  const double bound_compute = bound.compute_ms > 0 ? bound.compute_ms : exec_ms;
  add_memory_bound(j, info, budget, bound_compute, bound_rate);
  // The capacity the partitioner gets: the budget less activations and (at most) pinned bytes.
  const std::uint64_t reserve = planning_reserve(info, eo);
  const std::uint64_t capacity = budget > reserve ? budget - reserve : 0;
  add_plans(j, info, eo, budget, minimum);
  // Plans with a constant activation reserve, as swapnet's (run_compare.cpp says more).
  if (j.contains("min_read_bytes")) {
    const double reserve =
        image_reserve_bound_ms(info, budget, bound_compute, bound_rate, j["min_read_bytes"].get<std::uint64_t>());
    j["reserve_bound_ms"] = std::isfinite(reserve) ? json(reserve) : json(nullptr);
  }
  const size_t grid_points = add_search(j, info, costs, eo.cost, capacity, table);
  if (c.json) {
    std::cout << j.dump() << "\n";
  } else if (!j["feasible"].get<bool>()) {
    std::printf("%s: budget %s is below the minimum %s (%llu bytes)\n", path.c_str(), format_bytes(budget).c_str(),
                format_bytes(minimum).c_str(), static_cast<unsigned long long>(minimum));
  } else {
    print_plan(path, j, budget, grid_points);
  }
  return j["feasible"].get<bool>() ? 0 : 1;
}

}  // namespace cli
}  // namespace swapnet
