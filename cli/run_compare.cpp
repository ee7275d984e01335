// swapnet run --compare: each mode (direct, swapnet, naive) in its own process, so each one's
// memory is its own, rounds interleaved; then the medians over the rounds, the ratios to direct
// inference and to the bounds in this budget (memory_bound_ms, reserve_bound_ms), printed or as
// one JSON object.
#include <ATen/Parallel.h>

#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>

#include "commands.h"
#include "inputs.h"
#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

namespace {

using json = nlohmann::json;

// Runs `swapnet run ... --mode MODE --json` as a child process and parses its JSON.
json run_child(const std::string& self, const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(self.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(self.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error("child run (" + args[3] + ") failed with status " + std::to_string(WEXITSTATUS(status)));
  }
  return json::parse(out);
}

std::string self_exe() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw Error("cannot find this executable (/proc/self/exe)");
  self[n] = '\0';
  return self;
}

// The rounds, then the report: one JSON object (the last round's swapnet run with the medians
// over the rounds) or a table.
class Compare {
 public:
  Compare(const std::string& path, const Common& c, const RunOptions& o) : path_(path), c_(c), o_(o) {}
  int go();

 private:
  void choose_modes();
  std::vector<std::string> child_args(const std::string& mode, int r) const;
  void direct_under_io(const std::string& self);
  double med(const std::string& mode, const char* key, const char* sub = nullptr);
  json per_round(const std::string& mode);
  std::int64_t cache_growth(const std::string& mode);
  json swapnet_medians();
  void add_baselines(json& j);
  void add_ratios(json& j);
  void add_bounds(json& j);
  void print(const json& j);

  const std::string& path_;
  const Common& c_;
  const RunOptions& o_;
  std::vector<std::string> modes_ = {"direct", "swapnet", "naive"};
  std::string naive_skipped_;  // why naive did not run
  std::map<std::string, std::vector<json>> results_;  // per mode, per round
  // Over the swapnet rounds.
  std::uint64_t peak_model_ = 0, peak_rss_ = 0;
  bool equal_ = true;
  // Medians of the baselines.
  double direct_ms_ = 0, naive_ms_ = 0;
  bool naive_ = false;
};

// naive is the CPU baseline, and holds a block twice (Note [An honest naive path]): below twice
// the largest layer + activations (the ring's minimum is the largest layer) it cannot run in the
// budget at all.
void Compare::choose_modes() {
  if (o_.device == "cuda") modes_ = {"direct", "swapnet"};  // naive is the CPU baseline
  if (o_.device != "cuda" && !o_.budget.empty() && o_.blocks == 0 && o_.partition.empty()) {
    ImageInfo info;
    read_image_info(path_, &info).throw_if_error();
    const std::uint64_t need = naive_min_budget(info, ExecutorOptions{}), budget = parse_size(o_.budget);
    if (budget < need) {
      modes_ = {"direct", "swapnet"};
      naive_skipped_ = "naive needs " + std::to_string(need) + " bytes (" + format_bytes(need) +
                       ": twice the largest layer, its read buffer and its copy, + activations), the budget is " +
                       std::to_string(budget);
    }
  }
}

// The child's command line for `mode` in round r.
std::vector<std::string> Compare::child_args(const std::string& mode, int r) const {
  std::vector<std::string> args = {"run", path_, "--mode", mode, "--json", "--iters", std::to_string(o_.iters),
                                   "--threads", std::to_string(at::get_num_threads()), "--seed",
                                   std::to_string(c_.seed)};
  if (!o_.budget.empty()) args.insert(args.end(), {"--budget", o_.budget});
  if (o_.blocks) args.insert(args.end(), {"--blocks", std::to_string(o_.blocks)});
  if (!o_.partition.empty()) args.insert(args.end(), {"--partition", o_.partition});
  if (!o_.resident.empty()) args.insert(args.end(), {"--resident", o_.resident});
  if (!o_.profile.empty()) args.insert(args.end(), {"--profile", o_.profile});
  if (o_.check && mode != "direct") args.push_back("--check");
  if (o_.learn > 0 && mode == "swapnet") args.insert(args.end(), {"--learn", std::to_string(o_.learn)});
  if (!o_.learn_store.empty() && mode == "swapnet") args.insert(args.end(), {"--learn-store", o_.learn_store});
  if (!o_.trace.empty() && mode == "swapnet" && r + 1 == std::max(1, o_.rounds)) args.insert(args.end(), {"--trace", o_.trace});
  args.insert(args.end(), {"--verify", o_.verify, "--plan", o_.plan, "--device", o_.device, "--read-ahead", o_.read_ahead});
  for (const auto& s : c_.input_shapes) args.insert(args.end(), {"--input-shape", s});
  return args;
}

// Direct inference again, while the image is read at the pace swapnet just read it: what
// those reads cost the compute on this machine, apart from swapnet.
void Compare::direct_under_io(const std::string& self) {
  const json& sw = results_["swapnet"].back();
  const double pace = sw["bytes_read_per_inference"].get<double>() /
                      (sw["latency_ms"]["median"].get<double>() * 1e3);
  std::vector<std::string> d = {"run", path_, "--mode", "direct", "--json", "--iters", std::to_string(o_.iters),
                                "--threads", std::to_string(at::get_num_threads()), "--seed",
                                std::to_string(c_.seed), "--background-read", std::to_string(pace)};
  for (const auto& s : c_.input_shapes) d.insert(d.end(), {"--input-shape", s});
  json r = run_child(self, d);
  r["background_mb_s"] = pace;
  results_["direct_under_io"].push_back(std::move(r));
}

double Compare::med(const std::string& mode, const char* key, const char* sub) {
  std::vector<double> v;
  for (const auto& j : results_[mode]) v.push_back(sub ? j[key][sub].get<double>() : j[key].get<double>());
  return percentile(v, 0.5);
}

// Each round's median per mode, in round order (the medians of these are what is reported):
// how much the VM and a bursty throttle moved the runs.
json Compare::per_round(const std::string& mode) {
  json v = json::array();
  for (const auto& r : results_[mode]) v.push_back(r["latency_ms"]["median"]);
  return v;
}

// Page cache each mode left behind (the most over its rounds): memory outside the budget.
std::int64_t Compare::cache_growth(const std::string& mode) {
  std::int64_t most = 0;
  for (const auto& r : results_[mode]) most = std::max(most, r["page_cache_growth_bytes"].get<std::int64_t>());
  return most;
}

// The last swapnet round's JSON with the medians (and peaks) over the rounds.
json Compare::swapnet_medians() {
  json j = results_["swapnet"].back();
  j["rounds"] = o_.rounds;
  j["latency_ms"]["median"] = med("swapnet", "latency_ms", "median");
  j["latency_ms"]["p90"] = med("swapnet", "latency_ms", "p90");
  j["latency_ms"].erase("all");  // the last round's inferences only
  j["latency_ms"]["rounds"] = per_round("swapnet");
  j["io_bound_ms"] = med("swapnet", "io_bound_ms");
  j["raw_io_mb_s"] = med("swapnet", "raw_io_mb_s");
  j["bytes_read_per_inference"] = med("swapnet", "bytes_read_per_inference");
  j["pipeline"]["disk_busy_fraction"] = med("swapnet", "pipeline", "disk_busy_fraction");
  j["pipeline"]["disk_busy_ms"] = med("swapnet", "pipeline", "disk_busy_ms");
  j["pipeline"]["read_wait_ms"] = med("swapnet", "pipeline", "read_wait_ms");
  {
    // The rate the disk gave swapnet's reads while they were in flight, over the rounds: above
    // the raw rate where the disk bursts (docs/partitioner.md, "When a run beats the bound").
    std::vector<double> v;
    for (const auto& r : results_["swapnet"]) {
      const json& x = r["pipeline"]["disk_mb_s_while_busy"];
      if (x.is_number()) v.push_back(x.get<double>());
    }
    j["pipeline"]["disk_mb_s_while_busy"] = v.empty() ? json(nullptr) : json(percentile(v, 0.5));
  }
  for (const auto& r : results_["swapnet"]) {
    peak_model_ = std::max(peak_model_, r["peak_model_bytes"].get<std::uint64_t>());
    peak_rss_ = std::max(peak_rss_, r["peak_rss_bytes"].get<std::uint64_t>());
    if (r.contains("equal")) equal_ = equal_ && r["equal"].get<bool>();
  }
  j["peak_model_bytes"] = peak_model_;
  j["peak_rss_bytes"] = peak_rss_;
  if (o_.check) j["equal"] = equal_;
  return j;
}

// Direct's and naive's medians beside swapnet's.
void Compare::add_baselines(json& j) {
  direct_ms_ = med("direct", "latency_ms", "median");
  naive_ = !results_["naive"].empty();
  naive_ms_ = naive_ ? med("naive", "latency_ms", "median") : 0.0;
  j["page_cache_growth_bytes"] = cache_growth("swapnet");
  j["direct"] = {{"latency_ms", {{"median", direct_ms_}, {"p90", med("direct", "latency_ms", "p90")}, {"rounds", per_round("direct")}}},
                 {"peak_model_bytes", results_["direct"].back()["peak_model_bytes"]},
                 {"peak_rss_bytes", results_["direct"].back()["peak_rss_bytes"]},
                 {"page_cache_growth_bytes", cache_growth("direct")}};
  if (!naive_skipped_.empty()) j["naive"] = {{"skipped", naive_skipped_}};
  if (naive_) {
    j["naive"] = {{"latency_ms", {{"median", naive_ms_}, {"p90", med("naive", "latency_ms", "p90")}, {"rounds", per_round("naive")}}},
                  {"peak_rss_bytes", results_["naive"].back()["peak_rss_bytes"]},
                  {"bytes_read_per_inference", med("naive", "bytes_read_per_inference")},
                  {"page_cache_growth_bytes", cache_growth("naive")}};
  }
}

void Compare::add_ratios(json& j) {
  j["ratio_vs_direct"] = j["latency_ms"]["median"].get<double>() / direct_ms_;
  j["ratio_vs_bound"] = j["latency_ms"]["median"].get<double>() / std::max(direct_ms_, j["io_bound_ms"].get<double>());
  {
    // The same ratio round by round (swapnet and direct run back to back in a round, the raw
    // rate right after swapnet), then its median: this VM's speed drifts by tens of percent over
    // minutes, and a ratio of neighbours drifts less than a ratio of medians taken apart.
    std::vector<double> paired;
    const size_t n = std::min(results_["swapnet"].size(), results_["direct"].size());
    for (size_t r = 0; r < n; ++r) {
      const json& sw = results_["swapnet"][r];
      const double d = results_["direct"][r]["latency_ms"]["median"].get<double>();
      paired.push_back(sw["latency_ms"]["median"].get<double>() / std::max(d, sw["io_bound_ms"].get<double>()));
    }
    if (!paired.empty()) {
      j["ratio_vs_bound_rounds"] = paired;
      j["ratio_vs_bound_paired"] = percentile(paired, 0.5);
    }
  }
  if (!results_["direct_under_io"].empty()) {
    const double dio = med("direct_under_io", "latency_ms", "median");
    j["direct_under_io"] = {{"latency_ms", {{"median", dio}, {"p90", med("direct_under_io", "latency_ms", "p90")},
                                           {"rounds", per_round("direct_under_io")}}},
                            {"background_mb_s", med("direct_under_io", "background_mb_s")}};
    // The bound on this machine: computing while the same bytes are read (interrupts, the
    // hypervisor's copies and memory bandwidth cost the compute), or reading them.
    j["ratio_vs_bound_under_io"] = j["latency_ms"]["median"].get<double>() / std::max(dio, j["io_bound_ms"].get<double>());
  }
  if (naive_) j["naive_ratio"] = naive_ms_ / j["latency_ms"]["median"].get<double>();
}

// The physical bound in this budget: no schedule of these layers, reading at the raw rate
// with weights and activations within the budget, is faster than memory_bound_ms (the
// partitioner's derivation; it bounds the bytes any schedule reads too, so the plan's own
// io_bound is not part of it); the layers' times are the image's, scaled to the direct
// latency measured here (or under the same reads), their bytes the tensors' (no padding).
// That bound allows a schedule to lend the bytes a layer's activations leave idle to weights;
// swapnet's plans keep a constant activation reserve instead, and no such plan is faster than
// reserve_bound_ms: the same bound with every layer's activations at the reserve, and at least
// min_read_bytes read at the raw rate (Note [Two bounds] in docs/partitioner.md). The ratio to
// the first is what swapnet leaves; to the second, what its engine leaves of what its plans can do.
void Compare::add_bounds(json& j) {
  if (!(o_.device == "cpu" && j["budget_bytes"].is_number())) return;
  ImageInfo info;
  read_image_info(path_, &info).throw_if_error();
  const double raw_mb_s = j["raw_io_mb_s"].get<double>();
  const std::uint64_t budget = j["budget_bytes"].get<std::uint64_t>();
  const double swapnet_ms = j["latency_ms"]["median"].get<double>();
  auto ratio = [&](double bound) { return std::isfinite(bound) ? json(swapnet_ms / bound) : json(nullptr); };
  auto finite = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  auto bounds = [&](double compute_ms, const std::string& suffix) {
    const double mem = image_memory_bound_ms(info, budget, compute_ms, raw_mb_s);
    const double bound = std::max(compute_ms, mem);
    j["memory_bound" + suffix + "_ms"] = finite(mem);
    j["physical_bound" + suffix + "_ms"] = finite(bound);
    j["ratio_vs_physical_bound" + suffix] = ratio(bound);
    if (j.contains("min_read_bytes")) {
      const double reserve =
          image_reserve_bound_ms(info, budget, compute_ms, raw_mb_s, j["min_read_bytes"].get<std::uint64_t>());
      j["reserve_bound" + suffix + "_ms"] = finite(reserve);
      j["ratio_vs_reserve_bound" + suffix] = ratio(reserve);
    }
  };
  bounds(direct_ms_, "");
  // Activation peaks per layer are in images of format 3; older ones bound with live bytes only.
  j["memory_bound_activations"] = info.version >= 3 ? "per-layer peaks" : "live bytes between layers";
  if (j.contains("direct_under_io")) bounds(j["direct_under_io"]["latency_ms"]["median"].get<double>(), "_under_io");
}

void Compare::print(const json& j) {
  std::printf("%s at budget %s, %zu blocks, %d rounds x %d iterations, each mode in its own process (medians)\n",
              path_.c_str(), o_.budget.c_str(), j["blocks"].size(), o_.rounds, o_.iters);
  std::printf("%-8s %12s %18s %14s\n", "mode", "latency ms", "peak model bytes", "peak RSS");
  std::printf("%-8s %12.1f %18s %14s\n", "direct", direct_ms_,
              format_bytes(j["direct"]["peak_model_bytes"].get<std::uint64_t>()).c_str(),
              format_bytes(j["direct"]["peak_rss_bytes"].get<std::uint64_t>()).c_str());
  std::printf("%-8s %12.1f %18s %14s\n", "swapnet", j["latency_ms"]["median"].get<double>(),
              format_bytes(peak_model_).c_str(), format_bytes(peak_rss_).c_str());
  if (naive_) {
    std::printf("%-8s %12.1f %18s %14s\n", "naive", naive_ms_, "-",
                format_bytes(j["naive"]["peak_rss_bytes"].get<std::uint64_t>()).c_str());
  }
  if (!naive_skipped_.empty()) std::printf("naive: not run: %s\n", naive_skipped_.c_str());
  std::printf("swapnet / direct = %.3f; swapnet / max(direct, io_bound %.1f ms) = %.3f", j["ratio_vs_direct"].get<double>(),
              j["io_bound_ms"].get<double>(), j["ratio_vs_bound"].get<double>());
  if (j.contains("ratio_vs_bound_paired")) std::printf(" (round by round: %.3f)", j["ratio_vs_bound_paired"].get<double>());
  if (naive_) std::printf("; naive / swapnet = %.2f", j["naive_ratio"].get<double>());
  std::printf("\n");
  if (j.contains("direct_under_io")) {
    std::printf("direct while the image is read at swapnet's pace (%.0f MB/s): %.1f ms; swapnet / max(that, io_bound) = %.3f\n",
                j["direct_under_io"]["background_mb_s"].get<double>(),
                j["direct_under_io"]["latency_ms"]["median"].get<double>(), j["ratio_vs_bound_under_io"].get<double>());
  }
  if (j.contains("physical_bound_ms") && !j["physical_bound_ms"].is_null()) {
    std::printf("physical bound in this budget, max(direct, memory_bound %.1f ms): %.1f ms; swapnet / that = %.3f\n",
                j["memory_bound_ms"].get<double>(), j["physical_bound_ms"].get<double>(),
                j["ratio_vs_physical_bound"].get<double>());
    if (j.contains("reserve_bound_ms") && !j["reserve_bound_ms"].is_null()) {
      std::printf("with a constant activation reserve, as swapnet plans, no plan beats %.1f ms; swapnet / that = %.3f\n",
                  j["reserve_bound_ms"].get<double>(), j["ratio_vs_reserve_bound"].get<double>());
    }
  } else if (j.contains("physical_bound_ms")) {
    std::printf("physical bound: none (some layer's weights and activation peak do not fit the budget)\n");
  }
  if (o_.check) std::printf("outputs %s direct inference\n", equal_ ? "bit-identical to" : "DIFFER from");
}

int Compare::go() {
  const std::string self = self_exe();
  choose_modes();
  for (int r = 0; r < std::max(1, o_.rounds); ++r) {
    for (const auto& mode : modes_) {
      results_[mode].push_back(run_child(self, child_args(mode, r)));
      if (mode == "swapnet" && o_.device == "cpu") direct_under_io(self);
    }
  }
  json j = swapnet_medians();
  add_baselines(j);
  add_ratios(j);
  add_bounds(j);
  if (c_.json) {
    std::cout << j.dump() << "\n";
  } else {
    print(j);
  }
  return o_.check && !equal_ ? 1 : 0;
}

}  // namespace

int run_compare(const std::string& path, const Common& c, const RunOptions& o) { return Compare(path, c, o).go(); }

}  // namespace cli
}  // namespace swapnet
