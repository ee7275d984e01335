// swapnet serve's report: one JSON object (--json) or a table of the models, their deadlines,
// the groups' scores and the budget changes; --trace and --timeline written after the run.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "serve.h"

namespace swapnet {
namespace cli {

namespace {

using json = nlohmann::json;

// Note [Group makespan and score]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Puzzle (puzzle.txt, Section 6.2) scores periodic model groups with XRBench's terms. A frame's
// makespan is the last member's finish minus the first member's start; we start the clock at the
// frame's arrival (the request), so queueing counts, as a camera's consumer sees it. A frame
// with a member dropped, failed or unanswered has no makespan (it counts as missed, RtScore 0).
// Frames that arrive in the warm-up are not scored, as their members' requests are not counted:
// a makespan and its members' latencies are then over the same frames.
//   QoE      = frames whose makespan <= the deadline / frames
//   RtScore  = 1 / (1 + exp(k (makespan - deadline))), k = 15 per millisecond (Puzzle's k with
//              times in ms: 1 well before the deadline, 0.5 at it, ~0 a millisecond after)
//   score    = mean RtScore * QoE, per group; the scenario's score is the mean over groups.
struct GroupScore {
  std::uint64_t frames = 0, complete = 0;
  double median_ms = 0, p90_ms = 0, p99_ms = 0, mean_ms = 0;
  double qoe = 0, rt_score = 0, score = 0;
};
GroupScore group_score(const std::deque<Frame>& frames, double deadline_ms) {
  GroupScore g;
  std::vector<double> spans;
  double rt = 0, met = 0;
  for (const auto& f : frames) {
    if (!f.counted) continue;  // warm-up frames, like warm-up requests, are not scored
    ++g.frames;
    if (!f.ok || f.pending > 0) continue;
    ++g.complete;
    spans.push_back(f.last_ms);
    met += f.last_ms <= deadline_ms ? 1 : 0;
    rt += 1.0 / (1.0 + std::exp(std::min(50.0, 15.0 * (f.last_ms - deadline_ms))));
  }
  if (!spans.empty()) {
    g.median_ms = percentile(spans, 0.5);
    g.p90_ms = percentile(spans, 0.9);
    g.p99_ms = percentile(spans, 0.99);
    double sum = 0;
    for (double x : spans) sum += x;
    g.mean_ms = sum / static_cast<double>(spans.size());
  }
  if (g.frames > 0) {
    g.qoe = met / static_cast<double>(g.frames);
    g.rt_score = rt / static_cast<double>(g.frames);
    g.score = g.rt_score * g.qoe;
  }
  return g;
}

// Note [Counted requests and their score]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model's results count the requests that arrived after the warm-up (Note [Load and run
// rules] in serve_load.cpp): slo_met is those answered by their deadline over all of them
// (dropped, failed and unanswered ones count as missed), latency_ms their answered ones'
// percentiles, and xrbench_score XRBench's real-time score as Puzzle uses it (Note [Group
// makespan and score]) per request: mean RtScore x QoE, RtScore 0 for a request not answered.
// The scenario's slo_met is over every counted request with a deadline, and its xrbench_score
// the mean over the models with deadlines.
struct Counted {
  std::uint64_t requests = 0, met = 0, dropped = 0;
  std::vector<double> ms;  // answered
  double rt = 0;           // sum of RtScore
  json slo_met() const { return requests ? json(double(met) / double(requests)) : json(nullptr); }
  json score() const {
    return requests ? json(rt / double(requests) * double(met) / double(requests)) : json(nullptr);
  }
};
Counted counted(const std::vector<Outcome>& outcomes, double warmup_s, double slo_ms) {
  Counted c;
  for (const auto& o : outcomes) {
    if (o.arrival_s < warmup_s) continue;
    ++c.requests;
    c.dropped += o.fate == Outcome::kDropped ? 1 : 0;
    if (o.fate != Outcome::kAnswered) continue;
    c.ms.push_back(o.ms);
    if (slo_ms > 0) {
      c.met += o.ms <= slo_ms ? 1 : 0;
      c.rt += 1.0 / (1.0 + std::exp(std::min(50.0, 15.0 * (o.ms - slo_ms))));
    }
  }
  return c;
}

json load_json(const ServeSetup& setup) {
  const LoadInfo& l = setup.load;
  if (!(l.target > 0)) return nullptr;
  json direct = json::object(), bound = json::object(), counted = json::object(), budget = json::object();
  for (size_t i = 0; i < setup.s.models.size(); ++i) {
    const std::string& name = setup.s.models[i].rt.name;
    direct[name] = l.direct_ms[i];
    bound[name] = i < l.bound_ms.size() ? l.bound_ms[i] : 0.0;
    counted[name] = l.counted_ms(i);
    budget[name] = i < l.budget.size() ? l.budget[i] : 0;
  }
  // Note [A load that counts the disk] (serve_load.cpp): counted_ms is what the load sums.
  return {{"target", l.target},      {"written", l.written},   {"scale", l.scale},
          {"cores", l.cores},        {"direct_ms", direct},    {"read_mb_s", l.read_mb_s},
          {"bound_ms", bound},       {"counted_ms", counted},  {"budget_bytes", budget}};
}

// The run's own facts: the scenario, scheduler, budgets and time.
json run_json(Runtime& rt, const ServeSetup& setup, Clock::time_point start, bool check) {
  const Scenario& s = setup.s;
  json j;
  j["scenario"] = s.name;
  j["policy"] = s.policy;
  j["scheduler"] = s.scheduler;
  j["workers"] = s.workers;
  j["dispatch_us"] = rt.dispatch_us();
  if (s.scheduler.size() > 3 && s.scheduler.compare(s.scheduler.size() - 3, 3, "+io") == 0) {
    const SharedDisk::Stats ds = rt.disk_stats();  // Note [One disk, read by urgency]
    j["disk_reads"] = {{"granted", ds.granted}, {"deferred", ds.deferred}};
  }
  j["total_budget_bytes"] = rt.total_budget();
  j["initial_budget_bytes"] = setup.total;
  j["duration_s"] = ms_since(start) / 1000;
  j["warmup_s"] = setup.warmup_s;
  j["warmup_inferences"] = setup.warmup_inferences;
  j["min_requests"] = s.min_requests;
  j["load"] = load_json(setup);
  j["checked"] = check;
  return j;
}

// Model m's (number i) estimate error over the steps run after the warm-up (`kind` 0), per ms
// of those steps' work (1), or per block (2), as slo_met counts requests (Note [Counted requests
// and their score]); over the whole run where the warm-up was not reached.
double estimate_error(const ServeLog& log, const ModelStatus& m, int i, int kind) {
  auto err = [&](const ModelStatus& x) {
    return kind == 0 ? x.estimate_error : kind == 1 ? x.estimate_time_error : x.estimate_block_error;
  };
  auto weight = [&](const ModelStatus& x) {
    return kind == 0 ? static_cast<double>(x.estimated_steps)
                     : kind == 1 ? x.estimated_ms : static_cast<double>(x.estimated_blocks);
  };
  if (log.at_warmup.size() <= static_cast<size_t>(i)) return err(m);
  const ModelStatus& w = log.at_warmup[static_cast<size_t>(i)];
  const double n = weight(m) - weight(w);
  if (!(n > 0)) return err(m);
  return std::max(0.0, (err(m) * weight(m) - err(w) * weight(w)) / n);
}

// Model i's results: its status in the runtime, its clients' latencies and comparisons.
json model_json(Runtime& rt, const ServeSetup& setup, const ServeLog& log, const ModelStatus& m, int i, bool check) {
  const Scenario& s = setup.s;
  const ScenarioModel& sm = s.models[i];
  const Executor::Learning learned = rt.executor(i).learning();
  const Counted k = counted(log.outcomes[i], setup.warmup_s, sm.slo_ms);
  json mj = {{"name", m.name},
             {"image", sm.rt.image},
             {"urgency", sm.rt.urgency},
             {"device", sm.device},
             {"threads", sm.rt.threads},
             {"budget_bytes", m.budget},
             {"min_budget_bytes", m.min_bytes},
             {"full_bytes", m.full_bytes},
             {"paused", m.paused},
             {"blocks", m.blocks},
             {"resident_blocks", m.resident_blocks},
             {"predicted_ms", m.predicted_ms},
             {"peak_model_bytes", m.peak_model_bytes},
             {"over_budget", m.over_budget},
             {"latency_ms", {{"median", median(k.ms)}, {"p50", median(k.ms)}, {"p90", percentile(k.ms, 0.9)}, {"p99", percentile(k.ms, 0.99)}}},
             {"period_ms", sm.group >= 0 ? s.groups[static_cast<size_t>(sm.group)].period_ms : sm.period_ms},
             {"group", sm.group >= 0 ? json(s.groups[static_cast<size_t>(sm.group)].name) : json(nullptr)},
             {"slo_ms", sm.slo_ms},
             {"slo_met", sm.slo_ms > 0 ? k.slo_met() : json(nullptr)},
             {"xrbench_score", sm.slo_ms > 0 ? k.score() : json(nullptr)},
             {"counted_requests", k.requests},
             {"counted_dropped", k.dropped},
             {"deadline_requests", m.deadline_requests},
             {"unanswered", log.unanswered[i]},
             {"dropped", m.dropped},
             {"estimate_error", estimate_error(log, m, i, 0)},
             {"estimate_time_error", estimate_error(log, m, i, 1)},
             {"estimate_block_error", estimate_error(log, m, i, 2)},
             {"estimate_error_all", m.estimate_error},
             {"estimate_time_error_all", m.estimate_time_error},
             {"estimated_steps", m.estimated_steps},
             {"estimated_blocks", m.estimated_blocks},
             {"contention", m.contention},
             {"requests", log.lat[i].size()},
             {"rejected", m.rejected},
             {"failed", m.failed},
             {"abandoned", m.abandoned},
             {"budget_changes", m.budget_changes},
             {"mid_inference_moves", m.mid_inference_moves},
             // --learn (Note [Learning the costs in service]): windows checked, learned plans in
             // force, plans kept with learned costs (Note [A re-plan must gain]).
             {"learn_windows", learned.windows},
             {"learned_plans", learned.adopted},
             {"learn_kept_plans", learned.kept_plans},
             {"learn_window", learned.window},
             {"learn_noise", learned.noise},
             {"learn_loaded", learned.loaded_times || learned.loaded_rate},
             {"learn_stored", learned.stored}};
  if (check) {
    mj["equal"] = static_cast<bool>(log.equal[i]);
    mj["max_abs_diff"] = log.max_diff[i];
    if (!log.equal[i]) mj["difference"] = log.diff[i];
  } else {
    mj["equal"] = nullptr;
  }
  if (!m.paused) mj["paused_reason"] = nullptr;
  else mj["paused_reason"] = m.paused_reason;
  return mj;
}

// Every counted request's deadline met, over the models with deadlines, and the mean of their
// XRBench scores (Note [Counted requests and their score]); null when none had a deadline.
void add_slo(const ServeSetup& setup, const ServeLog& log, json* j) {
  std::uint64_t met = 0, asked = 0;
  double score = 0;
  int scored = 0;
  for (size_t i = 0; i < setup.s.models.size(); ++i) {
    const double slo = setup.s.models[i].slo_ms;
    if (!(slo > 0)) continue;
    const Counted k = counted(log.outcomes[i], setup.warmup_s, slo);
    met += k.met;
    asked += k.requests;
    if (k.requests) score += k.score().get<double>(), ++scored;
  }
  (*j)["slo_met"] = asked ? json(double(met) / double(asked)) : json(nullptr);
  (*j)["xrbench_score"] = scored ? json(score / scored) : json(nullptr);
}

// Puzzle's periodic groups (Note [Group makespan and score]): j["groups"] and j["score"].
void add_groups(const ServeSetup& setup, const ServeLog& log, const std::vector<ModelStatus>& st, json* j) {
  const Scenario& s = setup.s;
  (*j)["groups"] = json::array();
  double score_sum = 0;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const ScenarioGroup& sg = s.groups[g];
    const GroupScore gs = group_score(log.frames[g], sg.slo_ms);
    json members = json::array();
    for (int i : sg.members) members.push_back(st[i].name);
    (*j)["groups"].push_back({{"name", sg.name}, {"models", members}, {"period_ms", sg.period_ms}, {"slo_ms", sg.slo_ms},
                              {"frames", gs.frames}, {"complete", gs.complete},
                              {"makespan_ms", {{"median", gs.median_ms}, {"p90", gs.p90_ms}, {"p99", gs.p99_ms}, {"mean", gs.mean_ms}}},
                              {"qoe", gs.qoe}, {"rt_score", gs.rt_score}, {"score", gs.score}});
    score_sum += gs.score;
  }
  (*j)["score"] = s.groups.empty() ? json(nullptr) : json(score_sum / static_cast<double>(s.groups.size()));
}

json adaptations_json(Runtime& rt) {
  json a = json::array();
  for (const auto& x : rt.adaptations()) {
    a.push_back({{"at_s", x.at_s}, {"budget_bytes", x.budget_bytes}, {"budgets", x.budgets},
                 {"plan_ms", x.plan_ms}, {"took_ms", x.took_ms}, {"plans_ms", x.plans_ms}, {"moved_ms", x.moved_ms},
                 {"move_ms", x.move_ms}, {"note", x.note}});
  }
  return a;
}

// --timeline: every answered request in time order.
void write_timeline(const std::string& path, std::vector<Sample>& samples, const std::vector<ModelStatus>& st) {
  std::ofstream t(path);
  if (!t) throw Error(path + ": cannot write the timeline");
  t << "t_s,model,latency_ms,total_budget_bytes\n";
  std::sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) { return a.t_s < b.t_s; });
  for (const auto& x : samples) t << x.t_s << "," << st[x.model].name << "," << x.ms << "," << x.total << "\n";
}

// The human report: the models' table, then deadlines, groups and budget changes where any.
void print_report(const json& j, const std::string& scheduler) {
  std::printf("%-16s %10s %6s %10s %10s %10s %8s %6s\n", "model", "budget", "blocks", "peak", "median ms", "p90 ms",
              "requests", "equal");
  for (const auto& mj : j["models"]) {
    std::printf("%-16s %10s %6d %10s %10.1f %10.1f %8zu %6s%s\n", mj["name"].get<std::string>().c_str(),
                mj["paused"].get<bool>() ? "paused" : format_bytes(mj["budget_bytes"].get<std::uint64_t>()).c_str(),
                mj["blocks"].get<int>(), format_bytes(mj["peak_model_bytes"].get<std::uint64_t>()).c_str(),
                mj["latency_ms"]["median"].get<double>(), mj["latency_ms"]["p90"].get<double>(),
                mj["requests"].get<size_t>(),
                mj["equal"].is_null() ? "-" : mj["equal"].get<bool>() ? "yes" : "NO",
                mj["over_budget"].get<std::uint64_t>() ? "  OVER BUDGET" : "");
  }
  if (!j["slo_met"].is_null()) {
    std::printf("deadlines (%s scheduler): %.1f %% met overall;", scheduler.c_str(), 100 * j["slo_met"].get<double>());
    for (const auto& mj : j["models"]) {
      if (mj["slo_met"].is_null()) continue;
      std::printf(" %s %.1f %% (%llu dropped)", mj["name"].get<std::string>().c_str(), 100 * mj["slo_met"].get<double>(),
                  static_cast<unsigned long long>(mj["dropped"].get<std::uint64_t>()));
    }
    std::printf("\n");
  }
  for (const auto& gj : j["groups"]) {
    std::printf("group %s: %llu frames, makespan median %.1f ms p90 %.1f ms (period %.0f ms, deadline %.0f ms), "
                "QoE %.3f, score %.3f\n",
                gj["name"].get<std::string>().c_str(), static_cast<unsigned long long>(gj["frames"].get<std::uint64_t>()),
                gj["makespan_ms"]["median"].get<double>(), gj["makespan_ms"]["p90"].get<double>(),
                gj["period_ms"].get<double>(), gj["slo_ms"].get<double>(), gj["qoe"].get<double>(),
                gj["score"].get<double>());
  }
  for (const auto& a : j["adaptations"]) {
    std::printf("at %.1f s: budget %s, planned in %.3f ms, in effect after %.1f ms: %s\n", a["at_s"].get<double>(),
                format_bytes(a["budget_bytes"].get<std::uint64_t>()).c_str(), a["plan_ms"].get<double>(),
                a["took_ms"].get<double>(), a["note"].get<std::string>().c_str());
  }
}

}  // namespace

int serve_report(Runtime& rt, const ServeSetup& setup, ServeLog& log, Clock::time_point start, const Common& c,
                 const ServeOptions& o) {
  const int n = rt.size();
  const std::vector<ModelStatus> st = rt.status();
  json j = run_json(rt, setup, start, o.check);
  bool all_equal = true, within = true;
  std::uint64_t peak_sum = 0;
  for (int i = 0; i < n; ++i) {
    j["models"].push_back(model_json(rt, setup, log, st[i], i, o.check));
    if (o.check) all_equal &= log.equal[i] != 0;
    within &= st[i].over_budget == 0;
    peak_sum += st[i].peak_model_bytes;
  }
  j["peak_model_bytes_sum"] = peak_sum;
  j["driver_cpu_s"] = log.driver_cpu_s;  // Note [The driver sleeps] in cmd_serve.cpp
  add_slo(setup, log, &j);
  add_groups(setup, log, st, &j);
  j["adaptations"] = adaptations_json(rt);
  const MemoryUse mu = rt.memory_use();  // Note [The memory ledger]
  j["memory"] = {{"peak_bytes", mu.peak_bytes}, {"over_byte_s", mu.over_byte_s}, {"over_s", mu.over_s},
                 {"complying_byte_s", mu.complying_byte_s}};
  if (!o.trace.empty()) trace_write(o.trace).throw_if_error();
  if (!o.timeline.empty()) write_timeline(o.timeline, log.samples, st);
  if (c.json) {
    std::cout << j.dump() << std::endl;
  } else {
    print_report(j, setup.s.scheduler);
  }
  bool none_failed = true;
  for (const auto& m : st) none_failed &= m.failed == 0;
  return all_equal && within && none_failed ? 0 : 1;
}

}  // namespace cli
}  // namespace swapnet
