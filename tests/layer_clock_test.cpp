// The assembly module's LayerClock alone (Note [Timing layers on the GPU] in layer_clock.cpp),
// with marks of a fake device whose queue the test advances: the CUDA backend's clock runs this
// code with CUDA events, on a GPU only.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "layer_clock.h"
#include "torch_compat.h"

namespace swapnet {
namespace {

// A device that runs its queue in order: a mark put at queue position n is passed once `done`
// reaches n; its time is the device's clock when it was put (the test's `now`). With `advance`,
// every query of a mark not yet passed does one more item (a device working meanwhile).
struct FakeDevice {
  int queued = 0;
  int done = 0;
  double now = 0;
  bool advance = false;
  bool fail_put = false;
  bool fail_time = false;
  int made = 0;
};

class FakeMark final : public Mark {
 public:
  explicit FakeMark(FakeDevice* d) : d_(d) {}
  void put() override {
    if (d_->fail_put) throw std::runtime_error("device lost");
    at_ = ++d_->queued;
    t_ = d_->now;
  }
  bool passed() override {
    if (at_ > d_->done && d_->advance) ++d_->done;
    return at_ <= d_->done;
  }
  double ms_since(Mark& start) override {
    if (d_->fail_time) throw std::runtime_error("events cannot time");
    return t_ - static_cast<FakeMark&>(start).t_;
  }

 private:
  FakeDevice* d_;
  int at_ = 0;
  double t_ = 0;
};

LayerClock clock_on(FakeDevice& d) {
  return LayerClock([&d] {
    ++d.made;
    return std::make_unique<FakeMark>(&d);
  });
}

// Queues layer k taking `ms` on the device.
void run(LayerClock& c, FakeDevice& d, int k, double ms) {
  c.began(k);
  d.now += ms;
  c.ended(k);
}

using Times = std::vector<std::pair<int, double>>;
Times take(LayerClock& c, bool wait) {
  Times t;
  c.take(wait, [&](int k, double ms) { t.emplace_back(k, ms); });
  return t;
}

TEST(LayerClock, TimesComeBackInOrderOnlyOnceTheDevicePassedThem) {
  FakeDevice d;
  LayerClock c = clock_on(d);
  run(c, d, 0, 1.5);
  run(c, d, 1, 0.25);
  run(c, d, 2, 4.0);
  EXPECT_TRUE(take(c, false).empty());  // nothing done yet
  d.done = 4;                           // layer 1's end mark (the 4th) passed, not layer 2's
  EXPECT_EQ(take(c, false), (Times{{0, 1.5}, {1, 0.25}}));
  EXPECT_TRUE(take(c, false).empty());
  d.advance = true;  // the device works on: waiting takes the rest
  EXPECT_EQ(take(c, true), (Times{{2, 4.0}}));
  EXPECT_TRUE(c.off().empty());
}

TEST(LayerClock, MarksAreUsedAgainNotMadePerLayer) {
  FakeDevice d;
  LayerClock c = clock_on(d);
  for (int inference = 0; inference < 20; ++inference) {
    for (int k = 0; k < 50; ++k) {
      run(c, d, k, 1.0);
      d.done = d.queued;
      ASSERT_EQ(take(c, false).size(), 1u);
    }
  }
  EXPECT_EQ(d.made, 2);  // one layer in flight at a time: its two marks
  EXPECT_EQ(c.marks_made(), 2u);
}

TEST(LayerClock, ForgottenLayersAreNeverHandedOut) {
  FakeDevice d;
  LayerClock c = clock_on(d);
  run(c, d, 0, 1.0);
  c.began(1);  // an inference aborted inside layer 1
  c.forget();
  d.done = d.queued;
  EXPECT_TRUE(take(c, true).empty());
  run(c, d, 0, 2.0);  // the next inference, on the same marks
  d.done = d.queued;
  EXPECT_EQ(take(c, true), (Times{{0, 2.0}}));
  EXPECT_EQ(d.made, 3);  // the aborted layer's start mark too
}

TEST(LayerClock, ALayerBegunTwiceCountsFromItsSecondStart) {
  FakeDevice d;
  LayerClock c = clock_on(d);
  c.began(3);  // the layer threw before it ended
  d.now += 7.0;
  run(c, d, 3, 1.0);
  c.ended(4);  // an end without a start is no time
  d.done = d.queued;
  EXPECT_EQ(take(c, true), (Times{{3, 1.0}}));
}

TEST(LayerClock, ADeviceErrorStopsTheClockAndLeavesLayersUntimed) {
  FakeDevice d;
  LayerClock c = clock_on(d);
  run(c, d, 0, 1.0);
  d.fail_put = true;
  run(c, d, 1, 1.0);
  EXPECT_NE(c.off().find("device lost"), std::string::npos) << c.off();
  d.fail_put = false;
  run(c, d, 2, 1.0);  // stopped: not timed even though the device works again
  d.done = d.queued;
  EXPECT_TRUE(take(c, true).empty());  // layer 0's time went with the clock: no partial inference

  FakeDevice d2;
  LayerClock c2 = clock_on(d2);
  run(c2, d2, 0, 1.0);
  d2.fail_time = true;  // a libtorch whose events cannot time
  d2.done = d2.queued;
  EXPECT_TRUE(take(c2, true).empty());
  EXPECT_NE(c2.off().find("cannot time"), std::string::npos) << c2.off();
}

TEST(LayerClock, ADeviceThatNeverPassesAMarkStopsTheWaitNotTheProgram) {
  FakeDevice d;
  LayerClock c([&d] { return std::make_unique<FakeMark>(&d); }, std::chrono::milliseconds(50));
  run(c, d, 0, 1.0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(take(c, true).empty());  // a hung kernel: the device never gets there
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(c.off().find("had not done layer 0"), std::string::npos) << c.off();
}

// A learner that throws is not the device's fault: the clock goes on.
TEST(LayerClock, TheLearnersErrorsAreItsOwn) {
  FakeDevice d;
  LayerClock c = clock_on(d);
  run(c, d, 0, 1.0);
  run(c, d, 1, 2.0);
  d.done = d.queued;
  EXPECT_THROW(c.take(false, [](int, double) { throw std::runtime_error("learner"); }), std::runtime_error);
  EXPECT_TRUE(c.off().empty());
  EXPECT_EQ(take(c, false), (Times{{1, 2.0}}));  // layer 0 was handed over once, not again
}

// compat::event_ms finds elapsedTime by its signature (libtorch 2.x's c10::Event has it, 1.13's
// has not): an event type like each.
struct TimingEvent {
  double t = 0;
  double elapsedTime(const TimingEvent& end) const { return end.t - t; }
};
struct OldEvent {};

TEST(LayerClock, EventsTimeWhereTheirLibtorchCan) {
  static_assert(compat::HasElapsedTime<TimingEvent>::value);
  static_assert(!compat::HasElapsedTime<OldEvent>::value);
  EXPECT_EQ(compat::event_ms(TimingEvent{1.0}, TimingEvent{3.5}), 2.5);
  EXPECT_THROW(compat::event_ms(OldEvent{}, OldEvent{}), std::runtime_error);
}

}  // namespace
}  // namespace swapnet
