// The multi-model Runtime (scheduler.h): one worker thread per model, budgets from the
// budgeter, budget changes applied at inference boundaries. This file opens it (each model's
// executor at its minimum, the demands, the first split, the threads) and answers the public
// API; the workers are in runtime_worker.cpp, the budget changes in runtime.cpp.
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "intra_op.h"
#include "runtime_impl.h"

#include <nlohmann/json.hpp>

namespace swapnet {

using runtime_detail::Clock;
using runtime_detail::ms_between;
using runtime_detail::Request;
using runtime_detail::Worker;

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Runtime::~Runtime() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->shedder.joinable()) impl_->shedder.join();
  for (auto& x : impl_->w) {
    if (x->thread.joinable()) x->thread.join();
    Impl::keep_activations(*x, false);
  }
}

namespace {

using Impl = Runtime::Impl;

// The budget policy, and the central scheduler with its workers (none under "threads").
void choose_policies(Impl& m, const RuntimeOptions& options) {
  m.policy = options.custom ? options.custom : std::shared_ptr<const BudgetPolicy>(make_policy(options.policy));
  if (options.scheduler != "threads") {
    if (options.workers < 0) throw Error("runtime: workers " + std::to_string(options.workers) + " must be >= 1 (0: one per core)");
    if (options.blas_threads < -1) {
      throw Error("runtime: blas_threads " + std::to_string(options.blas_threads) +
                  " must be >= -1 (-1: one where OpenBLAS runs threads of its own, 0: left as they are)");
    }
    const int workers = options.workers == 0 ? usable_cores() : options.workers;
    m.dispatch = make_dispatch_policy(options.scheduler, workers);
    m.workers = workers;
    m.free_workers = workers;
    m.compute = std::make_unique<runtime_detail::ComputeThreads>(workers, options.blas_threads);
    if (const auto& b = m.compute->blas(); b.set() > 0) {  // Note [BLAS on the compute thread]
      log(LogLevel::kInfo, "runtime: OpenBLAS on " + std::to_string(b.set()) + " thread(s) while the central scheduler runs (it had " +
                               std::to_string(b.before()) + "; RuntimeOptions::blas_threads, OPENBLAS_NUM_THREADS to choose)");
    }
    m.disk_aware = m.dispatch->reads_unread();
  }
}
// Throws Error when `spec` is not a model the runtime can take: no name, a name already taken,
// an urgency not above 0, a CPU this machine (`cpus` of them) does not have.
void check_model(const Impl& m, const RuntimeModel& spec, long cpus) {
  if (spec.name.empty()) throw Error(spec.image + ": a model needs a name");
  for (const auto& x : m.w) {
    if (x->spec.name == spec.name) throw Error("runtime: two models are named '" + spec.name + "'");
  }
  if (!(spec.urgency > 0)) throw Error(spec.name + ": urgency " + std::to_string(spec.urgency) + " must be > 0");
  for (int c : spec.cpus) {
    if (c < 0 || c >= cpus || c >= CPU_SETSIZE) {
      throw Error(spec.name + ": CPU " + std::to_string(c) + " does not exist (this machine has 0.." +
                  std::to_string(cpus - 1) + ")");
    }
  }
}
// Opens the model's executor at its minimum budget, and adds its worker and its demand.
void add_model(Impl& m, RuntimeModel& spec) {
  ImageInfo info;
  read_image_info(spec.image, &info).throw_if_error();
  ExecutorOptions o = spec.options;
  o.budget = min_budget(info, o);  // opened small; the budgeter's share follows
  o.partition.clear();
  o.blocks = 0;
  o.resident.clear();
  if (o.grid_step == 0) o.grid_step = default_grid_step(info);
  struct stat st {};
  if (m.disk_aware && ::stat(spec.image.c_str(), &st) == 0) {
    auto& d = m.disks[st.st_dev];
    if (!d) d = std::make_shared<SharedDisk>(0);  // order only: a cap of one queue depth lost 46 % (docs/scheduler.md)
    o.reader.disk = d;
  }
  auto x = std::make_unique<Worker>();
  x->exec = Executor::open(spec.image, o);
  x->est.set_costs(layer_costs(x->exec->info(), o), o.cost.alpha_ms_per_byte);
  for (const ImageLayer& L : x->exec->info().layers) x->blas_layers.push_back(runtime_detail::calls_blas(L.ops) ? 1 : 0);
  x->account = new_cpu_account();
  if (x->account == 0) {
    log_once(LogLevel::kWarn, "cpu_accounts", "runtime: all 255 CPU meter accounts are taken: activations of " +
                                                  spec.name + " and later models are not checked against their budgets");
  }
  x->spec = std::move(spec);
  ModelDemand d;
  d.name = x->spec.name;
  d.urgency = x->spec.urgency;
  d.min_bytes = x->exec->plan().min_budget;
  d.curve = x->exec->latency_curve();
  d.full_bytes = std::max(d.curve.back().first, d.min_bytes);
  d.latency_ms = d.curve.back().second;
  x->st.name = d.name;
  x->st.threads = x->spec.threads;
  x->st.min_bytes = d.min_bytes;
  x->st.full_bytes = d.full_bytes;
  m.demands.push_back(std::move(d));
  m.w.push_back(std::move(x));
}
// Throws Error, with the numbers, when the models' minimum budgets sum to more than the total.
void check_fits(const Impl& m, std::uint64_t total_budget) {
  std::uint64_t sum_min = 0;
  std::string mins;
  for (const auto& d : m.demands) {
    sum_min += d.min_bytes;
    mins += (mins.empty() ? "" : ", ") + d.name + " " + format_bytes(d.min_bytes);
  }
  if (sum_min > total_budget) {
    throw Error("the scenario cannot fit: the models' minimum budgets sum to " + std::to_string(sum_min) + " bytes (" +
                format_bytes(sum_min) + ": " + mins + ") > the total budget " + std::to_string(total_budget) +
                " bytes (" + format_bytes(total_budget) + ")");
  }
}
// Splits the total for the first time and puts each model's plan for its share in force.
void first_split(Impl& m, std::uint64_t total_budget) {
  m.total = total_budget;
  m.ledger = runtime_detail::MemoryLedger(m.w.size(), total_budget, std::chrono::steady_clock::now());
  const Allocation a = m.plan(total_budget);
  m.set_targets(a);
  for (size_t i = 0; i < m.w.size(); ++i) {
    Worker& x = *m.w[i];
    x.exec->set_budget(m.target[i]);
    m.ledger.use(i, x.exec->held_bytes(), std::chrono::steady_clock::now());
    x.exec->reset_weight_peak();
    x.budget = x.st.budget = m.target[i];
    Impl::keep_activations(x, x.budget > 0);
    m.record_plan(x);
  }
  log(LogLevel::kInfo, "runtime: " + a.note);
}

}  // namespace

// Note [A model's threads from the machine]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model left at RuntimeModel::threads 0 used to run at libtorch's setting on its thread. That
// is the physical cores cpuinfo counts, in any process: 1 on this project's VM, whose two vCPUs
// it takes for one core's hyperthreads (serve and the other CLI commands set their own, and
// so ran at 2). A Python program's swapnet.Runtime ran resnet101 at 129 MiB in 250-316 ms where
// `swapnet run` took 115 ms, and 126 ms once the program called torch.set_num_threads(2)
// (2026-11-28): users do not know to do that. Where the cores are all physical (a Jetson),
// libtorch's setting is every core for every model, and models running at once under "threads"
// oversubscribed them. So the runtime chooses as serve does (Note [Serve's defaults] in
// cli/cmd_serve.cpp), from the cores this process may run on, says what it chose, and reports
// each model's threads in its status; a model's `threads` still overrides it.
int default_intra_op_threads(const RuntimeOptions& options, std::size_t models) {
  const bool central = options.scheduler != "threads";
  const int at_once = central ? (options.workers == 0 ? usable_cores() : options.workers) : static_cast<int>(models);
  return std::max(1, usable_cores() / std::max(1, at_once));
}
namespace {
// Gives the models left at threads 0 the machine's choice, and says it.
void choose_threads(std::vector<RuntimeModel>& models, const RuntimeOptions& options) {
  const int n = default_intra_op_threads(options, models.size());
  std::string chosen;
  for (auto& spec : models) {
    if (spec.threads < 0) throw Error(spec.name + ": threads " + std::to_string(spec.threads) + " must be >= 1 (0: from the machine)");
    if (spec.threads != 0) continue;
    spec.threads = n;
    chosen += (chosen.empty() ? "" : ", ") + spec.name;
  }
  if (chosen.empty()) return;
  const bool central = options.scheduler != "threads";
  log(LogLevel::kInfo, "runtime: " + std::to_string(n) + " intra-op thread(s) for " + chosen + " (" +
                           std::to_string(usable_cores()) + " cores over " +
                           (central ? "the scheduler's workers" : std::to_string(models.size()) + " model(s)") +
                           "; a model's \"threads\" sets its own)");
}
}  // namespace

std::unique_ptr<Runtime> Runtime::open(std::vector<RuntimeModel> models, std::uint64_t total_budget,
                                       const RuntimeOptions& options) {
  if (models.empty()) throw Error("runtime: no models");
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  choose_policies(m, options);
  choose_threads(models, options);
  install_cpu_meter();
  const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
  for (auto& spec : models) {
    check_model(m, spec, cpus);
    add_model(m, spec);
  }
  check_fits(m, total_budget);
  first_split(m, total_budget);
  m.t0 = Clock::now();
  // Owned at once, so that the threads already started are joined if starting one fails.
  std::unique_ptr<Runtime> rt(new Runtime(std::move(impl)));
  for (size_t i = 0; i < m.w.size(); ++i) m.w[i]->thread = std::thread([&m, i] { m.loop(i); });
  m.shedder = std::thread([&m] {
    pthread_setname_np(pthread_self(), "swapnet-shed");
    m.shed_loop();
  });
  // Opening ran torch ops on the caller's thread: its idle OpenMP helpers would make the
  // workers' stop spinning (Note [One OpenMP pool per core] in intra_op.cpp).
  release_intra_op_threads(false);
  return rt;
}

int Runtime::size() const { return static_cast<int>(impl_->w.size()); }
int Runtime::index(const std::string& name) const {
  for (size_t i = 0; i < impl_->w.size(); ++i) {
    if (impl_->w[i]->spec.name == name) return static_cast<int>(i);
  }
  return -1;
}
std::vector<ModelDemand> Runtime::demands() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->demands;
}
const Executor& Runtime::executor(int model) const { return *impl_->w.at(static_cast<size_t>(model))->exec; }
double Runtime::seconds() const { return ms_between(impl_->t0, Clock::now()) / 1000; }

std::future<c10::IValue> Runtime::submit(int model, std::vector<c10::IValue> inputs) {
  return submit(model, std::move(inputs), Clock::time_point{});
}

SharedDisk::Stats Runtime::disk_stats() const {
  SharedDisk::Stats sum;
  for (const auto& [dev, d] : impl_->disks) {
    const SharedDisk::Stats s = d->stats();
    sum.granted += s.granted;
    sum.deferred += s.deferred;
  }
  return sum;
}

double Runtime::dispatch_us() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->decisions ? impl_->dispatch_us_sum / static_cast<double>(impl_->decisions) : 0.0;
}

std::future<c10::IValue> Runtime::submit(int model, std::vector<c10::IValue> inputs, Clock::time_point deadline) {
  Impl& m = *impl_;
  if (model < 0 || model >= size()) throw Error("runtime: no model " + std::to_string(model));
  Request r;
  r.inputs = std::move(inputs);
  r.deadline = deadline;
  std::future<c10::IValue> f = r.done.get_future();
  {
    std::lock_guard<std::mutex> lk(m.mu);
    Worker& x = *m.w[static_cast<size_t>(model)];
    if (x.budget == 0 && m.target[static_cast<size_t>(model)] == 0) {
      ++x.st.rejected;
      r.done.set_exception(std::make_exception_ptr(Error(x.spec.name + ": paused: " + m.reason[static_cast<size_t>(model)])));
      return f;
    }
    x.queue.push_back(std::move(r));
  }
  m.cv.notify_all();
  return f;
}

std::uint64_t Runtime::total_budget() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->total;
}
std::vector<Adaptation> Runtime::adaptations() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->adaptations;
}
MemoryUse Runtime::memory_use() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->ledger.totals(std::chrono::steady_clock::now());
}
std::uint64_t Runtime::held_bytes() const {
  std::uint64_t held = 0;
  for (const auto& m : status()) held += m.budget;
  return held;
}

std::string Runtime::status_json() const {
  nlohmann::json j;
  j["total_budget_bytes"] = total_budget();
  j["models"] = nlohmann::json::array();
  for (const auto& s : status()) {
    j["models"].push_back({{"name", s.name}, {"budget_bytes", s.budget}, {"paused", s.paused},
                           {"blocks", s.blocks}, {"requests", s.requests}});
  }
  // Where the process's memory is (bench/soak.sh samples it, to tell a leak from an allocator
  // keeping freed memory): tensors through libtorch's CPU allocator, swapnet's arenas, the
  // models' activation regions (Note [Activation cache]: mapped, in use, allocations placed and
  // not placed), and the C heap as glibc counts it (in use, free but kept, and mmapped chunks).
  const ActivationCacheStats cache = cpu_account_cache(0);
  nlohmann::json mem = {{"tensor_bytes", cpu_meter().current},
                        {"arena_bytes", memory_stats().current},
                        {"activation_cache_bytes", cache.mapped_bytes},
                        {"activation_cache_live_bytes", cache.live_bytes},
                        {"activation_cache_hits", cache.hits},
                        {"activation_cache_misses", cache.misses}};
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  const struct mallinfo2 mi = mallinfo2();
  mem["heap_in_use_bytes"] = mi.uordblks;
  mem["heap_free_bytes"] = mi.fordblks;
  mem["heap_mmap_bytes"] = mi.hblkhd;
#endif
  j["memory"] = mem;
  return j.dump();
}

std::vector<ModelStatus> Runtime::status() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<ModelStatus> out;
  for (const auto& x : impl_->w) out.push_back(x->st);
  return out;
}

}  // namespace swapnet
