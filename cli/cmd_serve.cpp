// swapnet serve SCENARIO.json: several models served concurrently within one total budget (the
// scheduler's Runtime), with a closed-loop or paced client per model, an optional budget
// schedule, a control socket (`swapnet ctl`) and an optional watched budget source.
//
// Scenario file (docs/scheduler.md):
//   {"name": "uav", "total_budget": "80%", "policy": "paper", "duration_s": 20,
//    "models": [{"name": "yolov3", "image": "yolov3.swapnet", "urgency": 1, "device": "cpu",
//                "threads": 1, "cpus": [0], "rate_hz": 0, "input_shape": ["1,3,416,416"]}, ...],
//    "schedule": [{"at_s": 10, "budget": "60%"}]}
// Deadlines: "scheduler": "lst" (or threads, fifo, rr, sel; default lst where there are deadlines),
// "workers" (default one, on every core: Note [Serve's defaults]), "load", "warmup_s" and
// "min_requests" (Note [Load and run rules] in serve_load.cpp), "budget_trace"
// (Note [Budget traces] in scenario.cpp), and per model
// "period_ms" (open-loop arrivals at that period: a request arrives whether or not the last one
// is done), "jitter_ms" (each arrival moved by up to that much, uniformly), "slo_ms" (deadline
// after arrival). Results add slo_met (fraction of requests with a deadline finished by it;
// dropped ones count as missed), dropped, and latency p99. "scheduler": "heft" is Band's HEFT.
// Periodic model groups (Puzzle): "groups": [{"name": "perception", "models": ["yolov3", "resnet101"],
// "period_ms": 600, "jitter_ms": 30, "slo_ms": 600}] feed every member the same frame at the
// group's period (deadline default: the period); results add per group the makespan, QoE and
// XRBench-style score (Note [Group makespan and score]). --period-scale and --slo-scale multiply
// every period and every deadline (the load and deadline sweeps).
// A budget is a size ("843MiB", bytes) or a percentage of the models' total size (weights +
// activations, as their images record). Relative image paths are looked up next to the
// scenario file, then in --models (default $SWAPNET_MODELS, else .cache/models).
// The run in three parts: set-up (the scenario with the command line's overrides, its images,
// budgets, inputs and direct inference's outputs), drive (the runtime, a client per stream and
// per model, the budget schedule) and report (serve_report.cpp).
#include <sys/stat.h>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "commands.h"
#include "inputs.h"
#include "scenario.h"
#include "serve.h"
#include "serve_clients.h"
#include "swapnet/scheduler.h"

namespace swapnet {
namespace cli {

namespace {

// ---- set-up ----

// A bad name is refused naming where it came from: the command line or the scenario's field.
void named(const std::string& path, const std::string& field, bool from_option, const std::function<void()>& check) {
  try {
    check();
  } catch (const std::exception& e) {
    throw Error((from_option ? "--" + field : path + ": field '" + field + "'") + ": " + e.what());
  }
}

// The scenario file with the command line's overrides (duration, policy, scheduler, budget)
// and --period-scale / --slo-scale applied; bad names refused before anything opens.
Scenario scenario_for(const std::string& path, const ServeOptions& o) {
  const char* env_models = std::getenv("SWAPNET_MODELS");
  const std::string models_dir = !o.models_dir.empty() ? o.models_dir : env_models ? env_models : ".cache/models";
  Scenario s = load_scenario(path, models_dir);
  if (o.duration_s > 0) s.duration_s = o.duration_s;
  if (!o.policy.empty()) s.policy = o.policy;
  if (!o.scheduler.empty()) s.scheduler = o.scheduler;
  if (o.workers > 0) s.workers = o.workers;
  if (o.load > 0) s.load = o.load;
  if (o.warmup_s >= 0) s.warmup_s = o.warmup_s;
  if (o.min_requests >= 0) s.min_requests = o.min_requests;
  named(path, "policy", !o.policy.empty(), [&] { (void)make_policy(s.policy); });
  named(path, "scheduler", !o.scheduler.empty(), [&] {
    if (!s.scheduler.empty() && s.scheduler != "threads") (void)make_dispatch_policy(s.scheduler);
  });
  if (!o.budget.empty()) s.total = o.budget;
  if (!(o.period_scale > 0) || !(o.slo_scale > 0)) throw Error("--period-scale and --slo-scale must be > 0");
  for (auto& m : s.models) {  // the load and deadline sweeps (bench/scheduler_sweep.sh)
    m.period_ms *= o.period_scale;
    m.jitter_ms *= o.period_scale;
    m.rate_hz /= o.period_scale;
    m.slo_ms *= o.slo_scale;
  }
  for (auto& g : s.groups) {
    g.period_ms *= o.period_scale;
    g.jitter_ms *= o.period_scale;
    g.slo_ms *= o.slo_scale;
  }
  (void)make_policy(s.policy);  // refuse a bad name before opening anything
  return s;
}

// Note [Serve's defaults]
// ~~~~~~~~~~~~~~~~~~~~~~~
// What a scenario does not say comes from the scenario and the machine, and serve says what it
// chose (on stderr, and in --json: scheduler, workers, each model's threads):
// - the scheduler: a central least-slack one (`lst`) where any model or group has a deadline
//   (slo_ms), else `threads` (every model's thread on its own, the OS sharing the cores);
// - a central scheduler's workers: one, whose blocks run on every core the process may run on
//   (usable_cores()) as intra-op threads: the policy's order is then the order blocks run in,
//   and a block's time is its own, not what shares the cores with it;
// - each model's intra-op threads: --threads where the user gave it (the scenario's own
//   "threads" still wins for its model), else the cores over the workers (central) or over the
//   models (`threads`). --threads also sets the threads of the direct runs that `--load`
//   measures, so the load is one of the machine the user allows.
// - under a central scheduler, OpenBLAS on one thread while serving where it runs threads of its
//   own (the runtime's RuntimeOptions::blas_threads; OPENBLAS_NUM_THREADS set by the user stays):
//   Note [BLAS on the compute thread] in scheduler/src/intra_op.cpp.
// Measured 2026-11-27 (self_driving_slo.json at load 0.9, 30 s, bench/scheduler_sweep.sh, the
// variants interleaved): one worker on both cores met 0.65 of the deadlines; two one-thread
// workers 0.17 (two one-thread blocks at once each ran ~2x slower than alone on this VM's two
// vCPUs, while one block on two threads ran 2.15x faster than on one: the second worker bought
// no throughput, and the contention made every estimate, and so every drop, wrong; resnet101
// met none of 60); `threads` 0.01. An earlier default, one worker on one thread, used one core
// of two (0.175 on a scenario of resnet101 and yolov3).
std::string choose_defaults(Scenario& s, int cli_threads) {
  std::string said;
  auto say = [&](const std::string& what) { said += (said.empty() ? "" : ", ") + what; };
  if (s.scheduler.empty()) {
    const bool due = has_deadlines(s);
    s.scheduler = due ? "lst" : "threads";
    say("scheduler " + s.scheduler + (due ? " (the scenario has deadlines)" : " (no deadlines)"));
  }
  const int cores = usable_cores();
  const bool central = s.scheduler != "threads";
  if (s.workers == 0) {
    s.workers = 1;
    if (central) say("1 worker (a block at a time, on all " + std::to_string(cores) + " cores)");
  }
  const int over = central ? s.workers : static_cast<int>(s.models.size());  // who shares the cores
  RuntimeOptions ro;  // the runtime's own rule (Note [A model's threads from the machine])
  ro.scheduler = s.scheduler;
  ro.workers = s.workers;
  const int per_model = cli_threads > 0 ? cli_threads : default_intra_op_threads(ro, s.models.size());
  bool threads_chosen = false;
  for (auto& m : s.models) {
    if (m.rt.threads != 0) continue;
    m.rt.threads = per_model;
    threads_chosen = true;
  }
  if (threads_chosen && cli_threads > 0) {
    say(std::to_string(per_model) + " intra-op thread(s) per model (--threads)");
  } else if (threads_chosen) {
    say(std::to_string(per_model) + " intra-op thread(s) per model (" + std::to_string(cores) + " cores over " +
        std::to_string(over) + (central ? " worker" + std::string(over == 1 ? "" : "s") + ")" : " models)"));
  }
  // Note [BLAS on the compute thread] (scheduler/src/intra_op.cpp): the runtime's own rule.
  if (const auto [blas, had] = runtime_blas_threads(ro); blas > 0) {
    say("OpenBLAS on " + std::to_string(blas) + " thread" + (blas == 1 ? "" : "s") + " while serving (it had " +
        std::to_string(had) + " of its own; OPENBLAS_NUM_THREADS to choose)");
  }
  return said;
}

// Each model's image facts and options (device profile, --learn, threads); returns the models'
// total size (weights + activations as their images record): the base of percentages.
std::uint64_t open_images(const std::string& path, const Common& c, const ServeOptions& o, ServeSetup* setup) {
  Scenario& s = setup->s;
  std::uint64_t whole = 0;
  DeviceProfile prof = device_profile(s.models.front().rt.image, c, o.profile);
  if (!o.learn_store.empty()) {
    if (o.learn == 0) throw Error("--learn-store " + o.learn_store + " needs --learn N (N in 3..1000)");
    struct stat st{};
    if (::stat(o.learn_store.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      throw Error("--learn-store " + o.learn_store + ": not a directory (each model's costs go to DIR/NAME.learned.json)");
    }
  }
  for (auto& m : s.models) {
    // Before anything moves to the GPU, so the message is ours and not PyTorch's.
    if (m.device == "cuda") require_cuda(path + ": model '" + m.rt.name + "' (" + m.rt.image + ")");
    ImageInfo info;
    read_image_info(m.rt.image, &info).throw_if_error();
    whole += info.data_size + info.activation_bytes;
    use_profile(prof, &m.rt.options);
    m.rt.options.learn_after = o.learn;
    if (!o.learn_store.empty()) m.rt.options.learn_store = o.learn_store + "/" + m.rt.name + ".learned.json";
    setup->infos.push_back(std::move(info));
  }
  return whole;
}

// The total budget and the schedule's, in bytes.
void resolve_budgets(const std::string& path, std::uint64_t whole, ServeSetup* setup) {
  const Scenario& s = setup->s;
  setup->total = budget_value(s.total, whole, path + ": field 'total_budget'");
  for (size_t i = 0; i < s.schedule.size(); ++i) {
    setup->schedule.emplace_back(s.schedule[i].first,
                                 budget_value(s.schedule[i].second, whole,
                                              path + ": field 'schedule[" + std::to_string(i) + "].budget'"));
  }
}

// Each model's direct latency on the whole machine (Note [Load and run rules] in
// serve_load.cpp): the fastest of its timed runs over two passes through the models, so that a
// slow spell of the VM must last through both to skew one model's. After make_inputs.
void measure_direct(ServeSetup* setup) {
  const Scenario& s = setup->s;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < s.models.size(); ++i) {
      ScenarioModel whole = s.models[i];
      whole.rt.threads = setup->direct_threads;
      double ms = 0;
      (void)direct_output(whole, setup->infos[i], setup->inputs[i], 3, &ms);
      double& best = setup->load.direct_ms[i];
      best = pass == 0 ? ms : std::min(best, ms);
    }
  }
}

// Inputs and, with `check`, the reference outputs of direct inference, before the run; with a
// load, each model's direct latency too.
void make_inputs(const std::string& path, const Common& c, bool check, ServeSetup* setup) {
  const Scenario& s = setup->s;
  c10::InferenceMode guard;
  setup->load.direct_ms.assign(s.models.size(), 0);
  for (size_t i = 0; i < s.models.size(); ++i) {
    Common mc = c;
    if (!s.models[i].shapes.empty()) mc.input_shapes = s.models[i].shapes;
    std::vector<std::string> shapes;
    try {
      setup->inputs.push_back(inputs_for(mc, setup->infos[i], &shapes));
    } catch (const std::exception& e) {  // the file and the field, not only the spec
      throw Error(path + ": field 'models[" + std::to_string(i) + "].input_shape' (" + s.models[i].rt.name +
                  "): " + e.what());
    }
    if (check) setup->reference.push_back(direct_output(s.models[i], setup->infos[i], setup->inputs[i]));
  }
  if (s.load > 0) measure_direct(setup);
}

ServeSetup set_up(const std::string& path, const Common& c, const ServeOptions& o) {
  ServeSetup setup;
  setup.s = scenario_for(path, o);
  // Note [Serve's defaults]: said on stderr (stdout may be --json).
  const std::string chose = choose_defaults(setup.s, c.threads);
  setup.direct_threads = c.threads > 0 ? c.threads : usable_cores();
  if (!chose.empty()) std::fprintf(stderr, "swapnet: serve chose %s\n", chose.c_str());
  const std::uint64_t whole = open_images(path, c, o, &setup);
  resolve_budgets(path, whole, &setup);
  make_inputs(path, c, o.check, &setup);
  setup.warmup_inferences = has_deadlines(setup.s) ? kWarmUpInferences : 0;  // Note [Warm-up inferences]
  return setup;
}

// ---- drive ----

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted.store(true); }

// The runtime with its control socket and watched budget source.
struct Service {
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<ControlServer> control;
  std::unique_ptr<BudgetWatcher> watcher;
};

// Opens the runtime (with --trace started first: each model takes a group in the trace), the
// control socket and the budget source, says so, and takes SIGINT and SIGTERM.
Service open_service(const ServeSetup& setup, const Common& c, const ServeOptions& o) {
  const Scenario& s = setup.s;
  RuntimeOptions ro;
  ro.policy = s.policy;
  ro.scheduler = s.scheduler;
  ro.workers = s.workers;
  std::vector<RuntimeModel> specs;
  for (const auto& m : s.models) specs.push_back(m.rt);
  if (!o.trace.empty()) trace_start();  // before the models open: each takes a group in the trace
  Service svc;
  svc.rt = Runtime::open(std::move(specs), setup.total, ro);
  if (o.socket != "none") {
    svc.control = std::make_unique<ControlServer>(svc.rt.get(), o.socket.empty() ? default_control_path() : o.socket);
  }
  if (!o.budget_source.empty()) {
    svc.watcher = std::make_unique<BudgetWatcher>(svc.rt.get(), BudgetSource(o.budget_source),
                                                  std::chrono::milliseconds(std::max(1, o.poll_ms)));
  }
  if (!c.json) {
    std::printf("serving %s: %zu models, total budget %s (%s policy), %.0f s%s\n", s.name.c_str(), s.models.size(),
                format_bytes(setup.total).c_str(), s.policy.c_str(), s.duration_s,
                svc.control ? (", control: swapnet ctl --socket " + svc.control->path() + " budget SIZE").c_str() : "");
    std::fflush(stdout);
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  return svc;
}

// Note [The driver sleeps]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Past the duration, a run goes on until every model has its minimum of counted arrivals (Note
// [Load and run rules] in serve_load.cpp; `min_requests`, 20 in self_driving_slo.json and
// two_rates.json). follow_schedule slept until its next event, the end of the duration, which
// past it was always due: it spun on one of this VM's two cores, asking the clients under their
// lock, until the run ended. Block logs of self_driving_slo at load 0.9 (2026-11-29, runs of a
// 30 s duration going on ~12 s past it) showed it: past the duration, blocks ended on the
// kernel's 4 ms ticks, 10 % of them ran over 3x their estimate (under 1 % before the duration),
// half as many blocks ran per second, and 11 % of all block time was lost there, counted in
// every figure serve reports. Past the duration it now looks again every kPoll (or at the next
// budget change, if sooner); `driver_cpu_s` in the JSON says what this thread used.
constexpr double kPoll = 0.02;  // s

// CPU seconds the calling thread has used.
double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

// Until the scenario's duration has passed since `start` and `more` says no more (or four
// durations have, or a signal came), the schedule's budget changes at their times; `warmed`
// once, when `warmup_s` have passed. Returns the CPU seconds this thread used meanwhile.
double follow_schedule(Runtime* rt, double duration_s, std::vector<std::pair<double, std::uint64_t>> schedule,
                       Clock::time_point start, const std::function<bool()>& more, double warmup_s,
                       const std::function<void()>& warmed) {
  const double cpu0 = thread_cpu_s();
  size_t next_change = 0;
  bool warm = false;
  std::sort(schedule.begin(), schedule.end());
  while (!g_interrupted.load()) {
    const double now_s = ms_since(start) / 1000;
    if (!warm && now_s >= warmup_s) {
      warmed();
      warm = true;
    }
    if (now_s >= duration_s && (now_s >= 4 * duration_s || !more())) break;
    // The next event: the duration's end, or past it the next look at `more` (Note [The driver
    // sleeps]); the warm-up's end; the next budget change.
    double wake_s = now_s >= duration_s ? now_s + kPoll : duration_s;
    if (!warm) wake_s = std::min(wake_s, warmup_s);
    if (next_change < schedule.size()) {
      if (schedule[next_change].first <= now_s) {
        rt->set_budget(schedule[next_change].second);
        ++next_change;
        continue;
      }
      wake_s = std::min(wake_s, schedule[next_change].first);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.1, std::max(0.0, wake_s - now_s))));
  }
  return thread_cpu_s() - cpu0;
}

}  // namespace

int serve(const std::string& path, const Common& c, const ServeOptions& o) {
  apply_common(c);
  ServeSetup setup = set_up(path, c, o);
  Service svc = open_service(setup, c, o);
  if (setup.s.load > 0) {  // the budgets the runtime gave: Note [A load that counts the disk]
    measure_disk(*svc.rt, &setup);
    std::fprintf(stderr, "swapnet: serve %s\n", apply_load(&setup).c_str());
  }
  setup.warmup_s = choose_warmup(setup.s);
  ServeLog log(svc.rt->size(), setup.s.groups.size());
  warm_up(svc.rt.get(), setup);
  release_intra_op_threads(false);  // the warm-up's clones made this thread a pool
  Clients clients(svc.rt.get(), setup, o.check, &log);
  clients.start();
  const auto start = Clock::now();
  const int min_requests = setup.s.min_requests;
  log.driver_cpu_s = follow_schedule(
      svc.rt.get(), setup.s.duration_s, setup.schedule, start,
      [&] { return min_requests > 0 && !clients.enough(min_requests); }, setup.warmup_s,
      [&] { log.at_warmup = svc.rt->status(); });
  if (min_requests > 0 && !clients.enough(min_requests)) {
    std::fprintf(stderr, "swapnet: serve stopped at 4x the duration before every model had %d counted arrivals\n",
                 min_requests);
  }
  clients.stop();
  svc.watcher.reset();
  svc.control.reset();
  svc.rt->wait_adapted(std::chrono::seconds(30));
  return serve_report(*svc.rt, setup, log, start, c, o);
}

}  // namespace cli
}  // namespace swapnet
