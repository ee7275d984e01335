// serve's clients (serve_clients.h).
#include "serve_clients.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "inputs.h"

namespace swapnet {
namespace cli {

void Clients::start() {
  const int n = rt_->size();
  start_ = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (s_.models[i].period_ms > 0) streams_.push_back({{i}, s_.models[i].period_ms, s_.models[i].jitter_ms, s_.models[i].slo_ms, -1});
  }
  for (size_t g = 0; g < s_.groups.size(); ++g) {
    const ScenarioGroup& sg = s_.groups[g];
    streams_.push_back({sg.members, sg.period_ms, sg.jitter_ms, sg.slo_ms, static_cast<int>(g)});
  }
  for (size_t k = 0; k < streams_.size(); ++k) {
    for (int i : streams_[k].members) inbox_[i] = std::make_unique<Inbox>();
    threads_.emplace_back([this, k] { stream(k); });
  }
  for (int i = 0; i < n; ++i) {
    if (inbox_[i]) threads_.emplace_back([this, i] { collect(i); });
  }
  for (int i = 0; i < n; ++i) {
    if (inbox_[i]) continue;
    threads_.emplace_back([this, i] { closed_loop(i); });
  }
}

bool Clients::enough(int n) {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < s_.models.size(); ++i) {
    const bool open_loop = s_.models[i].period_ms > 0 || s_.models[i].group >= 0;
    if (open_loop && log_->counted[i] < static_cast<std::uint64_t>(n)) return false;
  }
  return true;
}

void Clients::ended(int i, Outcome::Fate fate, Clock::time_point arrival, double ms) {
  log_->outcomes[i].push_back({std::chrono::duration<double>(arrival - start_).count(), fate,
                               fate == Outcome::kAnswered ? ms : 0});
}

void Clients::record(int i, c10::IValue out, Clock::time_point arrival, double ms) {
  // Compared before taking mu_: another model's answer does not wait for this comparison.
  Comparison cmp;
  if (check_) cmp = compare_outputs(reference_[i], out);  // reads GPU tensors back itself
  std::lock_guard<std::mutex> lk(mu_);
  ended(i, Outcome::kAnswered, arrival, ms);
  log_->lat[i].push_back(ms);
  log_->samples.push_back({rt_->seconds(), i, ms, rt_->total_budget()});
  if (check_) {
    if (!cmp.equal && log_->equal[i]) log_->diff[i] = cmp.difference;
    log_->equal[i] &= cmp.equal;
    log_->max_diff[i] = std::max(log_->max_diff[i], cmp.max_abs_diff);
  }
}

Clock::time_point Clients::grace_end() {
  std::lock_guard<std::mutex> lk(grace_mu_);
  if (grace_ == Clock::time_point{}) grace_ = Clock::now() + std::chrono::seconds(2);
  return grace_;
}

namespace {
std::chrono::microseconds us(double ms) { return std::chrono::microseconds(static_cast<long long>(ms * 1000)); }
}  // namespace

// One frame of stream `st`, now: a request to each member, into its inbox.
void Clients::arrive(const Stream& st) {
  const auto arrival = Clock::now();
  const auto deadline = st.slo_ms > 0 ? arrival + us(st.slo_ms) : Clock::time_point{};
  size_t frame = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const bool counted = std::chrono::duration<double>(arrival - start_).count() >= warmup_s_;
    if (st.group >= 0) {
      frame = log_->frames[static_cast<size_t>(st.group)].size();
      log_->frames[static_cast<size_t>(st.group)].push_back({static_cast<int>(st.members.size()), true, 0, counted});
    }
    if (counted) {
      for (int i : st.members) ++log_->counted[i];
    }
  }
  for (int i : st.members) {
    Pending p{rt_->submit(i, clone_inputs(inputs_[i]), deadline), arrival, frame};
    {
      std::lock_guard<std::mutex> lk(inbox_[i]->mu);
      inbox_[i]->q.push_back(std::move(p));
      ++log_->sent[i];  // this stream's thread is the only writer
    }
    inbox_[i]->cv.notify_one();
  }
}

// Stream k's thread: frames at its period (each moved by its jitter) until the run ends, then
// its members' inboxes closed.
void Clients::stream(size_t k) {
  release_intra_op_threads(true);  // Note [One OpenMP pool per core]
  c10::InferenceMode guard;
  const Stream& st = streams_[k];
  std::mt19937 rng(1234 + st.members.front() + 1000 * (st.group + 1));
  auto tick = Clock::now();
  while (!done_.load()) {
    const double jitter = st.jitter_ms > 0 ? std::uniform_real_distribution<double>(-st.jitter_ms, st.jitter_ms)(rng) : 0;
    std::this_thread::sleep_until(tick + us(std::max(0.0, jitter)));
    tick += us(st.period_ms);
    if (done_.load()) break;
    arrive(st);
  }
  for (int i : st.members) {
    {
      std::lock_guard<std::mutex> lk(inbox_[i]->mu);
      inbox_[i]->closed = true;
    }
    inbox_[i]->cv.notify_one();
  }
}

// A group member's answer (or its absence) in its frame, under mu_.
void Clients::settle(int group, size_t frame, bool ok, double ms) {
  if (group < 0) return;
  Frame& f = log_->frames[static_cast<size_t>(group)][frame];
  --f.pending;
  f.ok &= ok;
  f.last_ms = std::max(f.last_ms, ms);
}

// Model i's collector: its stream's answers in order.
void Clients::collect(int i) {
  release_intra_op_threads(true);  // Note [One OpenMP pool per core]
  c10::InferenceMode guard;
  Inbox& box = *inbox_[i];
  const int group = s_.models[i].group;
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
    if (done_.load() && p.f.wait_until(grace_end()) != std::future_status::ready) {
      std::lock_guard<std::mutex> lk(mu_);
      ++log_->unanswered[i];
      ended(i, Outcome::kUnanswered, p.arrival);
      settle(group, p.frame, false, 0);
      continue;
    }
    try {
      c10::IValue out = p.f.get();
      const double ms = ms_since(p.arrival);
      record(i, std::move(out), p.arrival, ms);
      std::lock_guard<std::mutex> lk(mu_);
      settle(group, p.frame, true, ms);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(mu_);
      const bool dropped = std::string(e.what()).find(": dropped: ") != std::string::npos;
      if (dropped) ++log_->dropped[i];
      ended(i, dropped ? Outcome::kDropped : Outcome::kFailed, p.arrival);
      settle(group, p.frame, false, 0);
    }
  }
}

// Model i's closed loop: the next request when the last is answered (at rate_hz at most).
void Clients::closed_loop(int i) {
  release_intra_op_threads(true);  // Note [One OpenMP pool per core]
  c10::InferenceMode guard;
  const double period_ms = s_.models[i].rate_hz > 0 ? 1000.0 / s_.models[i].rate_hz : 0;
  auto next = Clock::now();
  while (!done_.load()) {
    if (period_ms > 0) {
      std::this_thread::sleep_until(next);
      next += std::chrono::microseconds(static_cast<long long>(period_ms * 1000));
      if (Clock::now() > next) next = Clock::now();
    }
    if (done_.load()) break;
    auto t0 = Clock::now();
    const auto deadline = s_.models[i].slo_ms > 0
                              ? t0 + std::chrono::microseconds(static_cast<long long>(s_.models[i].slo_ms * 1000))
                              : Clock::time_point{};
    if (std::chrono::duration<double>(t0 - start_).count() >= warmup_s_) {
      std::lock_guard<std::mutex> lk(mu_);
      ++log_->counted[i];
    }
    try {
      c10::IValue out = rt_->submit(i, clone_inputs(inputs_[i]), deadline).get();
      record(i, std::move(out), t0, ms_since(t0));
    } catch (const std::exception& e) {
      if (s_.models[i].slo_ms > 0) {
        std::lock_guard<std::mutex> lk(mu_);
        ended(i, std::string(e.what()).find(": dropped: ") != std::string::npos ? Outcome::kDropped : Outcome::kFailed, t0);
      }
      // Paused (the runtime said why when it paused it) or failed: try again shortly.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

}  // namespace cli
}  // namespace swapnet
