// Layer times from marks in a device's queue (layer_clock.h).
#include "layer_clock.h"

#include <chrono>
#include <exception>
#include <optional>
#include <thread>

#include "swapnet/swapcore.h"

namespace swapnet {

// Note [Timing layers on the GPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Plans on the GPU were made with the image's CPU layer times (measured at pack time), 10-100x
// what the GPU takes: the planner saw compute to hide reads behind where there was almost none,
// and no executor on the GPU learned better (Note [Learning the costs in service]: on the CPU a
// layer's time is the time its call takes; a CUDA layer's call returns once its kernels are
// queued). So the CUDA backend times layers where they run: a mark (a CUDA event with timing,
// on the calling thread's current stream) is put before a layer's kernels are queued and one
// after, and the layer's time is the GPU's time between the two. That is its kernels, and the
// gaps where the GPU waited for the thread to queue the next one (a layer of many small kernels
// costs its launches; that is its cost in the pipeline too), not the wait for its block's bytes,
// which comes before the first mark. Work that other threads queue on the same stream between
// the marks (several models on the default stream) is in it, as another model's company is in
// a CPU layer's time: the contention the plan runs in.
//
// The times come back as the GPU passes the marks: after each layer those passed are handed to
// the learner without waiting, and at the inference's end the rest are waited for, so that the
// learner sees every inference whole. That wait is for the GPU's tail of the last block, which
// the caller's first use of the outputs waits for anyway; it happens only where costs are
// learned (ExecutorOptions::learn_after). Marks are used again once read (two per layer in
// flight at most, not two made per layer per inference). A mark that fails (a device error, or
// a libtorch whose events cannot time) stops the clock: said once, and from then on the layers go
// untimed, so the learner sees no whole inference and the plan keeps the costs it has; so does a
// device that has not passed a mark 10 s after the inference ended (a hung kernel: the
// executor's lock is held meanwhile, and a budget change waits for it).
void Mark::wait() {
  while (!passed()) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

void LayerClock::began(int layer) {
  if (!off_.empty()) return;
  if (open_.start) spare(open_);  // began twice (a layer that threw): the first is void
  try {
    open_.layer = layer;
    open_.start = mark();
    open_.start->put();
  } catch (const std::exception& e) {
    stop(e.what());
  }
}

void LayerClock::ended(int layer) {
  if (!off_.empty() || !open_.start || open_.layer != layer) return;
  try {
    open_.end = mark();
    open_.end->put();
    queued_.push_back(std::move(open_));
    open_ = Span{};
  } catch (const std::exception& e) {
    stop(e.what());
  }
}

void LayerClock::take(bool wait, const std::function<void(int, double)>& f) {
  std::optional<std::chrono::steady_clock::time_point> deadline;  // the first wait sets it
  while (!queued_.empty()) {
    int layer = -1;
    double ms = 0;
    try {
      Span& s = queued_.front();
      while (!s.end->passed()) {
        if (!wait) return;
        const auto now = std::chrono::steady_clock::now();
        if (!deadline) deadline = now + wait_most_;
        if (now > *deadline) {
          throw Error("the device had not done layer " + std::to_string(s.layer) + " after " +
                      std::to_string(wait_most_.count()) + " ms");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      ms = s.end->ms_since(*s.start);
      layer = s.layer;
      spare(s);
      queued_.pop_front();
    } catch (const std::exception& e) {
      stop(e.what());
      return;
    }
    f(layer, ms);  // the learner's errors are its own, not the device's
  }
}

void LayerClock::forget() {
  if (open_.start) spare(open_);
  while (!queued_.empty()) {
    spare(queued_.front());
    queued_.pop_front();
  }
}

std::unique_ptr<Mark> LayerClock::mark() {
  if (!spare_.empty()) {
    std::unique_ptr<Mark> m = std::move(spare_.back());
    spare_.pop_back();
    return m;
  }
  std::unique_ptr<Mark> m = make_();
  if (!m) throw Error("no mark to time a layer with");
  ++made_;
  return m;
}

void LayerClock::spare(Span& s) {
  if (s.start) spare_.push_back(std::move(s.start));
  if (s.end) spare_.push_back(std::move(s.end));
  s = Span{};
}

void LayerClock::stop(const std::string& why) {
  off_ = why.empty() ? "unknown error" : why;
  open_ = Span{};
  queued_.clear();
  spare_.clear();
  log_once(LogLevel::kWarn, "layer_clock_off",
           "layer times on the GPU are not measured from now on (" + off_ +
               "): the costs planned with stay, none are learned (Note [Timing layers on the GPU])");
}

}  // namespace swapnet
