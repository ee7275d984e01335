// The CPU meter and its activation regions (Note [Activation cache], assembly/src/cpu_meter.cpp)
// under threads, as the Runtime uses them: a worker per model allocating and freeing through
// libtorch's CPU allocator under its own account, tensors freed on other threads than the one
// that allocated them, and caps changed and stats read from a control thread meanwhile. Built
// from cpu_meter.cpp and libc10 alone, with -fsanitize=thread (tsan_cpu_meter.sh), in every run.
// Each allocation is stamped with its own byte (every 4 KiB) and checked before it is freed, so
// two placements that overlap fail here even where no race is reported.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "swapnet/assembly.h"
#include "test_util.h"

namespace swapnet {
namespace {

struct Held {
  c10::DataPtr ptr;
  std::size_t bytes;
  unsigned char fill;
};

// Its fill byte where intact() looks: every 4 KiB and the last byte (a memset of every byte was
// two thirds of this test's CPU under TSan, and an overlap of two placements shows in either).
void stamp(const Held& h) {
  auto* p = static_cast<unsigned char*>(h.ptr.get());
  for (std::size_t i = 0; i < h.bytes; i += 4096) p[i] = h.fill;
  p[h.bytes - 1] = h.fill;
}

bool intact(const Held& h) {
  const auto* p = static_cast<const unsigned char*>(h.ptr.get());
  for (std::size_t i = 0; i < h.bytes; i += 4096) {
    if (p[i] != h.fill) return false;
  }
  return p[h.bytes - 1] == h.fill;
}

// Frees what the workers hand it, on its own thread.
class Freer {
 public:
  Freer() : thread_([this] { loop(); }) {}
  ~Freer() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(Held h) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(h));
    }
    cv_.notify_one();
  }
  int corrupt() const { return corrupt_.load(); }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [this] { return done_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Held h = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      if (!intact(h)) corrupt_.fetch_add(1);
      h.ptr.clear();  // the free, on this thread
      lk.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Held> queue_;
  bool done_ = false;
  std::atomic<int> corrupt_{0};
  std::thread thread_;
};

TEST(CpuMeterThreads, RegionsStayWholeUnderWorkersCrossThreadFreesAndCapChanges) {
  install_cpu_meter();
  c10::Allocator* alloc = c10::GetCPUAllocator();
  constexpr int kWorkers = 3;
  // 400 allocations per worker (1,500 in a long run, Note [Long test runs] in test_util.h): with
  // the cap moving every 200 us, each worker's allocations meet hundreds of cap changes and
  // cross-thread frees either way; under TSan the 1,500 took a minute of this test's 73 s.
  const int kIters = test_util::sized(400, 1500);
  constexpr std::uint64_t kMiB = 1 << 20;
  std::vector<int> accounts;
  for (int w = 0; w < kWorkers; ++w) {
    accounts.push_back(new_cpu_account());
    ASSERT_GT(accounts.back(), 0);
    set_cpu_account_cache(accounts.back(), 8 * kMiB);
  }
  Freer freer;
  std::atomic<int> corrupt{0};
  std::atomic<bool> stop{false};

  // Control: moves every account's cap (0 included: a paused model) and reads the stats.
  std::thread control([&] {
    std::mt19937 rng(7);
    std::uint64_t seen = 0;
    while (!stop.load()) {
      const int a = accounts[rng() % kWorkers];
      const int pick = static_cast<int>(rng() % 5);
      set_cpu_account_cache(a, pick == 0 ? 0 : static_cast<std::uint64_t>(2 + 3 * pick) * kMiB);
      seen += cpu_account_cache(0).hits + cpu_account(a).current;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    EXPECT_GT(seen, 0u);
  });

  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      set_thread_cpu_account(accounts[w]);
      std::mt19937 rng(100 + w);
      std::deque<Held> live;
      for (int i = 0; i < kIters; ++i) {
        // Mostly activation-sized (placed in the region when it has room), some small (never).
        const std::size_t bytes = rng() % 4 == 0 ? 1024 + rng() % 8192 : (128 << 10) + rng() % (1536 << 10);
        Held h{alloc->allocate(bytes), bytes, static_cast<unsigned char>(1 + rng() % 255)};
        stamp(h);
        live.push_back(std::move(h));
        if (live.size() > 6 || rng() % 3 == 0) {
          Held old = std::move(live.front());
          live.pop_front();
          if (rng() % 2 == 0) {
            freer.push(std::move(old));  // freed on another thread
          } else {
            if (!intact(old)) corrupt.fetch_add(1);
            old.ptr.clear();
          }
        }
      }
      for (Held& h : live) {
        if (!intact(h)) corrupt.fetch_add(1);
        h.ptr.clear();
      }
      set_thread_cpu_account(0);
    });
  }
  for (auto& t : workers) t.join();
  stop.store(true);
  control.join();
  // Let the freer drain: a cap of 0 then unmaps every region once its last chunk is back.
  for (int spin = 0; spin < 2000; ++spin) {
    std::uint64_t charged = 0;
    for (int a : accounts) charged += cpu_account(a).current;
    if (charged == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(corrupt.load() + freer.corrupt(), 0) << "an allocation's bytes were overwritten by another's";
  std::uint64_t hits = 0;
  for (int a : accounts) {
    EXPECT_EQ(cpu_account(a).current, 0u) << "account " << a;
    const ActivationCacheStats s = cpu_account_cache(a);
    EXPECT_EQ(s.live_bytes, 0u) << "account " << a << ": bytes still placed after every free";
    hits += s.hits;
    set_cpu_account_cache(a, 0);
    EXPECT_EQ(cpu_account_cache(a).cap, 0u);
  }
  EXPECT_GT(hits, static_cast<std::uint64_t>(kWorkers * kIters / 4)) << "the regions placed too little to test them";
}

}  // namespace
}  // namespace swapnet
