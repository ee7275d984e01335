// swapnet — command-line front end.
//
//   swapnet signature MODEL.pt                                        forward's signature (JSON)
//   swapnet inspect MODEL.pt|IMAGE.swapnet [--input-shape S] [--json]  the model info table
//   swapnet verify  MODEL.pt --input-shape S [--image IMAGE] [--json]  layered == forward, bit for bit
//   swapnet pack    MODEL.pt -o IMAGE.swapnet --input-shape S           write a swap image
//   swapnet run     IMAGE.swapnet --budget SIZE [--mode M] [--compare] [--check]  swapped inference
//   swapnet generate IMAGE.swapnet --budget SIZE --prompt-tokens N --new-tokens M  token generation
//   swapnet check   IMAGE.swapnet                                       verify every checksum
//   swapnet bench io IMAGE.swapnet [--json]                             disk rate vs block fetch rate
//   swapnet info [--json]                                               build and device facts
//   swapnet serve SCENARIO.json [--duration S] [--json]                 several models, one budget
//   swapnet ctl budget SIZE | status                                    talk to a running serve
//
// Output: human text by default, one JSON object on stdout with --json. Errors: one line
// "swapnet: error: ..." on stderr; exit 2 for errors, 1 for a negative verdict.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <exception>

#include "commands.h"
#include "ctl.h"
#include "swapnet/swapcore.h"

namespace {

using swapnet::cli::Common;

// Every value an option or argument is parsed into, whichever subcommand it belongs to.
struct Args {
  Common common;
  std::string model, out, image;
  int iters = 3, runs = 2;                 // inspect --iters, verify --runs
  std::vector<std::string> pack_profiles;  // pack --input-profile
  swapnet::cli::GenerateOptions go;
  swapnet::cli::RunOptions ro;
  std::string budget, profile_path;  // plan
  bool table = false;
  swapnet::cli::BoundOptions bound;
  std::vector<std::string> images;  // profile
  std::string profile_out;
  int samples = 32;
  swapnet::cli::BenchIoOptions bio;
  swapnet::cli::ServeOptions so;
  std::string scenario;
};

void add_common(CLI::App* app, Common& c, bool model_inputs, bool required) {
  if (model_inputs) {
    auto* o = app->add_option("--input-shape", c.input_shapes,
                              "shape of forward's float input, e.g. 1,3,224,224 (repeat for several inputs)");
    auto* typed = app->add_option("--input", c.inputs,
                                  "forward's input, typed (repeat, one per argument): DTYPE[SHAPE] e.g. "
                                  "int64[1,16]:0..8000 (integers in [0, 8000)), float32[8,1,8,0,64], bool[1,16]; "
                                  "none (an optional argument); @FILE (torch.save or .npy)");
    o->excludes(typed);
    (void)required;  // one of the two: checked where the inputs are made (it names both)
    app->add_option("--seed", c.seed, "seed of the random input (default 0)");
  }
  app->add_flag("--json", c.json, "print one JSON object on stdout");
  app->add_option("--threads", c.threads, "intra-op threads (default: all cores)");
  app->add_option("--log-level", c.log_level, "off|error|warn|info|debug (default warn)");
}

// --split-above and --split-part (inspect, verify, pack).
void add_split(CLI::App* app, Common& c) {
  app->add_option("--split-above", c.split_above,
                  "compute conv/linear layers with weights above this size (default 16MiB; 0: never) in parts along "
                  "their output channels, each a layer of its own");
  app->add_option("--split-part", c.split_part,
                  "the most bytes of one part of such a layer (default 4MiB; 0: the --split-above size)");
}

// inspect MODEL|IMAGE: the model info table.
CLI::App* add_inspect(CLI::App& app, Args& a) {
  auto* inspect = app.add_subcommand("inspect", "print the model info table (layers, bytes, FLOPs, time)");
  inspect->add_option("model", a.model, "TorchScript file (.pt) or swap image (.swapnet)")->required();
  inspect->add_option("--iters", a.iters, "timed runs for per-layer time (median; default 3)");
  add_common(inspect, a.common, true, false);
  add_split(inspect, a.common);
  return inspect;
}

// verify MODEL: layered == forward, bit for bit.
CLI::App* add_verify(CLI::App& app, Args& a) {
  auto* verify = app.add_subcommand("verify", "check that the layer-by-layer run equals forward bit for bit");
  verify->add_option("model", a.model, "TorchScript file (.pt)")->required();
  verify->add_option("--runs", a.runs, "runs of each path; every pair is compared (default 2)");
  verify->add_option("--image", a.image, "take skeleton and weights from this swap image of the model");
  add_common(verify, a.common, true, true);
  add_split(verify, a.common);
  return verify;
}

// pack MODEL -o IMAGE: a swap image.
CLI::App* add_pack(CLI::App& app, Args& a) {
  auto* pack = app.add_subcommand("pack", "write a model's swap image (one aligned file, layer by layer)");
  pack->add_option("model", a.model, "TorchScript file (.pt)")->required();
  pack->add_option("-o,--output", a.out, "image to write (.swapnet)")->required();
  add_common(pack, a.common, true, true);
  add_split(pack, a.common);
  pack->add_option("--input-profile", a.pack_profiles,
                   "more inputs to measure activations for, the specs of one forward call separated by spaces "
                   "(e.g. \"int64[1,512]:0..100 none\"); repeatable. Inputs no recorded profile covers are "
                   "measured at run time instead, at the least weight memory");
  return pack;
}

// signature MODEL: forward's signature.
CLI::App* add_signature(CLI::App& app, Args& a) {
  auto* sig = app.add_subcommand("signature", "forward's signature as JSON (for transparent swapping)");
  sig->add_option("model", a.model, "TorchScript file (.pt)")->required();
  return sig;
}

// generate IMAGE: token generation.
CLI::App* add_generate(CLI::App& app, Args& a) {
  auto* gen = app.add_subcommand("generate", "greedy token generation from a decoder's image, weights swapped per token");
  gen->add_option("image", a.image, "swap image of a model with forward(tokens, *state) -> (logits, *state)")->required();
  gen->add_option("--budget", a.go.budget, "memory budget for the model: bytes or KiB/MiB/GiB (the KV cache included)");
  gen->add_option("--prompt-tokens", a.go.prompt_tokens, "prompt length, random token ids (default 16)");
  gen->add_option("--new-tokens", a.go.new_tokens, "tokens to generate (default 16)");
  gen->add_option("--vocab", a.go.vocab, "vocabulary size (default: the rows of the first embedding)");
  gen->add_option("--state", a.go.state, "initial state, one --input-style spec per state argument (default: the image's "
                                       "example input after the tokens, as zeros)");
  gen->add_option("--mode", a.go.mode, "swapnet | direct (in memory) | naive (default swapnet)");
  gen->add_option("--profile", a.go.profile, "device profile (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  gen->add_option("--read-ahead", a.go.read_ahead, "ring | ring-whole | paper (default ring)");
  gen->add_option("--seed", a.common.seed, "seed of the prompt's token ids (default 0)");
  gen->add_option("--draft", a.go.draft, "speculative decoding: a small draft model (.swapnet or .pt) held in memory "
                  "proposes tokens the target checks in one pass (its bytes count in --budget)");
  gen->add_option("--draft-state", a.go.draft_state, "the draft's initial state, like --state (default: the draft "
                  "image's example state)");
  gen->add_option("--speculate", a.go.speculate, "tokens the draft proposes per pass: K, or auto (default with "
                  "--draft: chosen per pass from the measured acceptance and costs)");
  gen->add_option("--max-k", a.go.max_k, "auto's largest K (default 8)");
  gen->add_option("--vocab-file", a.go.vocab_file, "ids to text (a JSON list, models/textgen.py's): prints the text");
  gen->add_option("--prompt-text", a.go.prompt_text, "the prompt as text, in --vocab-file's pieces");
  add_common(gen, a.common, false, false);
  return gen;
}

// run IMAGE: swapped (or direct, naive) inference.
CLI::App* add_run(CLI::App& app, Args& a) {
  auto* run = app.add_subcommand("run", "inference from a swap image within a memory budget");
  run->add_option("image", a.image, "swap image (.swapnet)")->required();
  run->add_option("--budget", a.ro.budget, "memory budget for the model: bytes or KiB/MiB/GiB");
  run->add_option("--blocks", a.ro.blocks, "equal-byte blocks (default: the fewest that fit)");
  run->add_option("--partition", a.ro.partition, "first layer of each block after the first, e.g. 40,90,150");
  run->add_option("--iters", a.ro.iters, "timed inferences after one warm-up (default 5)");
  run->add_option("--mode", a.ro.mode, "swapnet | direct | naive (default swapnet)");
  run->add_flag("--compare", a.ro.compare, "run every mode in its own process, interleaved, and compare");
  run->add_option("--rounds", a.ro.rounds, "--compare rounds (default 3)");
  run->add_flag("--check", a.ro.check, "compare outputs with direct inference bit for bit");
  run->add_option("--verify", a.ro.verify, "checksums of fetched layers: first (default: first fetch after start) | always | never");
  run->add_option("--plan", a.ro.plan,
                  "auto (default: the partitioner's best blocks, some kept resident where the budget leaves room) | "
                  "optimal (the same, every block re-read each inference, as the paper) | equal (fewest equal-byte blocks)");
  run->add_option("--resident", a.ro.resident, "with --partition/--blocks: blocks kept resident, e.g. 0,3");
  run->add_option("--device", a.ro.device, "where layers run: cpu (default) | cuda (blocks in managed memory, no copies)");
  run->add_option("--profile", a.ro.profile, "device profile (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  run->add_option("--background-read", a.ro.background_mb_s,
                  "mode direct: read the image (O_DIRECT) at this many MB/s in a thread while timing (what "
                  "swapnet's reads cost the compute on this machine)");
  run->add_option("--learn", a.ro.learn,
                  "mode swapnet: every N inferences (and 1 s at least), compare the layer times and read rate "
                  "measured with the image's and the profile's and re-plan with them where they differ by more "
                  "than 10 %; the warm-up is then that first window (default 0: never; else 3..1000)")
      ->check(CLI::Range(0, 1000));
  run->add_option("--learn-store", a.ro.learn_store,
                  "with --learn: keep what is learned in this file (JSON), and plan with what it holds from the "
                  "first inference when it was learned for this image with this many threads");
  run->add_option("--trace", a.ro.trace,
                  "mode swapnet: write the timed inferences' timeline (layers, waits, reads, the disk's busy time, "
                  "why reads were held) as a Chrome trace JSON for ui.perfetto.dev or bench/trace_summary.py; with "
                  "--compare, of the last round");
  run->add_option("--read-ahead", a.ro.read_ahead,
                  "ring (default: as many blocks ahead as the budget holds, into the next inference; a block "
                  "that does not fit yet streams into the bytes older blocks free) | ring-whole (the same, a "
                  "block waiting for its whole room) | ring-blocks (the same, a block's layers waiting for all "
                  "of it and holding all of it until its last layer ran) | ring-reserved (the same as ring, the activation "
                  "reserve kept for activations all the time instead of lent to blocks where they leave it) | "
                  "ring-serial (the same as ring, nothing read after a streamed block until it is whole) | "
                  "two-ended (two blocks at the two ends of the ring's memory, into the next inference; for "
                  "comparison) | paper (two blocks, one inference at a time)");
  add_common(run, a.common, true, false);
  return run;
}

// plan IMAGE --budget SIZE: the partition and its prediction.
CLI::App* add_plan(CLI::App& app, Args& a) {
  auto* plan = app.add_subcommand("plan", "the partition run would use for a budget, predicted latency, lookup time");
  plan->add_option("image", a.image, "swap image (.swapnet)")->required();
  plan->add_option("--budget", a.budget, "memory budget: bytes or KiB/MiB/GiB")->required();
  plan->add_option("--profile", a.profile_path, "device profile (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  plan->add_flag("--table", a.table, "also list the paper's lookup table (n equal-byte blocks, memory, latency)");
  plan->add_option("--read-mb-s", a.bound.read_mb_s,
                   "memory bound on a disk of this rate in MB/s (default: the profile's)")->check(CLI::PositiveNumber);
  plan->add_option("--compute-ms", a.bound.compute_ms,
                   "memory bound with the model computing in this many ms (default: the plan's)")->check(CLI::PositiveNumber);
  add_common(plan, a.common, false, false);
  return plan;
}

// profile IMAGE...: the device profile.
CLI::App* add_profile(CLI::App& app, Args& a) {
  auto* prof = app.add_subcommand("profile", "measure this device and fit the partitioner's cost model");
  prof->add_option("images", a.images, "swap image(s) to measure with (the first is fitted; others report errors)")->required();
  prof->add_option("-o,--output", a.profile_out, "where to write it (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  prof->add_option("--samples", a.samples, "random layer ranges to fetch (default 32)");
  add_common(prof, a.common, true, false);
  return prof;
}

// check IMAGE: every checksum.
CLI::App* add_check(CLI::App& app, Args& a) {
  auto* check = app.add_subcommand("check", "verify every layer checksum of a swap image");
  check->add_option("image", a.image, "swap image (.swapnet)")->required();
  add_common(check, a.common, false, false);
  return check;
}

// bench io IMAGE: the disk's rate against block fetches (returns `bench io`).
CLI::App* add_bench(CLI::App& app, Args& a) {
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* bench_io = bench->add_subcommand("io", "raw O_DIRECT read rate vs swapcore block fetch rate, in one run");
  bench_io->add_option("image", a.image, "swap image (.swapnet)")->required();
  bench_io->add_option("--runs", a.bio.runs, "interleaved raw/fetch rounds after the sweep; medians reported (default 5)");
  bench_io->add_option("--blocks", a.bio.blocks, "blocks the layers are grouped into (default 8)");
  bench_io->add_option("--queue-depth", a.bio.queue_depth, "block reader queue depth (default: swapcore's)");
  bench_io->add_option("--request-size", a.bio.request_bytes, "block reader request bytes (default: swapcore's)");
  add_common(bench_io, a.common, false, false);
  return bench_io;
}

// serve SCENARIO: several models in one budget.
CLI::App* add_serve(CLI::App& app, Args& a) {
  auto* serve = app.add_subcommand("serve", "serve several models concurrently within one total budget (a scenario file)");
  serve->add_option("scenario", a.scenario, "scenario file (.json; scheduler/scenarios/ has the paper's)")->required();
  serve->add_option("--duration", a.so.duration_s, "seconds to serve (overrides the scenario's duration_s)");
  serve->add_option("--policy", a.so.policy, "budget split: paper (Eq. 1) | equal | minmax (overrides the scenario's)");
  serve->add_option("--scheduler", a.so.scheduler,
                    "which block runs next: threads (a thread per model) | fifo | rr | sel | lst | heft, or one of those + \"+io\" "
                    "(disk-aware: blocks in memory first) (overrides the scenario's; default: lst where the scenario has "
                    "deadlines, else threads)");
  serve->add_option("--workers", a.so.workers, "a central scheduler's workers: blocks run at once (overrides the "
                    "scenario's; default one, on every core)")->check(CLI::Range(1, 1024));
  serve->add_option("--budget", a.so.budget, "total budget: size or N% of the models' size (overrides the scenario's)");
  serve->add_option("--socket", a.so.socket, "control socket for `swapnet ctl` (default $XDG_RUNTIME_DIR/swapnet/serve.sock or /tmp/swapnet-UID/serve.sock; none: no socket)");
  serve->add_option("--budget-source", a.so.budget_source, "watch the total budget: file:PATH | meminfo:RESERVE | cgroup:PATH");
  serve->add_option("--poll-ms", a.so.poll_ms, "budget source polling period (default 50)");
  serve->add_option("--period-scale", a.so.period_scale,
                    "multiply every period (models' and groups', and their jitter; rate_hz divided): the load "
                    "sweep; deadlines stay")
      ->check(CLI::PositiveNumber);
  serve->add_option("--slo-scale", a.so.slo_scale, "multiply every deadline (slo_ms of models and groups)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--load", a.so.load,
                    "scale every period and deadline so that the models, run directly, would keep this share of "
                    "the cores busy (latencies measured before the run; overrides the scenario's \"load\")")
      ->check(CLI::Range(0.01, 10.0));
  serve->add_option("--warmup", a.so.warmup_s,
                    "seconds of arrivals not counted (default: the scenario's warmup_s, else two of its longest "
                    "period, at most a fifth of the run)")
      ->check(CLI::Range(0.0, 3600.0));
  serve->add_option("--min-requests", a.so.min_requests,
                    "run past the duration until every open-loop model has had N counted arrivals (at most 4x the "
                    "duration)")
      ->check(CLI::Range(0, 1000000));
  serve->add_option("--timeline", a.so.timeline, "write every request (time, model, latency, total budget) as CSV");
  serve->add_option("--trace", a.so.trace,
                    "write every model's timeline (layers, waits, reads, budget moves) as a Chrome trace JSON "
                    "(ui.perfetto.dev; bench/trace_summary.py)");
  serve->add_option("--models", a.so.models_dir, "directory of relative image paths (default $SWAPNET_MODELS or .cache/models)");
  serve->add_option("--profile", a.so.profile, "device profile (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  serve->add_option("--learn", a.so.learn,
                    "every N inferences (and 1 s at least) each model compares its measured layer times and read rate with its "
                    "planned ones, re-plans with them when >10 % off, and the budget is split again with its new "
                    "latency curve (default 0: never; else 3..1000)")
      ->check(CLI::Range(0, 1000));
  serve->add_option("--learn-store", a.so.learn_store,
                    "with --learn: keep each model's learned costs in DIR/NAME.learned.json, and plan with them "
                    "from the first inference of the next serve");
  serve->add_flag("!--no-check", a.so.check, "do not compare outputs with direct inference");
  add_common(serve, a.common, false, false);
  serve->get_option("--threads")->description(
      "intra-op threads of every model the scenario gives none (default: the cores over a central scheduler's "
      "workers, or over the models under threads)");
  return serve;
}

// info: build and device facts.
CLI::App* add_info(CLI::App& app, Args& a) {
  auto* info = app.add_subcommand("info", "build and device facts (CUDA, threads)");
  add_common(info, a.common, false, false);
  return info;
}

// The subcommands main runs, as parsed.
struct Subcommands {
  CLI::App *inspect, *verify, *pack, *sig, *gen, *run, *plan, *prof, *check, *bench_io, *serve, *info;
};

// Every subcommand, in the order the help lists them.
Subcommands add_subcommands(CLI::App& app, Args& a) {
  Subcommands s;
  s.inspect = add_inspect(app, a);
  s.verify = add_verify(app, a);
  s.pack = add_pack(app, a);
  s.sig = add_signature(app, a);
  s.gen = add_generate(app, a);
  s.run = add_run(app, a);
  s.plan = add_plan(app, a);
  s.prof = add_profile(app, a);
  s.check = add_check(app, a);
  s.bench_io = add_bench(app, a);
  s.serve = add_serve(app, a);
  // Listed for the help only: main hands `ctl` to ctl_main before parsing (cli/ctl.cpp).
  app.add_subcommand("ctl", "send a command to a running swapnet serve: budget SIZE | status");
  s.info = add_info(app, a);
  return s;
}

// The parsed subcommand's exit status (2: none of them).
int dispatch(const Subcommands& s, const Args& a) {
  const Common& common = a.common;
  if (*s.inspect) return swapnet::cli::inspect(a.model, common, a.iters < 1 ? 1 : a.iters);
  if (*s.verify) return swapnet::cli::verify(a.model, common, a.runs < 1 ? 1 : a.runs, a.image);
  if (*s.pack) return swapnet::cli::pack(a.model, a.out, common, a.pack_profiles);
  if (*s.sig) return swapnet::cli::signature(a.model);
  if (*s.check) return swapnet::cli::check(a.image, common);
  if (*s.run) return swapnet::cli::run(a.image, common, a.ro);
  if (*s.gen) return swapnet::cli::generate(a.image, common, a.go);
  if (*s.plan) return swapnet::cli::plan(a.image, common, a.budget, a.profile_path, a.table, a.bound);
  if (*s.prof) return swapnet::cli::profile(a.images, common, a.profile_out, a.samples);
  if (*s.bench_io) return swapnet::cli::bench_io(a.image, common, a.bio);
  if (*s.info) return swapnet::cli::info(common);
  if (*s.serve) return swapnet::cli::serve(a.scenario, common, a.so);
  return 2;
}

}  // namespace

int swapnet::cli::cli_main(int argc, char** argv) {
  // As the launcher does (cli/launcher.cpp), without CLI11: one parser, one usage text.
  if (argc >= 2 && std::strcmp(argv[1], "ctl") == 0) return swapnet::cli::ctl_main(argc, argv);
  CLI::App app{"swapnet: run DNNs larger than their memory budget by swapping blocks of layers"};
  app.require_subcommand(1);
  Args a;
  const Subcommands s = add_subcommands(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!a.common.inputs.empty()) a.common.input_shapes = a.common.inputs;  // --input and --input-shape exclude each other
  try {
    return dispatch(s, a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swapnet: error: %s\n", e.what());
    return 2;
  }
}
