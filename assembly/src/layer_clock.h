// Layer times where a layer's work runs after the call that queued it (a GPU's kernels): marks
// put into the device's queue around each layer, read back once the device has passed them (Note
// [Timing layers on the GPU] in layer_clock.cpp). Internal to the assembly module; the CUDA
// backend's marks are CUDA events (device_backend.cpp), a test's are its own.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace swapnet {

// A point in a device's queue of work: put behind what is queued now, passed once the device
// has done that work. Each throws (std::exception) where the device cannot.
class Mark {
 public:
  virtual ~Mark() = default;
  virtual void put() = 0;
  virtual bool passed() = 0;
  // Returns once the device has passed this mark.
  virtual void wait();
  // Milliseconds from `start` to this mark, both passed.
  virtual double ms_since(Mark& start) = 0;
};

class LayerClock {
 public:
  using MakeMark = std::function<std::unique_ptr<Mark>()>;
  // `wait_most`: how long take(wait) waits for the device to pass a mark before it stops the clock.
  explicit LayerClock(MakeMark make, std::chrono::milliseconds wait_most = std::chrono::seconds(10))
      : make_(std::move(make)), wait_most_(wait_most) {}

  // The calling thread is about to queue layer `layer`'s work / has queued it.
  void began(int layer);
  void ended(int layer);
  // The times of the layers the device has done by now, oldest first, to `f`; all of them,
  // waiting for the device, where `wait`.
  void take(bool wait, const std::function<void(int, double)>& f);
  // Drops the layers not taken (an aborted inference); their marks are used again.
  void forget();
  // Why the clock stopped timing (a device error: said once, the layers go untimed from then
  // on, so no costs are learned); empty while it times.
  const std::string& off() const { return off_; }
  // Marks in flight and spare (for tests: marks are used again, not made per layer).
  std::size_t marks_made() const { return made_; }

 private:
  struct Span {
    int layer = -1;
    std::unique_ptr<Mark> start, end;
  };
  std::unique_ptr<Mark> mark();  // a spare one, or a new one
  void spare(Span& s);
  void stop(const std::string& why);

  MakeMark make_;
  std::chrono::milliseconds wait_most_;
  Span open_;                // began, not yet ended
  std::deque<Span> queued_;  // ended, not yet taken
  std::vector<std::unique_ptr<Mark>> spare_;
  std::size_t made_ = 0;
  std::string off_;
};

}  // namespace swapnet
