// serve's clients (cmd_serve.cpp drives them): a stream per period or group, a collector per
// model with a stream, a closed loop per model without one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "serve.h"
#include "swapnet/scheduler.h"

namespace swapnet {
namespace cli {

// The scenario's clients. Open loop: a stream's frames arrive at its period whatever the state
// of earlier requests, each to every model of the stream (one model, or a group's members); per
// model a collector takes the answers in order. Closed loop (a model with no period): one
// request after the other, or at rate_hz.
class Clients {
 public:
  Clients(Runtime* rt, const ServeSetup& setup, bool check, ServeLog* log)
      : rt_(rt), s_(setup.s), inputs_(setup.inputs), reference_(setup.reference), check_(check),
        warmup_s_(setup.warmup_s), log_(log), inbox_(rt->size()) {}
  void start();
  // Every open-loop model has had `n` arrivals after the warm-up.
  bool enough(int n);
  void stop() {
    done_.store(true);
    for (auto& t : threads_) t.join();
  }

 private:
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
  struct Stream {
    std::vector<int> members;
    double period_ms, jitter_ms, slo_ms;
    int group;
  };

  // An answer `ms` after its arrival (the time taken when it came, not after waiting for mu_).
  void record(int i, c10::IValue out, Clock::time_point arrival, double ms);
  void ended(int i, Outcome::Fate fate, Clock::time_point arrival, double ms = 0);  // under mu_
  Clock::time_point grace_end();
  void arrive(const Stream& st);
  void stream(size_t k);
  void settle(int group, size_t frame, bool ok, double ms);
  void collect(int i);
  void closed_loop(int i);

  Runtime* rt_;
  const Scenario& s_;
  const std::vector<std::vector<c10::IValue>>& inputs_;
  const std::vector<c10::IValue>& reference_;
  const bool check_;
  const double warmup_s_;
  Clock::time_point start_{};
  ServeLog* log_;  // under mu_
  std::mutex mu_;
  std::atomic<bool> done_{false};
  std::mutex grace_mu_;
  Clock::time_point grace_{};
  std::vector<std::unique_ptr<Inbox>> inbox_;  // per model with a stream
  std::vector<Stream> streams_;
  std::vector<std::thread> threads_;
};

}  // namespace cli
}  // namespace swapnet
