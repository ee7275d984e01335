// Planning (internal to the assembly module): pure functions from the image's layer table, the
// skeleton and the executor's options to an ExecutionPlan. The public entry points
// (plan_execution, min_budget, planning_reserve, layer_costs) are declared in
// swapnet/assembly.h; these are the pieces the executor's components share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swapnet/assembly.h"

namespace swapnet {

// Bytes of the slots read by some layer outside the block owning them, when that block is
// swapped (a resident block's slots stay bound); their indices appended to `pinned` if given.
std::uint64_t pinned_bytes(const ImageInfo& info, const Skeleton& sk, const std::vector<int>& block_of_layer,
                           const std::vector<char>& resident, std::vector<int>* pinned);
// Bytes of layers first..last in the image (they lie one after another).
inline std::uint64_t layers_span(const ImageInfo& info, int first, int last) {
  return info.layers[last].offset + info.layers[last].size - info.layers[first].offset;
}
// Per layer: the index of the block holding it.
std::vector<int> block_of_layer(const ImageInfo& info, const Blocks& blocks);

// Layers on the CPU read their blocks into host memory, also where a GPU is usable; only pinned
// memory, asked for by name, stays.
bool host_blocks(const ExecutorOptions& o);
// The plan for `blocks` within `budget` (0: the least memory): the ring gets what activations,
// pinned slots and resident blocks leave (never more than one inference of swapped bytes), or
// the largest consecutive pair for the two-block pipelines. The pipeline is `pipe`'s read_ahead,
// and lend (the activation reserve the deep ring is lent: Note [Lending the activation
// reserve]). `retain_block` keeps `retained` bytes of that block (Note [Keeping part
// of a block]).
ExecutionPlan finish_plan(const ImageInfo& info, const Skeleton& sk, Blocks blocks, std::vector<char> resident,
                          const std::vector<LayerCost>& costs, const CostModel& m, const PartitionOptions& pipe,
                          std::uint64_t budget, int retain_block = -1, std::uint64_t retained = 0);

// The least budget of any plan with read-ahead `ra` (Note [A ring of one block]).
std::uint64_t min_budget_for(const ImageInfo& info, const Skeleton& sk, ReadAhead ra);
// What the partitioner keeps out of a budget: activations and the finest partition's pinned
// slots (an upper bound: coarser blocks pin fewer).
std::uint64_t planning_reserve(const ImageInfo& info, const Skeleton& sk, const ExecutorOptions& o);
// The activation reserve the deep ring is lent where activations leave it (0: none).
std::uint64_t lend_for(const ImageInfo& info, const ExecutorOptions& o);
// What the partitioner (search and budget grid, finish_plan) is told of these options: the
// pipeline and lending.
PartitionOptions partition_options(const ImageInfo& info, const ExecutorOptions& o);
// The plan for o.budget (a given partition, the optimal search, or the fewest equal-byte
// blocks); throws Error naming `origin`, the budget and the minimum when nothing fits.
ExecutionPlan plan_for(const ImageInfo& info, const Skeleton& sk, const ExecutorOptions& o, const std::string& origin);

}  // namespace swapnet
