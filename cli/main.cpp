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

}  // namespace

int main(int argc, char** argv) {
  // As the launcher does (cli/launcher.cpp), without CLI11: one parser, one usage text.
  if (argc >= 2 && std::strcmp(argv[1], "ctl") == 0) return swapnet::cli::ctl_main(argc, argv);
  CLI::App app{"swapnet: run DNNs larger than their memory budget by swapping blocks of layers"};
  app.require_subcommand(1);
  Common common;
  std::string model, out, image;
  int iters = 3, runs = 2;
  swapnet::cli::BenchIoOptions bio;

  auto* inspect = app.add_subcommand("inspect", "print the model info table (layers, bytes, FLOPs, time)");
  inspect->add_option("model", model, "TorchScript file (.pt) or swap image (.swapnet)")->required();
  inspect->add_option("--iters", iters, "timed runs for per-layer time (median; default 3)");
  add_common(inspect, common, true, false);
  inspect->add_option("--split-above", common.split_above,
                  "compute conv/linear layers with weights above this size (default 16MiB; 0: never) in parts along "
                  "their output channels, each a layer of its own");
  inspect->add_option("--split-part", common.split_part,
                  "the most bytes of one part of such a layer (default 4MiB; 0: the --split-above size)");

  auto* verify = app.add_subcommand("verify", "check that the layer-by-layer run equals forward bit for bit");
  verify->add_option("model", model, "TorchScript file (.pt)")->required();
  verify->add_option("--runs", runs, "runs of each path; every pair is compared (default 2)");
  verify->add_option("--image", image, "take skeleton and weights from this swap image of the model");
  add_common(verify, common, true, true);
  verify->add_option("--split-above", common.split_above,
                  "compute conv/linear layers with weights above this size (default 16MiB; 0: never) in parts along "
                  "their output channels, each a layer of its own");
  verify->add_option("--split-part", common.split_part,
                  "the most bytes of one part of such a layer (default 4MiB; 0: the --split-above size)");

  auto* pack = app.add_subcommand("pack", "write a model's swap image (one aligned file, layer by layer)");
  pack->add_option("model", model, "TorchScript file (.pt)")->required();
  pack->add_option("-o,--output", out, "image to write (.swapnet)")->required();
  add_common(pack, common, true, true);
  pack->add_option("--split-above", common.split_above,
                  "compute conv/linear layers with weights above this size (default 16MiB; 0: never) in parts along "
                  "their output channels, each a layer of its own");
  pack->add_option("--split-part", common.split_part,
                  "the most bytes of one part of such a layer (default 4MiB; 0: the --split-above size)");
  std::vector<std::string> pack_profiles;
  pack->add_option("--input-profile", pack_profiles,
                   "more inputs to measure activations for, the specs of one forward call separated by spaces "
                   "(e.g. \"int64[1,512]:0..100 none\"); repeatable. Inputs no recorded profile covers are "
                   "measured at run time instead, at the least weight memory");

  auto* sig = app.add_subcommand("signature", "forward's signature as JSON (for transparent swapping)");
  sig->add_option("model", model, "TorchScript file (.pt)")->required();

  swapnet::cli::GenerateOptions go;
  auto* gen = app.add_subcommand("generate", "greedy token generation from a decoder's image, weights swapped per token");
  gen->add_option("image", image, "swap image of a model with forward(tokens, *state) -> (logits, *state)")->required();
  gen->add_option("--budget", go.budget, "memory budget for the model: bytes or KiB/MiB/GiB (the KV cache included)");
  gen->add_option("--prompt-tokens", go.prompt_tokens, "prompt length, random token ids (default 16)");
  gen->add_option("--new-tokens", go.new_tokens, "tokens to generate (default 16)");
  gen->add_option("--vocab", go.vocab, "vocabulary size (default: the rows of the first embedding)");
  gen->add_option("--state", go.state, "initial state, one --input-style spec per state argument (default: the image's "
                                       "example input after the tokens, as zeros)");
  gen->add_option("--mode", go.mode, "swapnet | direct (in memory) | naive (default swapnet)");
  gen->add_option("--profile", go.profile, "device profile (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  gen->add_option("--read-ahead", go.read_ahead, "ring | ring-whole | paper (default ring)");
  gen->add_option("--seed", common.seed, "seed of the prompt's token ids (default 0)");
  add_common(gen, common, false, false);

  swapnet::cli::RunOptions ro;
  auto* run = app.add_subcommand("run", "inference from a swap image within a memory budget");
  run->add_option("image", image, "swap image (.swapnet)")->required();
  run->add_option("--budget", ro.budget, "memory budget for the model: bytes or KiB/MiB/GiB");
  run->add_option("--blocks", ro.blocks, "equal-byte blocks (default: the fewest that fit)");
  run->add_option("--partition", ro.partition, "first layer of each block after the first, e.g. 40,90,150");
  run->add_option("--iters", ro.iters, "timed inferences after one warm-up (default 5)");
  run->add_option("--mode", ro.mode, "swapnet | direct | naive (default swapnet)");
  run->add_flag("--compare", ro.compare, "run every mode in its own process, interleaved, and compare");
  run->add_option("--rounds", ro.rounds, "--compare rounds (default 3)");
  run->add_flag("--check", ro.check, "compare outputs with direct inference bit for bit");
  run->add_option("--verify", ro.verify, "checksums of fetched layers: first (default: first fetch after start) | always | never");
  run->add_option("--plan", ro.plan,
                  "auto (default: the partitioner's best blocks, some kept resident where the budget leaves room) | "
                  "optimal (the same, every block re-read each inference, as the paper) | equal (fewest equal-byte blocks)");
  run->add_option("--resident", ro.resident, "with --partition/--blocks: blocks kept resident, e.g. 0,3");
  run->add_option("--device", ro.device, "where layers run: cpu (default) | cuda (blocks in managed memory, no copies)");
  run->add_option("--profile", ro.profile, "device profile (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  run->add_option("--background-read", ro.background_mb_s,
                  "mode direct: read the image (O_DIRECT) at this many MB/s in a thread while timing (what "
                  "swapnet's reads cost the compute on this machine)");
  run->add_option("--learn", ro.learn,
                  "mode swapnet: every N inferences (and 1 s at least), compare the layer times and read rate "
                  "measured with the image's and the profile's and re-plan with them where they differ by more "
                  "than 10 %; the warm-up is then that first window (default 0: never; else 3..1000)")
      ->check(CLI::Range(0, 1000));
  run->add_option("--learn-store", ro.learn_store,
                  "with --learn: keep what is learned in this file (JSON), and plan with what it holds from the "
                  "first inference when it was learned for this image with this many threads");
  run->add_option("--trace", ro.trace,
                  "mode swapnet: write the timed inferences' timeline (layers, waits, reads, the disk's busy time, "
                  "why reads were held) as a Chrome trace JSON for ui.perfetto.dev or bench/trace_summary.py; with "
                  "--compare, of the last round");
  run->add_option("--read-ahead", ro.read_ahead,
                  "ring (default: as many blocks ahead as the budget holds, into the next inference; a block "
                  "that does not fit yet streams into the bytes older blocks free) | ring-whole (the same, a "
                  "block waiting for its whole room) | ring-blocks (the same, a block's layers waiting for all "
                  "of it and holding all of it until its last layer ran) | ring-reserved (the same as ring, the activation "
                  "reserve kept for activations all the time instead of lent to blocks where they leave it) | "
                  "ring-serial (the same as ring, nothing read after a streamed block until it is whole) | paper "
                  "(two blocks, one inference at a time)");
  add_common(run, common, true, false);

  std::string budget, profile_path;
  bool table = false;
  auto* plan = app.add_subcommand("plan", "the partition run would use for a budget, predicted latency, lookup time");
  plan->add_option("image", image, "swap image (.swapnet)")->required();
  plan->add_option("--budget", budget, "memory budget: bytes or KiB/MiB/GiB")->required();
  plan->add_option("--profile", profile_path, "device profile (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  plan->add_flag("--table", table, "also list the paper's lookup table (n equal-byte blocks, memory, latency)");
  swapnet::cli::BoundOptions bound;
  plan->add_option("--read-mb-s", bound.read_mb_s,
                   "memory bound on a disk of this rate in MB/s (default: the profile's)")->check(CLI::PositiveNumber);
  plan->add_option("--compute-ms", bound.compute_ms,
                   "memory bound with the model computing in this many ms (default: the plan's)")->check(CLI::PositiveNumber);
  add_common(plan, common, false, false);

  std::vector<std::string> images;
  std::string profile_out;
  int samples = 32;
  auto* prof = app.add_subcommand("profile", "measure this device and fit the partitioner's cost model");
  prof->add_option("images", images, "swap image(s) to measure with (the first is fitted; others report errors)")->required();
  prof->add_option("-o,--output", profile_out, "where to write it (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  prof->add_option("--samples", samples, "random layer ranges to fetch (default 32)");
  add_common(prof, common, true, false);

  auto* check = app.add_subcommand("check", "verify every layer checksum of a swap image");
  check->add_option("image", image, "swap image (.swapnet)")->required();
  add_common(check, common, false, false);

  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* bench_io = bench->add_subcommand("io", "raw O_DIRECT read rate vs swapcore block fetch rate, in one run");
  bench_io->add_option("image", image, "swap image (.swapnet)")->required();
  bench_io->add_option("--runs", bio.runs, "interleaved raw/fetch rounds after the sweep; medians reported (default 5)");
  bench_io->add_option("--blocks", bio.blocks, "blocks the layers are grouped into (default 8)");
  bench_io->add_option("--queue-depth", bio.queue_depth, "block reader queue depth (default: swapcore's)");
  bench_io->add_option("--request-size", bio.request_bytes, "block reader request bytes (default: swapcore's)");
  add_common(bench_io, common, false, false);

  swapnet::cli::ServeOptions so;
  std::string scenario;
  auto* serve = app.add_subcommand("serve", "serve several models concurrently within one total budget (a scenario file)");
  serve->add_option("scenario", scenario, "scenario file (.json; scheduler/scenarios/ has the paper's)")->required();
  serve->add_option("--duration", so.duration_s, "seconds to serve (overrides the scenario's duration_s)");
  serve->add_option("--policy", so.policy, "budget split: paper (Eq. 1) | equal | minmax (overrides the scenario's)");
  serve->add_option("--scheduler", so.scheduler,
                    "which block runs next: threads (a thread per model) | fifo | rr | sel | lst | heft, or one of those + \"+io\" "
                    "(disk-aware: blocks in memory first) (overrides the scenario's)");
  serve->add_option("--budget", so.budget, "total budget: size or N% of the models' size (overrides the scenario's)");
  serve->add_option("--socket", so.socket, "control socket for `swapnet ctl` (default $XDG_RUNTIME_DIR/swapnet/serve.sock or /tmp/swapnet-UID/serve.sock; none: no socket)");
  serve->add_option("--budget-source", so.budget_source, "watch the total budget: file:PATH | meminfo:RESERVE | cgroup:PATH");
  serve->add_option("--poll-ms", so.poll_ms, "budget source polling period (default 50)");
  serve->add_option("--period-scale", so.period_scale,
                    "multiply every period (models' and groups', and their jitter; rate_hz divided): the load "
                    "sweep; deadlines stay")
      ->check(CLI::PositiveNumber);
  serve->add_option("--slo-scale", so.slo_scale, "multiply every deadline (slo_ms of models and groups)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--timeline", so.timeline, "write every request (time, model, latency, total budget) as CSV");
  serve->add_option("--trace", so.trace,
                    "write every model's timeline (layers, waits, reads, budget moves) as a Chrome trace JSON "
                    "(ui.perfetto.dev; bench/trace_summary.py)");
  serve->add_option("--models", so.models_dir, "directory of relative image paths (default $SWAPNET_MODELS or .cache/models)");
  serve->add_option("--profile", so.profile, "device profile (default $SWAPNET_PROFILE or ~/.cache/swapnet/device.json)");
  serve->add_option("--learn", so.learn,
                    "every N inferences (and 1 s at least) each model compares its measured layer times and read rate with its "
                    "planned ones, re-plans with them when >10 % off, and the budget is split again with its new "
                    "latency curve (default 0: never; else 3..1000)")
      ->check(CLI::Range(0, 1000));
  serve->add_option("--learn-store", so.learn_store,
                    "with --learn: keep each model's learned costs in DIR/NAME.learned.json, and plan with them "
                    "from the first inference of the next serve");
  serve->add_flag("!--no-check", so.check, "do not compare outputs with direct inference");
  add_common(serve, common, false, false);

  // Listed for the help only: main hands `ctl` to ctl_main before parsing (cli/ctl.cpp).
  app.add_subcommand("ctl", "send a command to a running swapnet serve: budget SIZE | status");

  auto* info = app.add_subcommand("info", "build and device facts (CUDA, threads)");
  add_common(info, common, false, false);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!common.inputs.empty()) common.input_shapes = common.inputs;  // --input and --input-shape exclude each other
  try {
    if (*inspect) return swapnet::cli::inspect(model, common, iters < 1 ? 1 : iters);
    if (*verify) return swapnet::cli::verify(model, common, runs < 1 ? 1 : runs, image);
    if (*pack) return swapnet::cli::pack(model, out, common, pack_profiles);
    if (*sig) return swapnet::cli::signature(model);
    if (*check) return swapnet::cli::check(image, common);
    if (*run) return swapnet::cli::run(image, common, ro);
    if (*gen) return swapnet::cli::generate(image, common, go);
    if (*plan) return swapnet::cli::plan(image, common, budget, profile_path, table, bound);
    if (*prof) return swapnet::cli::profile(images, common, profile_out, samples);
    if (*bench_io) return swapnet::cli::bench_io(image, common, bio);
    if (*info) return swapnet::cli::info(common);
    if (*serve) return swapnet::cli::serve(scenario, common, so);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swapnet: error: %s\n", e.what());
    return 2;
  }
  return 2;
}
