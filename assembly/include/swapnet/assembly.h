// swapnet/assembly.h — the layered skeleton of a TorchScript model (the paper's get_layers),
// and execution of its layers with parameters bound by reference.
//
// A Skeleton is built once per model, generally, for any TorchScript module whose forward is a
// data-flow graph (see Note [Layered skeleton] in assembly/src/skeleton_impl.h):
//  - every parameter, buffer and tensor attribute becomes a *slot* with a fixed index (with
//    SkeletonOptions::split_above, a large weight becomes one slot per part of its rows: Note
//    [Splitting large layers]); non-tensor attributes become constants;
//  - the inlined forward graph is cut into *layers*: runs of consecutive nodes holding at most
//    one node that reads slots (a convolution, a linear, a batch norm, a whole prim::If/Loop that
//    uses weights), so a layer is the smallest unit a block can be made of;
//  - each layer is compiled into its own graph whose inputs are the activations crossing into
//    it and its slots, so running the layers in order is running forward, bit for bit (layers
//    split in parts: where load_for_pack checked it).
//
// Slots are plain at::Tensor handles: bind_slot() points one at other memory (a view of a
// fetched block) without copying, unbind_slot() drops it. Layers read whatever is bound.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "swapnet/allocator.h"
#include "swapnet/partitioner.h"
#include "swapnet/swapcore.h"

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace swapnet {

enum class SlotKind { kParameter, kBuffer, kAttribute };

struct SlotInfo {
  std::string name;            // qualified name in the module, e.g. "layer1.0.conv1.weight"
  SlotKind kind = SlotKind::kParameter;
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::int64_t bytes = 0;      // numel * element size
  int layer = -1;              // owning layer: the first layer that reads it (or, if none does,
                               // the layer of its closest sibling by name)
  std::vector<int> used_by;    // every layer that reads it (shared slots: more than one)
};

struct LayerInfo {
  int index = 0;
  std::string name;                 // owning submodule of its weights, e.g. "layer1.0.conv1"
  std::vector<std::string> ops;     // node kinds in order, e.g. {"aten::_convolution"}
  std::vector<int> slots;           // slots this layer owns (their bytes are counted here)
  std::vector<int> used_slots;      // slots it reads (may include slots owned by earlier layers)
  std::int64_t bytes = 0;           // sum of owned slot bytes
  std::int64_t tensors = 0;         // number of owned slots (the paper's "depth")
  // Filled by Skeleton::profile(); zero until then.
  double flops = 0;                 // from the shapes seen in the example run
  double time_ms = 0;               // median measured execution time
  std::int64_t live_bytes = 0;      // activation bytes alive after this layer (crossing to the next)
  // Activations alive at the boundary before this layer (defined earlier, used here or later),
  // as "name: type", e.g. "x.3: Tensor". Forward's inputs count as defined before layer 0.
  std::vector<std::string> live_in;
};

struct ProfileOptions {
  int warmup = 1;   // untimed runs before measuring
  int iters = 3;    // timed runs; per-layer time is their median
};

// How Skeleton::pack writes a swap image.
struct PackOptions {
  std::string input_shapes;  // the example input profile() used, recorded in the image
  std::uint64_t activation_bytes = 0;  // peak activation bytes of forward at that input
  // The same peak while each layer ran (one per layer, or empty: not measured).
  std::vector<std::uint64_t> layer_peak_bytes;
  // Inputs activations were measured for, recorded in the image (the example input's first:
  // {activation_bytes, describe_inputs(example)}); the executor re-measures inputs none covers.
  std::vector<InputProfile> input_profiles;
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;  // optional
};

// How a module is cut into layers.
struct SkeletonOptions {
  // A convolution (groups 1) or linear layer whose weight is larger than this many bytes is
  // computed in parts (of split_part, below) along its output channels, their outputs joined with
  // aten::cat (Note [Splitting large layers] in skeleton_split.cpp): each part is a layer of its own,
  // read, held and given back a part at a time, so no budget needs room for the whole layer
  // (vgg19's fc6 is 392 MiB) and the disk reads on while a part computes. 0 (the default for
  // Skeleton::load): never split; `swapnet pack` and the Python package split above
  // kPackSplitAbove. Not bit-identical by construction: load_for_pack() checks the example
  // input and keeps whole the layers whose parts differ.
  std::uint64_t split_above = 0;  // bytes
  // The most bytes of one part of a split layer (whole multiples of 64 rows, at least 64 rows);
  // 0 or more than split_above: split_above. Parts smaller than the threshold let the disk read
  // on while a part computes, and leave the middle-sized layers whole (their parts compute
  // slower: with every layer above 4 MiB in parts, direct inference took 2-10 % longer).
  std::uint64_t split_part = 0;  // bytes
  // Weights (qualified names, "classifier.0.weight") whose layers stay whole whatever their size:
  // those load_for_pack() found to differ in parts.
  std::vector<std::string> keep_whole;
  // Weights split in parts of split_above instead of split_part: those load_for_pack() found to
  // differ in parts of split_part only.
  std::vector<std::string> coarse_parts;
  // load_for_pack() checks the parts on the GPU as well, where one is usable (Note [Splitting on
  // the GPU] in skeleton_parts_check.cpp): `swapnet pack` does. Off by default, because it makes a CUDA
  // context and a GPU copy of the model in the packing process (the Python package packs inside
  // users' programs); a GPU that fails the check is said and the CPU's check stands.
  bool check_parts_on_gpu = false;
};

// What `swapnet pack` (and swapnet.pack, and the preload's pack) split layers above.
constexpr std::uint64_t kPackSplitAbove = std::uint64_t{16} << 20;  // bytes
// ... and the most bytes of one of their parts.
constexpr std::uint64_t kPackSplitPart = std::uint64_t{4} << 20;  // bytes
// The skeleton options of a pack: large layers split as above.
inline SkeletonOptions pack_skeleton_options() {
  SkeletonOptions o;
  o.split_above = kPackSplitAbove;
  o.split_part = kPackSplitPart;
  return o;
}

// The layered skeleton of one module. Not copyable; movable. Running it is not thread-safe
// (one inference at a time per Skeleton).
class SWAPNET_API Skeleton {
 public:
  // Loads a TorchScript file and builds its skeleton. Throws Error naming the file and the
  // problem: missing file, not a TorchScript archive, no forward, unsupported construct.
  // If `module` is given it receives the loaded module (in eval mode), e.g. to compare with.
  static Skeleton load(const std::string& path, torch::jit::Module* module = nullptr,
                       const SkeletonOptions& options = {});
  // Builds from a loaded module; `origin` names it in messages. Slots initially alias the
  // module's own tensors (split layers' parts: views of their rows).
  static Skeleton from_module(const torch::jit::Module& module, const std::string& origin,
                              const SkeletonOptions& options = {});
  // Layers of the module computed in parts (SkeletonOptions::split_above): their weights'
  // qualified names, how many, and the parts they make.
  const std::vector<std::string>& split_weights() const;
  int split_layers() const;
  int split_parts() const;
  // Slots the parts added: slots() holds the module's parameters and buffers plus these.
  int split_tensors() const;

  Skeleton(Skeleton&&) noexcept;
  Skeleton& operator=(Skeleton&&) noexcept;
  ~Skeleton();

  const std::string& origin() const;
  int num_inputs() const;  // forward's inputs, without self
  const std::vector<SlotInfo>& slots() const;
  const std::vector<LayerInfo>& layers() const;
  std::int64_t total_bytes() const;  // sum of all slot bytes == module parameter + buffer bytes
  int num_parameters() const;
  int num_buffers() const;

  // ---- swap images (format: swapcore.h, Note [Swap image format]) ----
  // Writes the model as a swap image: the layer table with the facts profile() measured, the
  // tensor table (slot i is tensor i), the weightless skeleton (kilobytes) and the bound slots'
  // bytes in layer order. Atomic: a crash never leaves a half image under `path`.
  void pack(const std::string& path, const PackOptions& options = {}) const;
  // Builds the skeleton of an image from its metadata alone: no parameter data is read, and
  // every slot starts unbound. Throws Error if the skeleton does not match the layer table.
  static Skeleton from_image(const ImageInfo& info, const std::string& origin);
  // Binds the slots owned by layers [first, last] to views into `block`, memory that holds the
  // image's bytes from file offset `block_offset` on (a fetched block). No copy: the memory
  // must stay valid until unbind_layers(). Only for skeletons made by from_image. The views are
  // tensors of `device` (CUDA: `block` is the GPU's address of memory it can read in place).
  void bind_layers(int first, int last, void* block, std::uint64_t block_offset,
                   c10::Device device = c10::Device(c10::DeviceType::CPU));
  void unbind_layers(int first, int last);

  // ---- binding by reference ----
  // Points slot `index` at `tensor` (no copy). Throws if dtype or sizes differ from the slot.
  void bind_slot(int index, const at::Tensor& tensor);
  void unbind_slot(int index);  // an undefined tensor; running a layer that reads it throws
  const at::Tensor& slot(int index) const;

  // ---- execution ----
  // Layer-by-layer execution state: the activations alive between layers.
  class Run {
   public:
    Run(Run&&) noexcept;
    Run& operator=(Run&&) noexcept;
    ~Run();
    int next_layer() const;        // index of the next layer to run
    std::int64_t live_bytes() const;  // bytes of distinct tensor storage held in activations
   private:
    friend class Skeleton;
    Run();
    struct State;
    std::unique_ptr<State> s_;
  };
  Run begin(std::vector<c10::IValue> inputs) const;  // throws if the input count is wrong
  void run_layer(Run& run) const;                      // runs run.next_layer()
  void run_layers(Run& run, int end) const;            // runs layers up to (excluding) end
  c10::IValue finish(Run& run) const;                   // after the last layer: forward's output
  c10::IValue forward(std::vector<c10::IValue> inputs) const;  // all of the above

  // Runs the example inputs through the layers (warmup + iters times) and fills each layer's
  // flops, time_ms, live_bytes. Returns forward's output of the last run.
  c10::IValue profile(const std::vector<c10::IValue>& inputs, const ProfileOptions& options = {});

 private:
  struct Impl;
  explicit Skeleton(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Loads `path` to pack it with `inputs` as the example: the skeleton with large layers split
// (options.split_above) where that keeps its outputs for `inputs` bit-identical to the module's
// forward. When they differ, each split layer is tried alone: one whose parts of split_part
// differ is tried in parts of split_above (SkeletonOptions::coarse_parts), and stays whole if
// those differ too (said in the log, naming them; nothing is split if the rest still differs).
// `module` receives
// the module, as for Skeleton::load.
SWAPNET_API Skeleton load_for_pack(const std::string& path, const std::vector<c10::IValue>& inputs,
                                   const SkeletonOptions& options = {}, torch::jit::Module* module = nullptr);

// ---- activation accounting ----
// Counts libtorch's CPU allocations (activations, inputs, outputs) from install_cpu_meter() on,
// process-wide, by wrapping the CPU allocator (c10::SetCPUAllocator). Weights bound by reference
// are not allocations and are not counted.
struct CpuMeterStats {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  // Note [Lending the activation reserve] in zone_lender.cpp: bytes of activation zones (the
  // account's, or all) lent to blocks now, and the most of `current` + those at once since the
  // last reset (what activations and the blocks using their reserve held together).
  std::uint64_t lent = 0;
  std::uint64_t peak_with_lent = 0;
};
SWAPNET_API void install_cpu_meter();
SWAPNET_API CpuMeterStats cpu_meter();
SWAPNET_API void reset_cpu_meter_peak();
// Accounts split the meter by who allocates, e.g. one per model served concurrently: an
// allocation is charged to the account of the thread making it (set_thread_cpu_account), and
// its free is credited there, on any thread. new_cpu_account() returns 0 (none: counted only in
// the process total) once 255 accounts exist. Accounts are never freed.
SWAPNET_API int new_cpu_account();
SWAPNET_API int set_thread_cpu_account(int account);  // returns the thread's previous account
SWAPNET_API CpuMeterStats cpu_account(int account);
SWAPNET_API void reset_cpu_account_peak(int account);
// The activation cache of an account (Note [Activation cache] in assembly/src/cpu_meter.cpp):
// with a nonzero cap, the account's large allocations are placed in one region of that many
// bytes (a model's activation reserve), reused across inferences; 0 (the default) turns it off
// and unmaps the region once nothing is placed in it. The stats of account 0 sum all accounts.
struct ActivationCacheStats {
  std::uint64_t cap = 0;           // the region's size
  std::uint64_t mapped_bytes = 0;  // the region once used (its pages touched at most)
  std::uint64_t live_bytes = 0;    // placed and in use (old regions' included)
  std::uint64_t hits = 0;          // allocations placed in a region
  std::uint64_t misses = 0;        // allocations the region could not place (libtorch's allocator)
};
// Where an executor made its ring's activation zone the account's region (Note [Lending the
// activation reserve] in zone_lender.cpp), a nonzero cap leaves that zone in place.
SWAPNET_API void set_cpu_account_cache(int account, std::uint64_t cap);
SWAPNET_API ActivationCacheStats cpu_account_cache(int account);
// Peak CPU bytes one layered forward of `sk` allocates for `inputs` (input copies included, held
// to the end as a caller holds its inputs), as `swapnet run` accounts activations; installs the
// meter. What PackOptions::activation_bytes
// records. `layer_peaks`, if given, receives the same peak while each layer ran (what
// PackOptions::layer_peak_bytes records).
SWAPNET_API std::uint64_t measure_activation_bytes(const Skeleton& sk, const std::vector<c10::IValue>& inputs,
                                                   std::vector<std::uint64_t>* layer_peaks = nullptr);

// ---- swapped execution ----
struct ExecutorOptions {
  std::uint64_t budget = 0;      // bytes for this model: arena + resident blocks + activations + pinned slots
  // How blocks are chosen when neither `partition` nor `blocks` is given:
  //  kOptimal: the partitioner's best partition for `cost` (resident blocks where the budget
  //            leaves room; docs/partitioner.md);
  //  kEqual:   the fewest equal-byte blocks that fit, all swapped (one block: kept resident).
  enum class Planner { kOptimal, kEqual } planner = Planner::kOptimal;
  CostModel cost;                // device coefficients for kOptimal (swapnet profile)
  bool residency = true;         // kOptimal may keep blocks resident across inferences
  // Execution times for kOptimal: the image's measured per-layer times (true), or gamma * FLOPs.
  bool measured_exec = true;
  double gamma_ms_per_flop = 0;
  // kOptimal: precompute the best partition for every `grid_step` bytes of budget at open
  // (PartitionTable; seconds for a large model) so that set_budget() is a lookup (microseconds)
  // instead of a search (milliseconds). 0: search on every set_budget().
  std::uint64_t grid_step = 0;
  std::vector<int> partition;    // first layer of each block after the first; empty: by `blocks`
  int blocks = 0;                // equal-byte blocks; 0: planned as `planner` says
  std::vector<int> resident;     // with `partition` or `blocks`: indices of blocks kept resident
  // With `partition` or `blocks` (kRing): keep the first `retained_bytes` of swapped block
  // `retain_block` across inferences and read only the rest (Note [Keeping part of a block] in
  // allocator/src/ring.cpp; the planner chooses this itself otherwise).
  int retain_block = -1;
  std::uint64_t retained_bytes = 0;
  // Checksums of fetched layers: the first fetch of each layer after open (default; a corrupt
  // image fails the first inference), every fetch, or never. Every fetch costs ~20 % of
  // latency when compute already uses every core (docs/executor.md).
  enum class Verify { kFirst, kAlways, kNever } verify = Verify::kFirst;
  ReaderOptions reader;          // block reader settings (swapcore defaults)
  // Where blocks are read to, for layers on the GPU: managed (default; pinned host memory on an
  // integrated GPU), or kRegistered. Layers on the CPU read into host memory whatever this says,
  // unless it is kRegistered.
  MemoryKind memory = MemoryKind::kManaged;
  // Where the layers run. kCUDA: blocks are read into managed memory and bound as CUDA tensors
  // in place (no copy; prefetched on discrete GPUs); CPU tensor inputs are moved to the GPU.
  // If O_DIRECT/io_uring refuse managed memory (EFAULT/EOPNOTSUPP), blocks go to pinned host
  // memory registered with CUDA instead (said once). Needs a CUDA libtorch and a usable GPU:
  // Executor::open says which is missing.
  enum class Device { kCPU, kCUDA } device = Device::kCPU;
  // How swapped blocks are read ahead (Note [Read-ahead ring] in executor.cpp):
  //  kRing:  into a ring of whatever the budget leaves after resident blocks, as many blocks ahead
  //          as it holds, on into the next inference's first blocks (host memory, and memory the
  //          GPU reads in place);
  //  kTwoEnded: the same with two blocks at the two ends of the ring's memory (read-ahead
  //          "two-ended"; the GPU's pipeline before its ring was deep). For comparison;
  //  kPaper: the paper's pipeline: two blocks (the one executing and the next), one inference at
  //          a time, planned with its formula. For comparison.
  ReadAhead read_ahead = ReadAhead::kRing;
  // kRing: a block that does not fit yet is read in pieces into the bytes older blocks free as
  // they are popped (Note [Streaming into the ring] in allocator/src/ring.cpp); false: it waits
  // until its whole room is free (read-ahead "ring-whole", for comparison).
  bool stream = true;
  // kRing with `stream`: blocks that overlap nothing held are read while a streamed block waits
  // for older blocks' bytes (Note [Streaming into the ring]); false: nothing is read after a
  // streamed block until it is whole (read-ahead "ring-serial", for comparison).
  bool read_past_streamed = true;
  // kRing and kTwoEnded: a block's layers run as their bytes land (on a GPU: their kernels are
  // queued then) and, on host memory in the deep ring, give their ring bytes back as they end
  // (Note [Layer by layer] in read_ahead.cpp); false: block by block (read-ahead "ring-blocks",
  // for comparison).
  bool layer_by_layer = true;
  // kRing on host memory: blocks use the activation reserve's bytes the activations leave
  // (Note [Lending the activation reserve] in zone_lender.cpp); false: activations keep the whole
  // reserve all the time (read-ahead "ring-reserved", for comparison).
  bool lend = true;
  // Note [Learning the costs in service] in cost_learner.cpp: the planner's costs checked against
  // the inferences themselves. Every `learn_after` inferences (0: never; a sliding window), the
  // median time each layer ran in them (from when its bytes had landed) and the rate the disk
  // read at while it had our reads are put into the cost model; when the plan in force,
  // predicted with them, is more than `learn_threshold` off its prediction with the image's
  // layer times and `cost`, they replace those, and the executor re-plans at its budget before
  // the next inference (with `grid_step`, once the new table is built on a thread of its own).
  // On the GPU a layer's time is the GPU's, from CUDA events around its kernels (Note [Timing
  // layers on the GPU] in layer_clock.cpp; libtorch 2.x: 1.13's events cannot time). Not
  // learned: a plan given by `partition`/`blocks`, kEqual, and an inference that measured a new
  // input's activations (weights at their least). Layer times learned show in info().
  // 0, or 3..kMaxLearnAfter (Executor::open refuses 1 and 2: a window's median needs three
  // inferences to set one disturbed inference aside).
  int learn_after = 0;
  double learn_threshold = 0.1;
  // A window also spans at least this long (Note [Noise in the window] in cost_learner.cpp): a model
  // of 10 ms an inference that shares its cores sees its costs change with what the others run,
  // from one run of inferences to the next; a second of them is the mixture its plan runs in.
  double learn_window_ms = 1000;
  // Note [Learned costs kept]: a file (JSON) where learned costs are written each time they are
  // taken, and read at open (with learn_after > 0) so that the next executor of this image, in
  // this process or another, plans with them from its first inference. Only costs learned for
  // this very image (its layers' checksums) on the same device (with the same number of
  // threads, on the CPU) are taken; another
  // file, or one that cannot be read or written, is said once and changes nothing else.
  // Empty: none.
  std::string learn_store;
};

inline constexpr int kMaxLearnAfter = 1000;  // ExecutorOptions::learn_after's largest
// 0 (never) or 3..kMaxLearnAfter: what Executor::open takes for learn_after.
inline bool learn_after_valid(long long n) { return n == 0 || (n >= 3 && n <= kMaxLearnAfter); }

// A PartitionTable step for `info` when none is asked for: 1/64 of the model, at least 1 MiB.
SWAPNET_API std::uint64_t default_grid_step(const ImageInfo& info);

// Sets one ExecutorOptions field from text, as the CLI (--plan, --read-ahead, --verify, --device)
// and the Python package (plan=, read_ahead=, ...) spell it: plan auto|optimal|equal, read-ahead
// ring|paper, verify first|always|never, device cpu|cuda (`name` may carry leading dashes and
// '-' or '_'). Throws Error("NAME 'VALUE' is not one of ...") with `name` as given.
SWAPNET_API void set_executor_option(ExecutorOptions* o, const std::string& name, const std::string& value);

// Throws Error("ORIGIN: --device cuda: ...") naming what is missing for ExecutorOptions::Device::
// kCUDA: a CUDA libtorch, or a usable GPU (with the probe's reason). Executor::open calls it.
SWAPNET_API void require_cuda(const std::string& origin);

struct ExecutionPlan {
  std::vector<std::pair<int, int>> blocks;  // [first, last] layers of each block
  std::vector<std::uint64_t> block_bytes;   // aligned bytes of each block
  std::vector<char> resident;               // per block: 1 = read once and kept across inferences
  std::uint64_t arena_bytes = 0;            // the read-ahead ring for swapped blocks (0: none swapped)
  std::uint64_t pair_bytes = 0;             // largest pair of consecutive swapped blocks: the least ring
  ReadAhead read_ahead = ReadAhead::kRing;  // the pipeline it runs (kTwoEnded: a two-block ring)
  std::uint64_t resident_bytes = 0;         // resident blocks
  std::uint64_t read_bytes = 0;             // read per inference: the swapped blocks
  // The first retained_bytes of swapped block retain_block stay in memory across inferences,
  // just before the ring; the rest of it is read each inference (Note [Keeping part of a
  // block] in allocator/src/ring.cpp). -1: none (read_bytes counts only the rest).
  int retain_block = -1;
  std::uint64_t retained_bytes = 0;
  // No plan in this budget reads fewer bytes per inference (partitioner's min_read_bytes()):
  // filled by plan_execution(), 0 in an executor's plans (it takes milliseconds to seconds).
  std::uint64_t min_read_bytes = 0;
  std::uint64_t activation_bytes = 0;       // reserved for activations (measured at pack time)
  std::uint64_t pinned_bytes = 0;           // slots read outside their (swapped) block, kept resident
  std::uint64_t min_budget = 0;             // smallest feasible budget for this image
  double predicted_ms = 0;                  // the cost model's latency for this plan
  std::uint64_t total() const {
    return arena_bytes + resident_bytes + retained_bytes + activation_bytes + pinned_bytes;
  }
  bool all_resident() const { return read_bytes == 0; }
};

// What the planner keeps out of a budget before partitioning (activations + the finest
// partition's pinned shared weights): the partitioner's capacity is the budget less this.
SWAPNET_API std::uint64_t planning_reserve(const ImageInfo& info, const ExecutorOptions& o);
// The layer table as the partitioner sees it (bytes, tensors, execution time per `o`).
SWAPNET_API std::vector<LayerCost> layer_costs(const ImageInfo& info, const ExecutorOptions& o);

// The smallest budget any partition of the image can run in with these options, plus
// activations and pinned slots: the largest layer for the deep ring (the default, on the CPU and
// the GPU; Note [A ring of one block] in executor.cpp), the two largest adjacent layers for the
// two-block pipelines (read-ahead paper and two-ended).
SWAPNET_API std::uint64_t min_budget(const ImageInfo& info, const ExecutorOptions& options = {});
// No plan these options may run reads fewer bytes per inference in their budget (partitioner's
// min_read_bytes over the budget less activations; pairs for the two-block pipelines).
SWAPNET_API std::uint64_t min_read_bytes(const ImageInfo& info, const ExecutorOptions& options);
// Plans blocks for a budget (throws Error stating the minimum when the budget is too small, or
// when a given partition does not fit).
SWAPNET_API ExecutionPlan plan_execution(const ImageInfo& info, const ExecutorOptions& options);

// Memory an executor holds for weights (activations are counted by the CPU meter's accounts).
struct WeightMemory {
  std::uint64_t held = 0;  // now: the ring + resident blocks + pinned slots (0 when released)
  std::uint64_t peak = 0;  // most bytes of weights in use at once (blocks in the ring + resident +
                           // pinned) since open or reset_weight_peak()
  // Physical bytes those buffers occupy now (pages resident, by mincore): what the process really
  // holds for weights, e.g. after shed() or a budget cut gave pages back.
  std::uint64_t resident_pages = 0;
};

// Runs an image within a memory budget: swapped blocks are read (O_DIRECT) into a ring as far
// ahead as it holds while earlier blocks execute, and released right after they execute.
// Outputs are bit-identical to forward. One inference at a time, by one thread at a time (but
// interrupt(), which any thread may call).
//
// An inference is resumable: begin() starts it, each step() runs one block (or stops early at a
// layer boundary after interrupt()), finish() returns forward's output. Between steps the
// budget may change (set_budget): the rest of the inference is re-planned from the next layer.
class SWAPNET_API Executor {
 public:
  struct Impl;
  static std::unique_ptr<Executor> open(const std::string& image, const ExecutorOptions& options);
  ~Executor();
  // begin + step until done + finish. An I/O or checksum error fails this forward with the
  // image, block and reason; the next forward starts clean.
  c10::IValue forward(std::vector<c10::IValue> inputs);

  // ---- resumable inference ----
  // Starts an inference (throws if one is in progress, or the executor is released).
  void begin(std::vector<c10::IValue> inputs);
  // Runs the next block; true once every layer has run. Returns false early, at a layer
  // boundary: after interrupt() (once at least one layer has run), or before layer
  // `stop_before` when it falls inside the block.
  // An error aborts the inference (abort()) and is rethrown.
  bool step(int stop_before = -1);
  c10::IValue finish();  // after step() returned true: forward's output; the inference ends
  // Ends an inference in progress without an output: reads in flight are cancelled, swapped
  // blocks released; resident blocks already read stay. Nothing happens when none is.
  void abort();
  bool in_inference() const;
  int next_layer() const;  // of the inference in progress (0 when none)
  // Bytes the next step's block still waits for from the disk, without waiting for the read: 0
  // once it has landed (or the block is resident and loaded, or weightless); its whole size
  // when its read is not even submitted (the ring is full, or shed() gave it back). Between
  // inferences: the next one's first block. For a scheduler that would rather not give a core
  // to a block still being read. Thread-safe; takes the executor's lock (waits while another
  // thread is inside step() outside a layer, or inside shed()).
  std::uint64_t next_block_unread_bytes() const;
  // The same without blocking (a scheduler's decision must not wait on a lock a busy step or
  // the I/O thread holds): false, *out unchanged, when the executor's or the reader's lock is busy.
  bool try_next_block_unread_bytes(std::uint64_t* out) const;
  // Thread-safe: the step() in progress (or the next one) returns at its next layer boundary.
  void interrupt();
  // Thread-safe: how urgent this model's reads are on a disk shared with other models
  // (ExecutorOptions::reader.disk; lower goes first). No effect without a shared disk.
  void set_read_priority(double priority);
  // Thread-safe, for a budget cut that cannot wait for the running layer to end: when the plan
  // in force needs more than `budget`, gives back at once every byte of weights the running
  // layer does not read (reads ahead cancelled, ring pages punched out, resident blocks
  // dropped): what stays is that layer's weights and the pinned slots, within the minimum
  // budget. The step in progress stops after the layer; the next set_budget() (or step(), at
  // the budget in force) re-plans and reads again what the rest needs. Returns whether anything
  // was given back (nothing on the GPU, where kernels run ahead of the thread).
  bool shed(std::uint64_t budget);

  // A new budget: re-plans (with the options' planner) and takes effect now. Between
  // inferences the next one runs the new plan; during one (between steps) the rest of it runs
  // the new plan from the next layer: reads in flight are cancelled and waited for, blocks read
  // ahead are dropped, and memory past the new budget is given back before this returns.
  // Throws (and keeps the old plan, and the inference in progress) if infeasible.
  void set_budget(std::uint64_t bytes);
  const ExecutionPlan& plan() const;
  // Predicted latency by budget, (budget bytes, ms) with budgets increasing and ms not: the
  // minimum budget first, then the PartitionTable's grid (ExecutorOptions::grid_step, else a
  // table of 64 steps built now); the last point keeps every block resident.
  std::vector<std::pair<std::uint64_t, double>> latency_curve() const;
  // Gives back every byte held for weights (a paused model): arena, resident blocks, pinned
  // slots. forward() then throws until set_budget() plans and allocates again.
  void release();
  bool released() const;
  WeightMemory weight_memory() const;
  std::uint64_t held_bytes() const;  // weight_memory().held, without counting pages (cheap)
  void reset_weight_peak();
  const ImageInfo& info() const;
  const Skeleton& skeleton() const;
  std::uint64_t bytes_read() const;      // by the block reader, since open
  // Bytes of reads that inferences have used, since open: bytes_read() less what is read ahead
  // for an inference not yet run and what a budget change dropped.
  std::uint64_t bytes_used() const;
  // Blocks read streamed into ring space older blocks still held, since open.
  std::uint64_t streamed_blocks() const;
  // Layer-granular pipelining (Note [Layer by layer] in read_ahead.cpp), since open: how long the
  // executing thread waited for bytes to land (0 when reads always beat compute), layers that
  // ran while the rest of their block was still being read, and ring bytes given back to the
  // next blocks before the block holding them ended.
  struct PipelineStats {
    double read_wait_ms = 0;
    std::uint64_t layers_started_early = 0;
    std::uint64_t released_early_bytes = 0;
    // Blocks pushed while a streamed block still waited for older blocks' bytes (Note
    // [Streaming into the ring]).
    std::uint64_t read_past_streamed = 0;
    // Fetches pushed (and their reads begun or, streamed, queued) by the pump that runs after a
    // layer inside a block while the ring lends (Note [Lending the activation reserve]): before,
    // a block held back by a layer's activations waited for the end of the running block.
    std::uint64_t read_at_layer_end = 0;
    // Note [Lending the activation reserve] in zone_lender.cpp, since open: the zone's size (the
    // activation reserve; 0: no lending), the most ring bytes lent to blocks at once, the most
    // zone bytes in use at once (activations + lent blocks; never above zone_bytes), and
    // activations that found no room above the lent bytes (placed outside, by libtorch).
    std::uint64_t zone_bytes = 0;
    std::uint64_t lent_peak_bytes = 0;
    std::uint64_t zone_peak_bytes = 0;
    std::uint64_t zone_misses = 0;
    // BlockReader::busy_seconds of this executor's reader, in ms: how long the disk had a read
    // of ours, since open.
    double disk_busy_ms = 0;
  };
  PipelineStats pipeline_stats() const;
  // Inputs whose activations were measured since open (Note [Dynamic shapes] in input_meter.cpp):
  // an inference whose inputs no recorded profile covers runs with weights at their least and
  // activations allowed the rest of the budget (past it the allocator refuses: the inference
  // fails with the numbers); its peak then joins input_profiles() and the reserve.
  std::uint64_t remeasured() const;
  std::vector<InputProfile> input_profiles() const;
  // Note [Learning the costs in service] (ExecutorOptions::learn_after), since open.
  struct Learning {
    std::uint64_t windows = 0;   // windows of learn_after inferences compared with the costs
    std::uint64_t replans = 0;   // of them, those that took costs (a plan put in force, or kept)
    std::uint64_t adopted = 0;   // plans made with learned costs put in force (with a grid: once built)
    // Re-plans that kept the plan in force: the best plan with the costs learned was not predicted
    // enough faster (Note [A re-plan must gain] in executor_learn.cpp); the costs were taken all the same.
    std::uint64_t kept_plans = 0;
    // The last window: summed |median measured - planned| layer time over the sum planned, the
    // sums themselves, and the read rates measured (0: under 4 MiB read) and planned.
    double layer_error = 0;
    double measured_layers_ms = 0;
    double planned_layers_ms = 0;
    double read_mb_s = 0;
    double planned_read_mb_s = 0;
    // The plan in force predicted with the costs measured over its prediction with the costs
    // planned with, less 1 (what learn_threshold is compared with).
    double plan_error = 0;
    // The last window's inferences, and the standard error of the median of the plan predicted
    // with each one's own costs, relative to that median: plan_error must exceed twice it too, and
    // a window too noisy to tell grows (Note [Noise in the window] in cost_learner.cpp).
    std::uint64_t window = 0;
    double noise = 0;
    // The last re-plan: the cost model's latency of the plan before (with the old costs) and of
    // the plan after (with the learned ones).
    double predicted_before_ms = 0;
    double predicted_after_ms = 0;
    // ExecutorOptions::learn_store: costs were read from it at open (layer times, read rate), and
    // how many times learned costs were written to it.
    bool loaded_times = false;
    bool loaded_rate = false;
    std::uint64_t stored = 0;
  };
  Learning learning() const;
  CostModel cost() const;  // the cost model planning uses now (its read rate learned, if it was)
  double bind_us_per_tensor() const;     // mean cost of binding one tensor by reference
  IoBackend backend() const;
  MemoryKind memory() const;

 private:
  explicit Executor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- comparing outputs ----
struct Comparison {
  bool equal = false;         // same structure, dtypes, shapes and bytes (bit-identical)
  double max_abs_diff = 0;    // over all tensors; 0 when equal; inf when structures differ
  std::string difference;     // first difference found, e.g. "output[1]['logits']: shape [2,3] vs [2,4]"
};
SWAPNET_API Comparison compare_outputs(const c10::IValue& expected, const c10::IValue& actual);

// Reads a shape like "1,3,224,224" (zero-size dimensions allowed); throws Error naming the text.
SWAPNET_API std::vector<std::int64_t> parse_shape(const std::string& text);

// ---- example inputs ----
// One forward argument per spec (Note [Input specs] in inputs.cpp): "1,3,224,224" (float32,
// normal), "DTYPE[SHAPE]" with DTYPE float32|float64|float16|bfloat16|int64|int32|int16|int8|
// uint8|bool (e.g. "int64[1,16]:0..8000": integers uniform in [0, 8000), default 0..10;
// zero-size dimensions allowed; "int64[]" a 0-dim tensor), "none" (None), "@FILE" (torch.save
// or .npy). Drawn in order after seeding the global generator with `seed`. Throws Error naming
// the spec and what is wrong.
SWAPNET_API std::vector<c10::IValue> make_inputs(const std::vector<std::string>& specs, std::uint64_t seed);
// A copy for one run (a model may modify its input in place): tensors cloned, other values
// deep-copied, None kept.
SWAPNET_API std::vector<c10::IValue> clone_inputs(const std::vector<c10::IValue>& in);

// ---- greedy generation, plain or speculative (Note [Speculative decoding] in speculate.cpp) ----
// A decoder's forward(tokens int64 [1, T], *state) -> (logits [1, T, vocab], *state): an
// Executor's, a Skeleton's, a torch::jit::Module's.
using TokenModel = std::function<c10::IValue(std::vector<c10::IValue>)>;
struct GenerationOptions {
  int new_tokens = 16;
  // Tokens the draft proposes per pass of the target: 0 chooses it per pass from the measured
  // acceptance and costs (Note [Choosing k]), up to max_k; with no draft, ignored.
  int k = 0;
  int max_k = 8;
  std::function<void()> after_pass;  // called after each pass of the target (e.g. to count reads)
  // With k chosen (k = 0), a draft that has not paid for 16 passes in a row is dropped for the
  // rest of the generation (Note [Choosing k]) and this is called: its memory may go to the target.
  std::function<void()> drop_draft;
};
struct GenerationResult {
  std::vector<std::int64_t> tokens;  // new_tokens ids: what greedy decoding by the target gives
  std::vector<double> pass_ms;       // each target pass, its draft calls included; [0]: the prompt's
  std::vector<int> pass_tokens;      // tokens each pass produced
  std::vector<int> pass_k;           // tokens the draft proposed for it (0: none)
  std::uint64_t proposed = 0, accepted = 0;  // the draft's proposals, and those the target kept
  double draft_ms = 0;               // time in the draft's calls
  int draft_dropped_at = -1;         // the pass after which the draft was dropped; -1: kept
};
// Generates greedily (argmax, ties to the lowest id) from `prompt` [1, T] with the target's and
// the draft's initial states. With a draft, the target checks k proposed tokens in one pass and
// keeps the longest prefix its own greedy choice agrees with, then its own next token; states
// are cut back to the kept length along their sequence dimension (the one a call grows by its
// tokens; a state that does not grow so is refused, naming it). `draft` empty: one token a pass.
SWAPNET_API GenerationResult generate_tokens(const TokenModel& target, const TokenModel& draft, const at::Tensor& prompt,
                                           const std::vector<c10::IValue>& target_state,
                                           const std::vector<c10::IValue>& draft_state, const GenerationOptions& o);

// ---- input profiles (Note [Dynamic shapes] in input_meter.cpp) ----
// forward's arguments as an image records them (InputProfile::inputs): tensors by dtype and
// sizes, lists/tuples/dicts flattened, other values as text.
SWAPNET_API std::vector<ImageInput> describe_inputs(const std::vector<c10::IValue>& inputs);
// Whether activations measured at `measured` hold for `inputs`: the same structure, dtypes, ranks
// and other values, and no dimension larger.
SWAPNET_API bool covers(const std::vector<ImageInput>& measured, const std::vector<ImageInput>& inputs);
// e.g. "int64[1,16] none float32[1,3,64,64]".
SWAPNET_API std::string inputs_text(const std::vector<ImageInput>& inputs);
// The profile of an image packed before profiles were recorded, from its input_shapes when they
// are float shapes ("1,3,224,224 1,10"); empty when they are anything else.
SWAPNET_API std::vector<ImageInput> legacy_input_profile(const std::string& input_shapes);

}  // namespace swapnet
