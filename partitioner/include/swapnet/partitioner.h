// swapnet/partitioner.h — where to cut a model into blocks, which blocks to keep resident, how
// far to read ahead, and the device cost model that predicts the result: pure arithmetic over
// the layer table (no torch, no I/O). docs/partitioner.md has the derivation and the measured
// errors.
//
// A partition is a sequence of blocks of consecutive layers; each block is either swapped (read
// every inference, released after it runs) or resident (read once, kept). With
// t_io = alpha*bytes + block_ms (the read), t_bind = beta*tensors (assembly by reference, on the
// compute thread), t_out = eta*tensors (swap-out) and t_ex the execution time, two pipelines are
// predicted:
//
//  * The paper's (Eq. 4; ring_bytes == 0): while swapped block s_k executes, s_{k+1} is fetched
//    into the other end of a two-ended arena, one inference at a time:
//      start(s_1)     = max(t_ex(resident prefix), t_io(s_1))
//      start(s_{k+1}) = start(s_k) + t_bind(s_k) + max(t_ex(s_k) + t_out(s_k) + t_ex(resident gap), t_io(s_{k+1}))
//      T              = start(s_last) + t_bind + t_ex + t_out of s_last + t_ex(resident suffix) + inference_ms
//    Memory: resident bytes + the arena (the largest pair of consecutive swapped blocks). With a
//    fixed set of resident layers, optimal_partition_for() finds the minimum-T partition exactly
//    (dynamic programming over (previous block, block), O(L^3)); tests compare it with
//    exhaustive search.
//  * The read-ahead ring (ring_bytes > 0; what the executor runs): swapped blocks are read in
//    order, back to back, into a ring of ring_bytes as soon as each fits next to the blocks not
//    yet executed (ring_depth 2: at most two blocks, the two-ended arena), and the reader goes
//    on into the next inference's first blocks, so in a closed loop the disk never waits for an
//    inference boundary. simulate_ms() plays that pipeline event by event and returns the
//    steady-state latency of back-to-back inferences. Memory: resident bytes + ring_bytes.
//
// optimal_partition() chooses the resident layers, the cuts and the ring together: for candidate
// resident sets (none; prefixes; the layers with the most bytes per millisecond; the largest
// layers; each at fractions of the capacity and at the most that still leaves room to swap the
// rest) it tries the paper DP's cuts and equal-byte cuts at several block sizes, gives the ring
// whatever the resident blocks leave, and keeps the best prediction.
#pragma once

#include <algorithm>
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
  // Activations (memory_bound_ms only): bytes alive after the layer, and the most allocated at
  // once while it runs (0: not measured; then the larger of the live bytes around it).
  std::uint64_t live_bytes = 0;
  std::uint64_t peak_bytes = 0;
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
  std::uint64_t arena_bytes = 0;       // largest pair of consecutive swapped blocks (the least ring)
  std::uint64_t resident_bytes = 0;
  std::uint64_t read_bytes = 0;        // bytes read per inference (the swapped blocks)
  // The read-ahead ring for swapped blocks (>= arena_bytes), or 0 for the paper's two-block
  // pipeline; ring_depth 0: as many blocks as fit, 2: two at most (two-ended arena).
  std::uint64_t ring_bytes = 0;
  int ring_depth = 0;
  // The largest swapped block: all a deep ring (ring_depth 0) must hold. Where the budget has no
  // room for a pair, the ring reads the next block once the previous one has run (no overlap
  // there), which lets a budget keep its largest layer resident (Note [A ring of one block]).
  std::uint64_t block_max = 0;
  // Part of a large swapped block kept across inferences (deep ring only; Note [Keeping part
  // of a block] in ring.cpp): the first `retained_bytes` of block `retain_block` stay
  // in memory just before the ring, and each inference reads only the rest of it, into the
  // ring's first bytes. read_bytes and block_max count that rest; memory() the kept part.
  int retain_block = -1;
  std::uint64_t retained_bytes = 0;
  // The activation reserve the ring may use where activations leave it (deep ring only;
  // simulate_ms's `lend`): not part of memory(), which the reserve is planned beside.
  std::uint64_t lend_bytes = 0;
  std::uint64_t memory() const {
    return std::max(ring_depth == 0 && ring_bytes > 0 ? block_max : arena_bytes, ring_bytes) + resident_bytes +
           retained_bytes;
  }
};

// Predicted latency of one inference in the paper's pipeline (the formula above). `resident`
// has one flag per block.
SWAPNET_API double predict_ms(const std::vector<LayerCost>& layers, const Blocks& blocks,
                              const std::vector<char>& resident, const CostModel& m);
// Steady-state latency of back-to-back inferences with a read-ahead ring of `ring_bytes`
// (depth 0: unlimited, 2: two blocks), played event by event (the ring pipeline above). With
// depth 0 a block that does not fit yet streams in pieces of kStreamPieceBytes into the bytes
// older blocks free as they end, as the executor reads it (Note [Streaming into the ring] in
// allocator/src/ring.cpp); `stream` false: it waits for its whole room (read-ahead ring-whole).
// `retain_block` >= 0 (depth 0): the first `retained_bytes` of that swapped block are kept, the
// rest is read at the ring's start (Partition::retain_block). `by_layer` (depth 0 or 2): a block's
// layers run as their bytes land, and (depth 0) its bytes are free for a block streaming over
// them as its layers end, as the executor does (Note [Layer by layer] in
// assembly/src/read_ahead.cpp); false: block by block (read-ahead ring-blocks). `lend` (depth 0):
// the activation reserve, after the ring's last byte, lent to blocks where the layers from the
// one running when a block's read starts to the block's last leave it (their LayerCost peak or
// live bytes), as the executor does on host memory (Note [Lending the activation reserve] in
// assembly/src/zone_lender.cpp).
inline constexpr std::uint64_t kStreamPieceBytes = 2 << 20;
SWAPNET_API double simulate_ms(const std::vector<LayerCost>& layers, const Blocks& blocks,
                               const std::vector<char>& resident, std::uint64_t ring_bytes, int ring_depth,
                               const CostModel& m, bool stream = true, int retain_block = -1,
                               std::uint64_t retained_bytes = 0, bool by_layer = true, std::uint64_t lend = 0);
// Fills arena_bytes, resident_bytes, read_bytes and predicted_ms of `p` from its blocks, flags and
// ring (predict_ms when ring_bytes is 0, else simulate_ms).
SWAPNET_API void evaluate(const std::vector<LayerCost>& layers, const CostModel& m, Partition* p);
// For an evaluated ring plan (ring_depth 0, ring_bytes > 0): where two blocks at the two ends of
// the same bytes are predicted faster (the contiguous ring can lose up to a block at its end),
// makes `p` that (ring_depth 2, re-evaluated) and returns true.
SWAPNET_API bool prefer_two_ended(const std::vector<LayerCost>& layers, const CostModel& m, Partition* p);
// A lower bound on the bytes any partition fitting `capacity` reads per inference (a relaxation:
// a ring at least as large as the largest swapped layer -- or, with `pairs`, each pair of
// consecutive swapped layers, as the two-block pipelines need -- every other byte resident if
// it fits). Without `pairs` one layer may be kept in part (Partition::retain_block): the ring
// then need hold only the rest of it.
SWAPNET_API std::uint64_t min_read_bytes(const std::vector<LayerCost>& layers, std::uint64_t capacity,
                                         bool pairs = false);
// A lower bound on the steady-state latency of back-to-back inferences that ANY schedule can
// reach in `budget` bytes (weights and activations together) with a disk reading
// `ms_per_byte`: not only this planner's plans, but any cuts, residency, read order or
// activation-aware memory sharing. Layers run in order, one at a time, each with its weights in
// memory. At a layer's activation peak (or at the boundary after it) memory holds activations
// and that layer's weights, so at most the rest of the budget holds weights of later layers;
// every other byte those layers need must be read afterwards. For any cyclic sequence of such
// points the period is at least the sum over consecutive pairs of max(compute strictly between
// them, bytes that must be read between them * ms_per_byte); the bound is the largest such sum
// (dynamic programming over the points). It is at least the compute time, and exceeds
// max(compute, bytes read / rate) when the budget is too small to read far enough ahead: the
// physical bound of a memory-bound model. Infinite when a layer's weights and peak do not fit.
// docs/partitioner.md has the derivation.
SWAPNET_API double memory_bound_ms(const std::vector<LayerCost>& layers, std::uint64_t budget, double ms_per_byte);
// How swapped blocks are read ahead (what the executor will run).
enum class ReadAhead {
  kRing,      // a ring of whatever the resident blocks leave, as deep as it holds
  kTwoEnded,  // the same pipeline with two blocks at most (two ends of the same memory)
  kPaper,     // the paper's two-block pipeline, one inference at a time (predict_ms)
};

SWAPNET_API const char* to_string(ReadAhead r);  // "ring", "two-ended", "paper"

// The smallest memory any partition needs: the largest pair of adjacent layers (the finest
// partition; the two-block pipelines), or the whole model when that is smaller (tiny models).
// kRing: the largest layer (Note [A ring of one block] in executor.cpp: the next block streams
// into the bytes the one before frees).
SWAPNET_API std::uint64_t min_arena_bytes(const std::vector<LayerCost>& layers,
                                          ReadAhead read_ahead = ReadAhead::kPaper);

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
  ReadAhead read_ahead = ReadAhead::kRing;
  // Among candidates within this fraction of the fastest prediction, take the one that reads the
  // fewest bytes per inference (resident bytes cost no time once loaded).
  double tolerance = 0.01;
  // kRing: the activation reserve beside the capacity, lent to the ring where activations leave
  // it (Partition::lend_bytes); 0: none.
  std::uint64_t lend = 0;
};
// The best partition fitting `capacity` (infeasible below min_arena_bytes()): resident layers,
// cuts and (but for kPaper) the ring, chosen together by prediction.
SWAPNET_API Partition optimal_partition(const std::vector<LayerCost>& layers, std::uint64_t capacity,
                                        const CostModel& m, const PartitionOptions& options = {});

// Optimal partitions precomputed for a grid of capacities, so a new budget maps to its
// partition by a binary search (microseconds) instead of a search (milliseconds).
class SWAPNET_API PartitionTable {
 public:
  // Grid from min_arena_bytes (for options.read_ahead) to the model's bytes (where everything is resident) in `step` bytes.
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
  static constexpr int kVersion = 3;
  int version = kVersion;
  std::string host;          // uname nodename
  std::string cpu;           // /proc/cpuinfo model name
  int threads = 0;           // intra-op threads it was measured with
  std::string created;       // UTC, ISO 8601
  std::string image;         // the image it measured with
  double raw_read_mb_s = 0;  // one sequential O_DIRECT pass over that image
  // The same, passes back to back for at least a second: what a disk that is kept busy delivers
  // (throttled and flash storage read faster after idling). alpha is 1 / this rate.
  double sustained_read_mb_s = 0;
  CostModel cost;            // alpha from the sustained rate, beta and eta fitted to binding and
                             // unbinding, block_ms and inference_ms calibrated on whole swapped
                             // runs (pipeline_* below)
  double gamma_ms_per_flop = 0;
  // Relative errors (median |pred - meas| / meas) on the samples: t_in of isolated reads of
  // random layer ranges + binding them (reads after idle may beat the sustained rate), t_out.
  double t_in_error = 0, t_out_error = 0;
  // Predicting blocks' execution time from gamma*FLOPs vs from the image's measured per-layer
  // times (scaled to the run's total: the machine's drift since packing passes); `exec_source`
  // names the one plans use: "measured" unless those times are off by more than FLOPs and by
  // more than 15 % (FLOPs miss memory-bound layers: vgg19's fully connected ones by 97 %).
  double exec_error_flops = 0, exec_error_measured = 0;
  std::string exec_source = "measured";
  // Whole swapped runs of the planner's plans for several per-block costs, against the ring
  // pipeline's prediction (simulate_ms): block_ms and inference_ms fitted to them
  // (block_ms = the isolated reads' fixed cost + pipeline_extra_block_ms).
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
