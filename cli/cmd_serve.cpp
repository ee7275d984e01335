// swapnet serve SCENARIO.json: several models served concurrently within one total budget (the
// scheduler's Runtime), with a closed-loop or paced client per model, an optional budget
// schedule, a control socket (`swapnet ctl`) and an optional watched budget source.
//
// Scenario file (docs/scheduler.md):
//   {"name": "uav", "total_budget": "80%", "policy": "paper", "duration_s": 20,
//    "models": [{"name": "yolov3", "image": "yolov3.swapnet", "urgency": 1, "device": "cpu",
//                "threads": 1, "cpus": [0], "rate_hz": 0, "input_shape": ["1,3,416,416"]}, ...],
//    "schedule": [{"at_s": 10, "budget": "60%"}]}
// Deadlines: "scheduler": "lst" (or threads, fifo, rr, sel), "workers": 1, and per model
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
#include <sys/stat.h>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <memory>
#include <random>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <thread>

#include "commands.h"
#include "inputs.h"
#include "scenario.h"
#include "swapnet/scheduler.h"

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
//   QoE      = frames whose makespan <= the deadline / frames
//   RtScore  = 1 / (1 + exp(k (makespan - deadline))), k = 15 per millisecond (Puzzle's k with
//              times in ms: 1 well before the deadline, 0.5 at it, ~0 a millisecond after)
//   score    = mean RtScore * QoE, per group; the scenario's score is the mean over groups.
// One frame of a group, as its members answer.
struct Frame {
  int pending = 0;     // members not answered yet
  bool ok = true;      // every member answered (not dropped, failed or unanswered)
  double last_ms = 0;  // the last member's answer after the frame's arrival
};
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

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted.store(true); }

struct Sample {
  double t_s;
  int model;
  double ms;
  std::uint64_t total;
};

}  // namespace

int serve(const std::string& path, const Common& c, const ServeOptions& o) {
  apply_common(c);
  const char* env_models = std::getenv("SWAPNET_MODELS");
  const std::string models_dir = !o.models_dir.empty() ? o.models_dir : env_models ? env_models : ".cache/models";
  Scenario s = load_scenario(path, models_dir);
  if (o.duration_s > 0) s.duration_s = o.duration_s;
  // A bad name is refused naming where it came from: the command line or the scenario's field.
  auto named = [&](const std::string& field, bool from_option, const std::function<void()>& check) {
    try {
      check();
    } catch (const std::exception& e) {
      throw Error((from_option ? "--" + field : path + ": field '" + field + "'") + ": " + e.what());
    }
  };
  if (!o.policy.empty()) s.policy = o.policy;
  if (!o.scheduler.empty()) s.scheduler = o.scheduler;
  named("policy", !o.policy.empty(), [&] { (void)make_policy(s.policy); });
  named("scheduler", !o.scheduler.empty(), [&] {
    if (s.scheduler != "threads") (void)make_dispatch_policy(s.scheduler);
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

  // Sizes as the images record them: the base of percentages, and each model's input.
  std::uint64_t whole = 0;
  std::vector<ImageInfo> infos;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
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
    if (m.rt.threads == 0) m.rt.threads = static_cast<int>(std::max<size_t>(1, cores / s.models.size()));
    infos.push_back(std::move(info));
  }
  const std::uint64_t total = budget_value(s.total, whole, path + ": field 'total_budget'");
  std::vector<std::pair<double, std::uint64_t>> schedule;
  for (size_t i = 0; i < s.schedule.size(); ++i) {
    schedule.emplace_back(s.schedule[i].first, budget_value(s.schedule[i].second, whole,
                                                            path + ": field 'schedule[" + std::to_string(i) + "].budget'"));
  }

  // Inputs and the reference outputs of direct (all in memory) inference, before the run.
  std::vector<std::vector<c10::IValue>> inputs;
  std::vector<c10::IValue> reference;
  {
    c10::InferenceMode guard;
    for (size_t i = 0; i < s.models.size(); ++i) {
      Common mc = c;
      if (!s.models[i].shapes.empty()) mc.input_shapes = s.models[i].shapes;
      std::vector<std::string> shapes;
      try {
        inputs.push_back(inputs_for(mc, infos[i], &shapes));
      } catch (const std::exception& e) {  // the file and the field, not only the spec
        throw Error(path + ": field 'models[" + std::to_string(i) + "].input_shape' (" + s.models[i].rt.name +
                    "): " + e.what());
      }
      if (o.check) {
        // On a thread with the model's intra-op threads, as its worker: some kernels' results
        // (parallel reductions) depend on the thread count.
        c10::IValue out;
        std::exception_ptr failed;
        std::thread([&] {
          try {
            at::internal::lazy_init_num_threads();
            at::set_num_threads(s.models[i].rt.threads);
            c10::InferenceMode g;
            const bool cuda = s.models[i].device == "cuda";
            InMemory direct(s.models[i].rt.image, infos[i], cuda);
            std::vector<c10::IValue> in = clone_inputs(inputs[i]);
            if (cuda) inputs_to_cuda(&in);  // as the executor moves them
            out = direct.sk.forward(std::move(in));
          } catch (...) {
            failed = std::current_exception();
          }
        }).join();
        if (failed) std::rethrow_exception(failed);
        reference.push_back(out);
      }
    }
  }

  RuntimeOptions ro;
  ro.policy = s.policy;
  ro.scheduler = s.scheduler;
  ro.workers = s.workers;
  std::vector<RuntimeModel> specs;
  for (const auto& m : s.models) specs.push_back(m.rt);
  if (!o.trace.empty()) trace_start();  // before the models open: each takes a group in the trace
  std::unique_ptr<Runtime> rt = Runtime::open(std::move(specs), total, ro);
  std::unique_ptr<ControlServer> control;
  if (o.socket != "none") control = std::make_unique<ControlServer>(rt.get(), o.socket.empty() ? default_control_path() : o.socket);
  std::unique_ptr<BudgetWatcher> watcher;
  if (!o.budget_source.empty()) {
    watcher = std::make_unique<BudgetWatcher>(rt.get(), BudgetSource(o.budget_source),
                                              std::chrono::milliseconds(std::max(1, o.poll_ms)));
  }
  if (!c.json) {
    std::printf("serving %s: %zu models, total budget %s (%s policy), %.0f s%s\n", s.name.c_str(), s.models.size(),
                format_bytes(total).c_str(), s.policy.c_str(), s.duration_s,
                control ? (", control: swapnet ctl --socket " + control->path() + " budget SIZE").c_str() : "");
    std::fflush(stdout);
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  const int n = rt->size();
  std::mutex mu;
  std::vector<std::vector<double>> lat(n);
  std::vector<Sample> samples;
  std::vector<char> equal(n, 1);
  std::vector<std::string> diff(n);
  std::vector<double> max_diff(n, 0);
  std::atomic<bool> done{false};
  std::vector<std::thread> clients;
  std::vector<std::uint64_t> dropped(n, 0), sent(n, 0), unanswered(n, 0);
  std::mutex grace_mu;
  Clock::time_point grace{};
  auto grace_end = [&] {
    std::lock_guard<std::mutex> lk(grace_mu);
    if (grace == Clock::time_point{}) grace = Clock::now() + std::chrono::seconds(2);
    return grace;
  };
  auto record = [&](int i, c10::IValue out, double ms) {
    std::lock_guard<std::mutex> lk(mu);
    lat[i].push_back(ms);
    samples.push_back({rt->seconds(), i, ms, rt->total_budget()});
    if (o.check) {  // compare_outputs reads GPU tensors back itself
      Comparison cmp = compare_outputs(reference[i], out);
      if (!cmp.equal && equal[i]) diff[i] = cmp.difference;
      equal[i] &= cmp.equal;
      max_diff[i] = std::max(max_diff[i], cmp.max_abs_diff);
    }
  };
  // Open loop: a stream's frames arrive at its period whatever the state of earlier requests,
  // each to every model of the stream (one model, or a group's members); per model a collector
  // takes the answers in order.
  struct Pending {
    std::future<c10::IValue> f;
    Clock::time_point arrival;
    size_t frame = 0;  // in its group's frames (members of a group)
  };
  struct Inbox {
    std::deque<Pending> q;
    std::mutex mu;
    std::condition_variable cv;
    bool closed = false;
  };
  std::vector<std::deque<Frame>> frames(s.groups.size());  // under mu
  std::vector<std::unique_ptr<Inbox>> inbox(n);
  struct Stream {
    std::vector<int> members;
    double period_ms, jitter_ms, slo_ms;
    int group;
  };
  std::vector<Stream> streams;
  for (int i = 0; i < n; ++i) {
    if (s.models[i].period_ms > 0) streams.push_back({{i}, s.models[i].period_ms, s.models[i].jitter_ms, s.models[i].slo_ms, -1});
  }
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const ScenarioGroup& sg = s.groups[g];
    streams.push_back({sg.members, sg.period_ms, sg.jitter_ms, sg.slo_ms, static_cast<int>(g)});
  }
  for (size_t k = 0; k < streams.size(); ++k) {
    for (int i : streams[k].members) inbox[i] = std::make_unique<Inbox>();
    clients.emplace_back([&, k] {
      c10::InferenceMode guard;
      const Stream& st = streams[k];
      std::mt19937 rng(1234 + st.members.front() + 1000 * (st.group + 1));
      auto us = [](double ms) { return std::chrono::microseconds(static_cast<long long>(ms * 1000)); };
      auto tick = Clock::now();
      while (!done.load()) {
        const double jitter = st.jitter_ms > 0 ? std::uniform_real_distribution<double>(-st.jitter_ms, st.jitter_ms)(rng) : 0;
        std::this_thread::sleep_until(tick + us(std::max(0.0, jitter)));
        tick += us(st.period_ms);
        if (done.load()) break;
        const auto arrival = Clock::now();
        const auto deadline = st.slo_ms > 0 ? arrival + us(st.slo_ms) : Clock::time_point{};
        size_t frame = 0;
        if (st.group >= 0) {
          std::lock_guard<std::mutex> lk(mu);
          frame = frames[static_cast<size_t>(st.group)].size();
          frames[static_cast<size_t>(st.group)].push_back({static_cast<int>(st.members.size()), true, 0});
        }
        for (int i : st.members) {
          Pending p{rt->submit(i, clone_inputs(inputs[i]), deadline), arrival, frame};
          {
            std::lock_guard<std::mutex> lk(inbox[i]->mu);
            inbox[i]->q.push_back(std::move(p));
            ++sent[i];  // this stream's thread is the only writer
          }
          inbox[i]->cv.notify_one();
        }
      }
      for (int i : st.members) {
        {
          std::lock_guard<std::mutex> lk(inbox[i]->mu);
          inbox[i]->closed = true;
        }
        inbox[i]->cv.notify_one();
      }
    });
  }
  for (int i = 0; i < n; ++i) {
    if (inbox[i]) {
      clients.emplace_back([&, i] {
        c10::InferenceMode guard;
        Inbox& box = *inbox[i];
        const int group = s.models[i].group;
        // A group member's answer (or its absence) in its frame, under mu.
        auto settle = [&](size_t frame, bool ok, double ms) {
          if (group < 0) return;
          Frame& f = frames[static_cast<size_t>(group)][frame];
          --f.pending;
          f.ok &= ok;
          f.last_ms = std::max(f.last_ms, ms);
        };
        while (true) {
          Pending p;
          {
            std::unique_lock<std::mutex> lk(box.mu);
            box.cv.wait(lk, [&] { return !box.q.empty() || box.closed; });
            if (box.q.empty()) break;
            p = std::move(box.q.front());
            box.q.pop_front();
          }
          // After the run, a request still queued is given 2 s, then counted as unanswered
          // (a miss when it has a deadline).
          if (done.load() && p.f.wait_until(grace_end()) != std::future_status::ready) {
            std::lock_guard<std::mutex> lk(mu);
            ++unanswered[i];
            settle(p.frame, false, 0);
            continue;
          }
          try {
            c10::IValue out = p.f.get();
            const double ms = ms_since(p.arrival);
            record(i, std::move(out), ms);
            std::lock_guard<std::mutex> lk(mu);
            settle(p.frame, true, ms);
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lk(mu);
            if (std::string(e.what()).find(": dropped: ") != std::string::npos) ++dropped[i];
            settle(p.frame, false, 0);
          }
        }
      });
    }
  }
  for (int i = 0; i < n; ++i) {
    if (inbox[i]) continue;
    clients.emplace_back([&, i] {
      c10::InferenceMode guard;
      const double period_ms = s.models[i].rate_hz > 0 ? 1000.0 / s.models[i].rate_hz : 0;
      auto next = Clock::now();
      while (!done.load()) {
        if (period_ms > 0) {
          std::this_thread::sleep_until(next);
          next += std::chrono::microseconds(static_cast<long long>(period_ms * 1000));
          if (Clock::now() > next) next = Clock::now();
        }
        if (done.load()) break;
        auto t0 = Clock::now();
        const auto deadline = s.models[i].slo_ms > 0
                                  ? t0 + std::chrono::microseconds(static_cast<long long>(s.models[i].slo_ms * 1000))
                                  : Clock::time_point{};
        try {
          c10::IValue out = rt->submit(i, clone_inputs(inputs[i]), deadline).get();
          record(i, std::move(out), ms_since(t0));
        } catch (const std::exception& e) {
          // Paused (the runtime said why when it paused it) or failed: try again shortly.
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    });
  }
  const auto start = Clock::now();
  size_t next_change = 0;
  std::sort(schedule.begin(), schedule.end());
  while (!g_interrupted.load()) {
    const double now_s = ms_since(start) / 1000;
    if (now_s >= s.duration_s) break;
    double wake_s = s.duration_s;
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
  done.store(true);
  for (auto& t : clients) t.join();
  watcher.reset();
  control.reset();
  rt->wait_adapted(std::chrono::seconds(30));

  const std::vector<ModelStatus> st = rt->status();
  json j;
  j["scenario"] = s.name;
  j["policy"] = s.policy;
  j["scheduler"] = s.scheduler;
  j["workers"] = s.workers;
  j["dispatch_us"] = rt->dispatch_us();
  if (s.scheduler.size() > 3 && s.scheduler.compare(s.scheduler.size() - 3, 3, "+io") == 0) {
    const SharedDisk::Stats ds = rt->disk_stats();  // Note [One disk, read by urgency]
    j["disk_reads"] = {{"granted", ds.granted}, {"deferred", ds.deferred}};
  }
  j["total_budget_bytes"] = rt->total_budget();
  j["initial_budget_bytes"] = total;
  j["duration_s"] = ms_since(start) / 1000;
  j["checked"] = o.check;
  bool all_equal = true, within = true;
  std::uint64_t peak_sum = 0;
  for (int i = 0; i < n; ++i) {
    const ModelStatus& m = st[i];
    const Executor::Learning learned = rt->executor(i).learning();
    json mj = {{"name", m.name},
               {"image", s.models[i].rt.image},
               {"urgency", s.models[i].rt.urgency},
               {"device", s.models[i].device},
               {"threads", s.models[i].rt.threads},
               {"budget_bytes", m.budget},
               {"min_budget_bytes", m.min_bytes},
               {"full_bytes", m.full_bytes},
               {"paused", m.paused},
               {"blocks", m.blocks},
               {"resident_blocks", m.resident_blocks},
               {"predicted_ms", m.predicted_ms},
               {"peak_model_bytes", m.peak_model_bytes},
               {"over_budget", m.over_budget},
               {"latency_ms", {{"median", median(lat[i])}, {"p90", percentile(lat[i], 0.9)}, {"p99", percentile(lat[i], 0.99)}}},
               {"period_ms", s.models[i].group >= 0 ? s.groups[static_cast<size_t>(s.models[i].group)].period_ms
                                                     : s.models[i].period_ms},
               {"group", s.models[i].group >= 0 ? json(s.groups[static_cast<size_t>(s.models[i].group)].name) : json(nullptr)},
               {"slo_ms", s.models[i].slo_ms},
               {"slo_met", m.deadline_requests + (s.models[i].slo_ms > 0 ? unanswered[i] : 0)
                               ? json(double(m.deadline_met) /
                                      double(m.deadline_requests + (s.models[i].slo_ms > 0 ? unanswered[i] : 0)))
                               : json(nullptr)},
               {"deadline_requests", m.deadline_requests},
               {"unanswered", unanswered[i]},
               {"dropped", m.dropped},
               {"estimate_error", m.estimate_error},
               {"requests", lat[i].size()},
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
    if (o.check) {
      mj["equal"] = static_cast<bool>(equal[i]);
      mj["max_abs_diff"] = max_diff[i];
      if (!equal[i]) mj["difference"] = diff[i];
      all_equal &= equal[i] != 0;
    } else {
      mj["equal"] = nullptr;
    }
    if (!m.paused) mj["paused_reason"] = nullptr;
    else mj["paused_reason"] = m.paused_reason;
    within &= m.over_budget == 0;
    peak_sum += m.peak_model_bytes;
    j["models"].push_back(mj);
  }
  j["peak_model_bytes_sum"] = peak_sum;
  {
    std::uint64_t met = 0, asked = 0;
    for (int i = 0; i < n; ++i) {
      met += st[i].deadline_met;
      asked += st[i].deadline_requests + (s.models[i].slo_ms > 0 ? unanswered[i] : 0);
    }
    j["slo_met"] = asked ? json(double(met) / double(asked)) : json(nullptr);
  }
  // Puzzle's periodic groups (Note [Group makespan and score]).
  j["groups"] = json::array();
  double score_sum = 0;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const ScenarioGroup& sg = s.groups[g];
    const GroupScore gs = group_score(frames[g], sg.slo_ms);
    json members = json::array();
    for (int i : sg.members) members.push_back(st[i].name);
    j["groups"].push_back({{"name", sg.name}, {"models", members}, {"period_ms", sg.period_ms}, {"slo_ms", sg.slo_ms},
                           {"frames", gs.frames}, {"complete", gs.complete},
                           {"makespan_ms", {{"median", gs.median_ms}, {"p90", gs.p90_ms}, {"p99", gs.p99_ms}, {"mean", gs.mean_ms}}},
                           {"qoe", gs.qoe}, {"rt_score", gs.rt_score}, {"score", gs.score}});
    score_sum += gs.score;
  }
  j["score"] = s.groups.empty() ? json(nullptr) : json(score_sum / static_cast<double>(s.groups.size()));
  j["adaptations"] = json::array();
  for (const auto& a : rt->adaptations()) {
    j["adaptations"].push_back({{"at_s", a.at_s}, {"budget_bytes", a.budget_bytes}, {"budgets", a.budgets},
                                {"plan_ms", a.plan_ms}, {"took_ms", a.took_ms}, {"plans_ms", a.plans_ms}, {"moved_ms", a.moved_ms},
                                {"move_ms", a.move_ms}, {"note", a.note}});
  }
  if (!o.trace.empty()) trace_write(o.trace).throw_if_error();
  if (!o.timeline.empty()) {
    std::ofstream t(o.timeline);
    if (!t) throw Error(o.timeline + ": cannot write the timeline");
    t << "t_s,model,latency_ms,total_budget_bytes\n";
    std::sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) { return a.t_s < b.t_s; });
    for (const auto& x : samples) t << x.t_s << "," << st[x.model].name << "," << x.ms << "," << x.total << "\n";
  }
  if (c.json) {
    std::cout << j.dump() << std::endl;
  } else {
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
      std::printf("deadlines (%s scheduler): %.1f %% met overall;", s.scheduler.c_str(), 100 * j["slo_met"].get<double>());
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
  bool none_failed = true;
  for (const auto& m : st) none_failed &= m.failed == 0;
  return all_equal && within && none_failed ? 0 : 1;
}

int ctl(const std::vector<std::string>& words, const std::string& socket) {
  std::string line;
  for (const auto& w : words) line += (line.empty() ? "" : " ") + w;
  if (line.empty()) throw Error("ctl: give a command: budget SIZE | status");
  const std::string answer = control_request(socket.empty() ? default_control_path() : socket, line);
  std::printf("%s\n", answer.c_str());
  return answer.rfind("error", 0) == 0 ? 2 : 0;
}

}  // namespace cli
}  // namespace swapnet
