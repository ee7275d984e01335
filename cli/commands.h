// The swapnet CLI's commands. Each returns the process exit status: 0 success, 1 a negative
// verdict (outputs differ, a checksum fails), 2 an error (thrown as swapnet::Error).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "swapnet/partitioner.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

struct Common {
  // --input SPEC or --input-shape S, repeatable, one per forward argument (make_inputs in
  // assembly.h); --input's are moved here after parsing.
  std::vector<std::string> input_shapes;
  std::vector<std::string> inputs;        // --input, as parsed
  bool json = false;                      // --json: one JSON object on stdout
  int threads = 0;                        // --threads: intra-op threads, 0 = all cores
  std::uint64_t seed = 0;                 // --seed of the random input
  std::string log_level = "warn";         // --log-level
  // --split-above SIZE (inspect, verify, pack of a .pt): SkeletonOptions::split_above; empty: its
  // default (Note [Splitting large layers] in assembly/src/skeleton_split.cpp).
  std::string split_above;
  std::string split_part;  // --split-part SIZE: SkeletonOptions::split_part; empty: its default
};

void apply_common(const Common& c);  // log level and thread count

// The whole command line of swapnet-cli (cli/main.cpp): its process's exit status. main() is
// only this (cli/cli_entry.cpp), so the tests' fork server (tests/cli_fork_server.cpp) runs the
// same commands.
int cli_main(int argc, char** argv);

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
// The q-quantile (nearest rank) of samples; 0 for none. median(v) = percentile(v, 0.5).
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(i == 0 ? 0 : i - 1, v.size() - 1)];
}
inline double median(const std::vector<double>& v) { return percentile(v, 0.5); }
bool is_image(const std::string& path);  // starts with the swap image magic

int inspect(const std::string& path, const Common& c, int iters);
int verify(const std::string& path, const Common& c, int runs, const std::string& image);
// `profiles`: --input-profile, more inputs (specs separated by spaces) whose activations are
// measured and recorded (InputProfile).
int pack(const std::string& model, const std::string& out, const Common& c, const std::vector<std::string>& profiles = {});
// forward's signature without self, as one JSON line {model, schema, inputs: [{name, type}]}:
// what transparent swapping needs to stand in for a model it has no image of yet.
int signature(const std::string& model);
int check(const std::string& image, const Common& c);
int info(const Common& c);

// swapnet generate (cmd_generate.cpp, Note [Generation]).
struct GenerateOptions {
  std::string budget;               // --budget SIZE
  int prompt_tokens = 16;           // --prompt-tokens N
  int new_tokens = 16;              // --new-tokens M
  std::int64_t vocab = 0;           // --vocab V (default: the first embedding's rows)
  std::vector<std::string> state;   // --state SPEC, repeatable (default: the image's example state)
  std::string mode = "swapnet";     // --mode swapnet | direct | naive
  std::string profile;              // --profile device.json
  std::string read_ahead = "ring";  // --read-ahead
  // Speculative decoding (Note [Speculative decoding] in assembly/src/speculate.cpp):
  std::string draft;                     // --draft MODEL (.swapnet or .pt), held in memory
  std::vector<std::string> draft_state;  // --draft-state SPEC (default: the draft image's example)
  std::string speculate;                 // --speculate K | auto (with --draft, default auto)
  int max_k = 8;                         // --max-k: auto's largest k
  std::string vocab_file;                // --vocab-file V.json: --prompt-text and the text generated
  std::string prompt_text;               // --prompt-text TEXT (needs --vocab-file)
};
int generate(const std::string& image, const Common& c, const GenerateOptions& o);

struct RunOptions {
  std::string budget;        // --budget SIZE (bytes, KiB/MiB/GiB)
  int blocks = 0;            // --blocks N equal-byte blocks
  std::string partition;     // --partition i,j,...: first layer of each block after the first
  int iters = 5;             // timed inferences (after one warm-up)
  std::string mode = "swapnet";  // swapnet | direct | naive
  bool compare = false;      // every mode in its own process, interleaved
  int rounds = 3;            // --compare rounds
  bool check = false;        // compare outputs with direct inference bit for bit
  std::string verify = "first";  // checksums: first fetch of each layer | always | never
  std::string plan = "auto";     // auto | optimal | equal (see main.cpp)
  std::string resident;          // --resident i,j: blocks of --partition/--blocks kept resident
  std::string profile;           // --profile FILE (default: default_profile_path())
  std::string device = "cpu";    // --device cpu|cuda: where layers run (swapnet and direct modes)
  std::string read_ahead = "ring";  // --read-ahead ring|paper
  // --background-read MB/s (mode direct): O_DIRECT reads of the image at this pace in a thread
  // while the timed inferences run; --compare uses it for `direct_under_io`.
  double background_mb_s = 0;
  // --trace FILE (mode swapnet): the timed inferences' timeline as a Chrome trace (Note [Tracing]
  // in swapcore/src/trace.cpp); with --compare, the last round's swapnet run writes it.
  std::string trace;
  // --learn N (mode swapnet): the executor learns its layer times and read rate every N
  // inferences (ExecutorOptions::learn_after; Note [Learning the costs in service]) and the
  // warm-up is N inferences, so the timed ones run the plan learned; 0: the image's and the
  // profile's costs all along.
  int learn = 0;
  std::string learn_store;  // --learn-store PATH: ExecutorOptions::learn_store
};
int run(const std::string& image, const Common& c, const RunOptions& o);
// run --compare (run_compare.cpp): every mode in its own process, rounds interleaved.
int run_compare(const std::string& image, const Common& c, const RunOptions& o);
// What-if device for plan's memory bound: the disk's rate and the whole model's compute time
// (<= 0: the profile's rate, the image's layer times as the plan predicts them).
struct BoundOptions {
  double read_mb_s = 0;
  double compute_ms = 0;
};
int plan(const std::string& image, const Common& c, const std::string& budget, const std::string& profile_path,
         bool table, const BoundOptions& bound = {});
// The partitioner's memory_bound_ms for an image in `budget` (weights + activations): the image's
// layer times scaled to `compute_ms` (<= 0: as they are), its tensors' bytes without padding, a
// disk of `read_mb_s` (MB = 1e6 bytes). Infinite when some layer does not fit. That bounds any
// schedule, including one that lends the bytes a layer's activations leave idle to weights; with
// `constant_reserve`, every layer's activations take the image's whole reserve, as in swapnet's
// plans (docs/partitioner.md).
double image_memory_bound_ms(const ImageInfo& info, std::uint64_t budget, double compute_ms, double read_mb_s,
                             bool constant_reserve = false);
// The least latency of plans that keep a constant activation reserve, as swapnet's do: max(compute,
// the constant-reserve memory bound, `least_read_bytes` -- min_read_bytes -- at `read_mb_s`).
double image_reserve_bound_ms(const ImageInfo& info, std::uint64_t budget, double compute_ms, double read_mb_s,
                              std::uint64_t least_read_bytes);

// swapnet profile (cmd_profile.cpp).
struct MeasureOptions {
  int samples = 32;    // random layer ranges fetched, bound and unbound
  int repeats = 3;     // per range; the median is fitted
  int exec_runs = 5;   // timed forwards for per-layer execution times
  bool calibrate = true;  // whole swapped runs (below); off for images only reported on
  // Per-block costs tried on whole swapped runs (besides the fitted one).
  std::vector<double> pipeline_block_ms = {0.25, 0.5, 1, 2, 4};
  int pipeline_iters = 7;  // interleaved rounds; medians fitted
  unsigned seed = 1;
};
int profile(const std::vector<std::string>& images, const Common& c, const std::string& out, int samples);
// The device profile to plan with: `path_option` (or the default path) if it describes this
// process; if there is none, one measured now from `image` and saved there; if it is stale (other
// host, CPU or thread count), one measured now and not saved (both said once on stderr); if it
// is unreadable or malformed, Error naming the file and the field.
DeviceProfile device_profile(const std::string& image, const Common& c, const std::string& path_option);

// The raw sequential O_DIRECT read rate of [begin, end) of a file (io_uring, 32 x 256 KiB,
// registered buffers), in MB/s: the baseline every I/O figure is compared with. One pass, or
// back-to-back passes for at least `min_seconds`: the sustained rate of a disk kept busy (an
// emulated disk, cgroup v1 blkio, lets up to one throttle slice of bytes through at once after
// idle, so a single short pass can read faster than the disk's rate).
double raw_read_mb_s(const std::string& path, std::uint64_t begin, std::uint64_t end, double min_seconds = 0);

// swapnet serve (cmd_serve.cpp; `swapnet ctl` is cli/ctl.cpp).
struct ServeOptions {
  double duration_s = 0;      // --duration: overrides the scenario's
  std::string policy;         // --policy: overrides the scenario's
  std::string scheduler;      // --scheduler threads|fifo|rr|sel|lst|heft: overrides the scenario's
  int workers = 0;            // --workers: overrides the scenario's (0: the scenario's, else one)
  std::string budget;         // --budget: overrides the scenario's total (size or N%)
  std::string socket;         // --socket PATH for `swapnet ctl` (default default_control_path(); "none")
  std::string budget_source;  // --budget-source file:PATH | meminfo:RESERVE | cgroup:PATH
  int poll_ms = 50;           // --poll-ms for the budget source
  std::string timeline;       // --timeline FILE.csv: every request's time, latency, total budget
  std::string models_dir;     // --models DIR for relative image paths
  std::string profile;        // --profile FILE
  bool check = true;          // compare every output with direct inference (--no-check: off)
  double period_scale = 1;    // --period-scale: every period (and jitter) times this; deadlines stay
  double slo_scale = 1;       // --slo-scale: every deadline times this
  double load = 0;            // --load: overrides the scenario's (Note [Load and run rules] in serve_load.cpp)
  double warmup_s = -1;       // --warmup S: overrides the scenario's warmup_s
  int min_requests = -1;      // --min-requests N: overrides the scenario's
  std::string trace;          // --trace FILE.json: the models' timelines (Note [Tracing] in swapcore)
  int learn = 0;              // --learn N: ExecutorOptions::learn_after of every model
  std::string learn_store;    // --learn-store DIR: each model's learned costs kept in DIR/NAME.learned.json
};
int serve(const std::string& scenario, const Common& c, const ServeOptions& o);

struct BenchIoOptions {
  int runs = 5;          // interleaved raw/fetch rounds after the sweep; medians reported
  int blocks = 8;        // the image's layers grouped into this many equal-byte blocks
  unsigned queue_depth = 0;       // reader queue depth; 0 = swapcore's default
  std::size_t request_bytes = 0;  // reader request size; 0 = swapcore's default
};
int bench_io(const std::string& image, const Common& c, const BenchIoOptions& o);

}  // namespace cli
}  // namespace swapnet
