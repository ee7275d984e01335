// swapnet plan: the optimal partition of an image for a budget (partitioner.h), next to the
// equal-bytes default, with the predicted latencies and the lookup time from a budget grid.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "swapnet/assembly.h"
#include "swapnet/partitioner.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

using json = nlohmann::json;

std::vector<LayerCost> layer_costs(const ImageInfo& info) {
  std::vector<LayerCost> l;
  for (const auto& L : info.layers) l.push_back(LayerCost{L.size, L.num_tensors, L.time_ms});
  return l;
}

CostModel cost_model_for(const ImageInfo& info, const std::string& path, double* raw_mb_s) {
  CostModel m;
  *raw_mb_s = raw_read_mb_s(path, info.data_offset, info.data_offset + info.data_size);
  m.alpha_ms_per_byte = 1.0 / (*raw_mb_s * 1e3);  // MB/s -> bytes per ms
  return m;
}

std::uint64_t planning_arena(const ImageInfo& info, std::uint64_t budget) {
  // The executor's budget also holds activations and pinned shared weights; plan the arena
  // with the pinned bytes of the finest partition (an upper bound).
  ExecutorOptions o;
  o.budget = UINT64_MAX / 4;
  o.blocks = static_cast<int>(info.layers.size());
  ExecutionPlan finest = plan_execution(info, o);
  const std::uint64_t reserve = finest.activation_bytes + finest.pinned_bytes;
  return budget > reserve ? budget - reserve : 0;
}

std::vector<int> optimal_cuts(const std::string& path, const ImageInfo& info, std::uint64_t budget,
                              double* predicted_ms) {
  double raw = 0;
  const CostModel m = cost_model_for(info, path, &raw);
  Partition p = optimal_partition(layer_costs(info), planning_arena(info, budget), m);
  if (!p.feasible) return {};  // the executor's own planning states the minimum
  *predicted_ms = p.predicted_ms;
  std::vector<int> cuts;
  for (size_t b = 1; b < p.blocks.size(); ++b) cuts.push_back(p.blocks[b].first);
  return cuts;
}

int plan(const std::string& path, const Common& c, const std::string& budget_text) {
  apply_common(c);
  ImageInfo info;
  read_image_info(path, &info).throw_if_error();
  const std::uint64_t budget = parse_size(budget_text);
  double raw = 0;
  const CostModel m = cost_model_for(info, path, &raw);
  const auto layers = layer_costs(info);
  const std::uint64_t arena = planning_arena(info, budget);
  const std::uint64_t minimum = min_budget(info);
  auto t0 = Clock::now();
  Partition best = optimal_partition(layers, arena, m);
  const double search_ms = ms_since(t0);
  t0 = Clock::now();
  PartitionTable table(layers, m, 1 << 20);
  const double table_ms = ms_since(t0);
  // Lookup time: many lookups of budgets across the grid, averaged.
  t0 = Clock::now();
  std::uint64_t sink = 0;
  const int lookups = 100000;
  for (int i = 0; i < lookups; ++i) sink += table.lookup(table.min_arena() + (static_cast<std::uint64_t>(i) * 7919) % (info.data_size + 1)).blocks.size();
  const double lookup_us = ms_since(t0) * 1e3 / lookups + (sink == 42 ? 1e-12 : 0.0);
  ExecutorOptions eo;
  eo.budget = budget;
  json eq = nullptr;
  try {
    ExecutionPlan ep = plan_execution(info, eo);
    eq = {{"blocks", ep.blocks}, {"predicted_ms", predict_ms(layers, ep.blocks, m)}};
  } catch (const Error&) {
  }
  std::uint64_t read = 0;
  if (best.feasible && best.blocks.size() > 1) read = info.data_size;
  json j = {{"image", path},
            {"budget_bytes", budget},
            {"feasible", best.feasible && budget >= minimum},
            {"min_budget_bytes", minimum},
            {"arena_bytes", arena},
            {"blocks", best.blocks},
            {"resident_layers", best.blocks.size() == 1 ? static_cast<int>(info.layers.size()) : 0},
            {"predicted_ms", best.predicted_ms},
            {"bytes_read_per_inference", read},
            {"raw_io_mb_s", raw},
            {"search_ms", search_ms},
            {"grid_points", table.size()},
            {"grid_build_ms", table_ms},
            {"lookup_us", lookup_us},
            {"equal_bytes", eq}};
  if (c.json) {
    std::cout << j.dump() << "\n";
  } else if (!j["feasible"].get<bool>()) {
    std::printf("%s: budget %s is below the minimum %s\n", path.c_str(), format_bytes(budget).c_str(),
                format_bytes(minimum).c_str());
  } else {
    std::printf("%s at %s: %zu blocks, predicted %.1f ms (equal bytes: %s ms); search %.2f ms, grid of %zu in %.0f ms, "
                "lookup %.3f us\n",
                path.c_str(), format_bytes(budget).c_str(), best.blocks.size(), best.predicted_ms,
                eq.is_null() ? "-" : std::to_string(eq["predicted_ms"].get<double>()).c_str(), search_ms, table.size(),
                table_ms, lookup_us);
  }
  return 0;
}

}  // namespace cli
}  // namespace swapnet
