// swapnet/partitioner.h — where to cut a model into blocks, which blocks to keep resident, and
// the device cost model that predicts the result: pure arithmetic over the layer table (no torch,
// no I/O). docs/partitioner.md has the derivation and the measured errors.
//
// A partition is a sequence of blocks of consecutive layers; each block is either swapped (read
// into the two-ended arena every inference, released after it runs) or resident (read once,
// kept). While swapped block s_k executes, the next swapped block s_{k+1} is fetched (the
// paper's two-block pipeline, Eq. 4), so with t_io = alpha*bytes + block_ms (the read),
// t_bind = beta*tensors (assembly by reference, on the compute thread), t_out = eta*tensors
// (swap-out) and t_ex the execution time:
//   start(s_1)     = max(t_ex(resident prefix), t_io(s_1))
//   start(s_{k+1}) = start(s_k) + t_bind(s_k) + max(t_ex(s_k) + t_out(s_k) + t_ex(resident gap), t_io(s_{k+1}))
//   T              = start(s_last) + t_bind + t_ex + t_out of s_last + t_ex(resident suffix)
//                    + inference_ms
// Memory: resident bytes + the arena, where the arena holds the largest pair of consecutive
// swapped blocks (a single swapped block alone). A partition fits a capacity C when that sum is
// <= C. With a fixed set of resident layers, optimal_partition_for() finds the minimum-T
// partition of the swapped layers exactly (dynamic programming over (previous block, block),
// O(L^3)); tests compare it with exhaustive search. optimal_partition() also chooses the resident
// layers, among candidate sets (a prefix of the model; the layers with the most bytes per
// millisecond of compute), by prediction.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "swapnet/swapcore.h"

namespace swapnet {

struct LayerCost {
  std::uint64_t bytes = 0;    // aligned bytes in the image
  std::uint32_t tensors = 0;  // the paper's depth
  double exec_ms = 0;         // execution time (measured, or gamma * FLOPs)
};

// The paper's coefficients (t_in = alpha*size + beta*depth, t_out = eta*depth), plus a fixed
// cost per swapped block (submitting and waiting for a read, handing it to the compute thread)
// that the paper leaves out: without it the optimum is dozens of tiny blocks (issue #5 notes).
struct CostModel {
  double alpha_ms_per_byte = 1.0 / 1.5e6;  // swap-in: 1 / (read rate in bytes per ms)
  double beta_ms_per_tensor = 0.0005;      // assembly by reference: ~0.5 us per tensor
  double block_ms = 0.05;                  // fixed cost of one swapped block
  double eta_ms_per_tensor = 0.0;          // swap-out (dropping views): negligible
  double inference_ms = 0.0;               // fixed cost of one inference (same for every partition)
};

using Blocks = std::vector<std::pair<int, int>>;  // [first, last] layer of each block

struct Partition {
  bool feasible = false;
  Blocks blocks;
  std::vector<char> resident;          // per block: 1 = read once and kept
  double predicted_ms = 0;
  std::uint64_t arena_bytes = 0;       // largest pair of consecutive swapped blocks
  std::uint64_t resident_bytes = 0;
  std::uint64_t read_bytes = 0;        // bytes read per inference (the swapped blocks)
  std::uint64_t memory() const { return arena_bytes + resident_bytes; }
};

// Predicted latency of one inference (the formula above). `resident` has one flag per block.
SWAPNET_API double predict_ms(const std::vector<LayerCost>& layers, const Blocks& blocks,
                              const std::vector<char>& resident, const CostModel& m);
// Fills arena_bytes, resident_bytes, read_bytes and predicted_ms of `p` from its blocks and flags.
SWAPNET_API void evaluate(const std::vector<LayerCost>& layers, const CostModel& m, Partition* p);
// The smallest memory any partition needs: the largest pair of adjacent layers (the finest
// partition), or the whole model when that is smaller (tiny models).
SWAPNET_API std::uint64_t min_arena_bytes(const std::vector<LayerCost>& layers);

// Exact: the minimum-latency partition fitting `capacity` in which exactly the layers with
// resident_layer[k] != 0 are resident (maximal runs of them form the resident blocks).
SWAPNET_API Partition optimal_partition_for(const std::vector<LayerCost>& layers,
                                            const std::vector<char>& resident_layer, std::uint64_t capacity,
                                            const CostModel& m);
// The same by trying every cut (tests only; at most 25 layers).
SWAPNET_API Partition exhaustive_partition_for(const std::vector<LayerCost>& layers,
                                               const std::vector<char>& resident_layer, std::uint64_t capacity,
                                               const CostModel& m);
// Every cut and every resident flag per block (tests only; at most 12 layers): the true optimum
// the heuristic choice of resident layers is measured against.
SWAPNET_API Partition exhaustive_partition_any(const std::vector<LayerCost>& layers, std::uint64_t capacity,
                                               const CostModel& m);

struct PartitionOptions {
  bool residency = true;  // false: every block swapped every inference (the paper)
  // Among candidates within this fraction of the fastest prediction, take the one that reads the
  // fewest bytes per inference (resident bytes cost no time once loaded).
  double tolerance = 0.01;
};
// The best partition fitting `capacity` (infeasible below min_arena_bytes()).
SWAPNET_API Partition optimal_partition(const std::vector<LayerCost>& layers, std::uint64_t capacity,
                                        const CostModel& m, const PartitionOptions& options = {});

// Optimal partitions precomputed for a grid of capacities, so a new budget maps to its
// partition by a binary search (microseconds) instead of a search (milliseconds).
class SWAPNET_API PartitionTable {
 public:
  // Grid from min_arena_bytes to the model's bytes (where everything is resident) in `step` bytes.
  PartitionTable(const std::vector<LayerCost>& layers, const CostModel& m, std::uint64_t step,
                 const PartitionOptions& options = {});
  // The best partition whose memory is <= `capacity` (largest grid point not above it);
  // infeasible below the minimum.
  const Partition& lookup(std::uint64_t capacity) const;
  std::size_t size() const { return grid_.size(); }
  std::uint64_t min_capacity() const { return min_; }
  const std::vector<std::uint64_t>& grid() const { return grid_; }
  const Partition& at(std::size_t i) const { return parts_[i]; }

 private:
  std::uint64_t min_ = 0;
  std::vector<std::uint64_t> grid_;
  std::vector<Partition> parts_;
  Partition infeasible_;
};

// The paper's lookup table (its Table 3): for n = 1..max_blocks, an n-block equal-bytes
// partition with its memory and predicted latency; at run time the fastest row that fits wins
// (a linear scan, kept to compare with PartitionTable).
struct PaperRow {
  int n = 0;
  Partition partition;
};
SWAPNET_API Blocks equal_bytes_blocks(const std::vector<LayerCost>& layers, int n);
SWAPNET_API std::vector<PaperRow> paper_table(const std::vector<LayerCost>& layers, const CostModel& m,
                                              int max_blocks);
SWAPNET_API const Partition* paper_lookup(const std::vector<PaperRow>& table, std::uint64_t capacity);

// ---- device profile --------------------------------------------------------------------------

// Least squares y ~ X b with b >= 0 (tries every subset of columns; for a handful of columns).
// Rows of X are samples. Returns b (one per column).
SWAPNET_API std::vector<double> fit_nonnegative(const std::vector<std::vector<double>>& X,
                                                const std::vector<double>& y);

// What `swapnet profile` measured on this device, and where.
struct DeviceProfile {
  static constexpr int kVersion = 2;
  int version = kVersion;
  std::string host;          // uname nodename
  std::string cpu;           // /proc/cpuinfo model name
  int threads = 0;           // intra-op threads it was measured with
  std::string created;       // UTC, ISO 8601
  std::string image;         // the image it measured with
  double raw_read_mb_s = 0;  // sequential O_DIRECT reads of that image
  CostModel cost;            // fitted alpha, beta, block_ms, eta; block_ms and inference_ms
                             // then calibrated on whole swapped runs (pipeline_* below)
  double gamma_ms_per_flop = 0;
  // Relative errors of the fits on the samples they were fitted to (median |pred - meas| / meas).
  double t_in_error = 0, t_out_error = 0;
  // Predicting blocks' execution time from gamma*FLOPs vs from the image's measured per-layer
  // times; `exec_source` names the better one ("measured" or "flops").
  double exec_error_flops = 0, exec_error_measured = 0;
  std::string exec_source = "measured";
  // Whole swapped runs of the DP's partitions for several per-block costs (coarse to fine):
  // block_ms and inference_ms refitted to them (block_ms = isolated fit + pipeline_extra_block_ms).
  double pipeline_extra_block_ms = 0;  // may be negative
  double pipeline_error = 0;  // after calibration, on those runs
  // In-memory latency measured alongside, and the execution time the image predicts: their
  // ratio is how fast this machine ran then relative to when the image was packed.
  double calibration_direct_ms = 0, calibration_exec_ms = 0;
};
SWAPNET_API Status save_profile(const std::string& path, const DeviceProfile& p);
// Errors name the file and the field; a profile of another version is refused.
SWAPNET_API Status load_profile(const std::string& path, DeviceProfile* out);
// Why `p` does not describe this process ("" when it does): another host, CPU or thread count.
SWAPNET_API std::string profile_mismatch(const DeviceProfile& p, int threads);
// Where profiles live by default: $SWAPNET_PROFILE, else $XDG_CACHE_HOME/swapnet/device.json,
// else ~/.cache/swapnet/device.json.
SWAPNET_API std::string default_profile_path();

}  // namespace swapnet
