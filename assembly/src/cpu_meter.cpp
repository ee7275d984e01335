// The CPU meter: counts libtorch's CPU allocations (activations, inputs, outputs), split by
// account, and keeps the large ones of accounts that ask for it (Note [Activation cache]).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cpu_meter.h"
#include "swapnet/assembly.h"

namespace swapnet {
namespace {

std::atomic<std::uint64_t> g_cpu_current{0};
std::atomic<std::uint64_t> g_cpu_peak{0};

// Accounts (new_cpu_account): per-account counters, never freed, so a tensor that outlives
// whoever charged it still finds its account when it is freed. Account 0 is "none".
struct Account {
  std::atomic<std::uint64_t> current{0};
  std::atomic<std::uint64_t> peak{0};
  // An allocation that would take `current` past a nonzero limit is refused (the allocator
  // throws, as when out of memory) and `refused` set: an inference measuring the activations of
  // a new input (Note [Dynamic shapes]) never runs past the budget.
  std::atomic<std::uint64_t> limit{0};
  std::atomic<bool> refused{false};
};
constexpr int kMaxAccounts = 256;
Account g_accounts[kMaxAccounts];
std::atomic<int> g_next_account{1};
thread_local int t_account = 0;

void raise_peak(std::atomic<std::uint64_t>& peak, std::uint64_t now) {
  std::uint64_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

// Note [Activation cache]
// ~~~~~~~~~~~~~~~~~~~~~~~
// libtorch mallocs and frees every activation at every layer. Served by glibc, four model
// workers (each with its own malloc arena) left 250-430 MB of freed heap resident in
// bench/soak.sh, growing slowly as budgets cycled: memory no budget had (bench/results/
// soak_alloc.md). An account given a cache (set_cpu_account_cache; the Runtime gives each model
// its plan's activation reserve) gets its large allocations (>= kCacheMin, glibc's default mmap
// threshold) from one region of that size, placed best-fit and coalesced when freed: the same
// shapes recur every inference, so the region's pages are touched once and reused, and what the
// model holds for activations is bounded by its reserve, counted, and given back as a whole.
// Chunks of the same size kept apart (a cache of freed chunks) did not do: with the reserve as
// its cap, resnet18 mapped 6 new chunks in every inference, since the sizes a model needs over
// an inference add up to more than its peak. An allocation the region cannot place (full, or
// fragmented) goes to libtorch's allocator, as do small ones and those of threads without a
// cache. A new cap (a pause, a new input's reserve) starts a new region; the old one is unmapped
// once its last chunk is freed (a tensor may outlive its model's inference, or its model).
constexpr std::size_t kHeader = 64;            // bytes before the data (keeps 64-byte alignment)
constexpr std::size_t kCacheMin = 128 << 10;   // allocations this large or larger are cached

struct Region {
  char* base = nullptr;
  std::size_t size = 0;
  std::size_t live = 0;                        // bytes placed
  std::map<std::size_t, std::size_t> holes;    // offset -> length, coalesced
  bool retired = false;

  explicit Region(std::size_t bytes) : size(bytes) { holes.emplace(0, bytes); }
  char* place(std::size_t len) {
    auto best = holes.end();
    for (auto it = holes.begin(); it != holes.end(); ++it) {
      if (it->second >= len && (best == holes.end() || it->second < best->second)) best = it;
    }
    if (best == holes.end()) return nullptr;
    if (base == nullptr) {  // mapped at first use: a cap costs nothing until the model runs
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      base = static_cast<char*>(p);
    }
    const std::size_t off = best->first;
    const std::size_t rest = best->second - len;
    holes.erase(best);
    if (rest > 0) holes.emplace(off + len, rest);
    live += len;
    return base + off;
  }
  void give_back(char* p, std::size_t len) {
    std::size_t off = static_cast<std::size_t>(p - base);
    live -= len;
    auto next = holes.lower_bound(off);
    if (next != holes.end() && off + len == next->first) {
      len += next->second;
      next = holes.erase(next);
    }
    if (next != holes.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += len;
        return;
      }
    }
    holes.emplace(off, len);
  }
  ~Region() {
    if (base) ::munmap(base, size);
  }
};

struct Cache {
  std::mutex mu;
  std::unique_ptr<Region> region;  // none: no cache
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t retired_live = 0;  // bytes still placed in retired regions
};
Cache g_caches[kMaxAccounts];

// Each allocation carries its size, account and, when placed in a region, that region and its
// length in the header, so the raw deleter (used by oneDNN through raw_allocate) can count and
// place frees, on whichever thread they happen.
struct Header {
  std::uint64_t bytes;
  std::int32_t account;
  std::uint32_t pad;
  Region* region;
  std::uint64_t len;
};
static_assert(sizeof(Header) <= kHeader, "the header fits before the data");

char* cache_allocate(Header& h) {
  Cache& c = g_caches[h.account];
  const std::size_t len = (h.bytes + kHeader + 63) / 64 * 64;
  std::lock_guard<std::mutex> lk(c.mu);
  if (!c.region) return nullptr;
  char* p = c.region->place(len);
  if (p == nullptr) {
    ++c.misses;
    return nullptr;
  }
  ++c.hits;
  h.region = c.region.get();
  h.len = len;
  return p;
}

void cache_free(const Header& h, char* p) {
  Cache& c = g_caches[h.account];
  std::unique_ptr<Region> dead;
  std::lock_guard<std::mutex> lk(c.mu);
  h.region->give_back(p, h.len);
  if (h.region->retired) {
    c.retired_live -= h.len;
    if (h.region->live == 0) dead.reset(h.region);  // unmapped after the lock is dropped
  }
}

void meter_free(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  Header h;
  std::memcpy(&h, base, sizeof h);
  g_cpu_current.fetch_sub(h.bytes);
  if (h.account > 0) g_accounts[h.account].current.fetch_sub(h.bytes);
  if (h.region != nullptr) {
    cache_free(h, base);
  } else {
    c10::free_cpu(base);
  }
}

class MeterAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) const override {
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &meter_free, c10::Device(c10::DeviceType::CPU));
    const std::int32_t account = t_account;
    if (account > 0) {
      Account& a = g_accounts[account];
      const std::uint64_t now = a.current.fetch_add(n) + n;
      const std::uint64_t limit = a.limit.load();
      if (limit > 0 && now > limit) {
        a.current.fetch_sub(n);
        a.refused.store(true);
        TORCH_CHECK(false, "swapnet: an allocation of ", n, " bytes would take this inference's activations to ", now,
                    " bytes, past the ", limit, " its budget leaves them");
      }
      raise_peak(a.peak, now);
    }
    Header h{n, account, 0, nullptr, 0};
    char* base = nullptr;
    if (account > 0 && n + kHeader >= kCacheMin) base = cache_allocate(h);
    if (base == nullptr) {
      try {
        base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
      } catch (...) {
        if (account > 0) g_accounts[account].current.fetch_sub(n);
        throw;
      }
    }
    std::memcpy(base, &h, sizeof h);
    raise_peak(g_cpu_peak, g_cpu_current.fetch_add(n) + n);
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &meter_free, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &meter_free; }
};

}  // namespace

void install_cpu_meter() {
  static std::once_flag once;
  std::call_once(once, [] {
    static MeterAllocator meter;
    c10::SetCPUAllocator(&meter, /*priority=*/1);
  });
}

CpuMeterStats cpu_meter() { return CpuMeterStats{g_cpu_current.load(), g_cpu_peak.load()}; }
void reset_cpu_meter_peak() { g_cpu_peak.store(g_cpu_current.load()); }

int new_cpu_account() {
  int a = g_next_account.fetch_add(1);
  if (a >= kMaxAccounts) {
    g_next_account.store(kMaxAccounts);
    return 0;
  }
  return a;
}
int set_thread_cpu_account(int account) {
  const int before = t_account;
  t_account = account > 0 && account < kMaxAccounts ? account : 0;
  return before;
}
CpuMeterStats cpu_account(int account) {
  if (account <= 0 || account >= kMaxAccounts) return {};
  return CpuMeterStats{g_accounts[account].current.load(), g_accounts[account].peak.load()};
}
void reset_cpu_account_peak(int account) {
  if (account <= 0 || account >= kMaxAccounts) return;
  g_accounts[account].peak.store(g_accounts[account].current.load());
}


void set_cpu_account_cache(int account, std::uint64_t cap) {
  if (account <= 0 || account >= kMaxAccounts) return;
  Cache& c = g_caches[account];
  std::unique_ptr<Region> old;
  {
    std::lock_guard<std::mutex> lk(c.mu);
    if (c.region && c.region->size == cap) return;
    old = std::move(c.region);
    if (cap > 0) c.region = std::make_unique<Region>(cap);
    if (old && old->live > 0) {  // owned by its last chunk from now on (cache_free)
      old->retired = true;
      c.retired_live += old->live;
      old.release();
    }
  }
}

ActivationCacheStats cpu_account_cache(int account) {
  ActivationCacheStats s;
  if (account >= kMaxAccounts) return s;
  const int lo = account > 0 ? account : 1;
  const int hi = account > 0 ? account + 1 : kMaxAccounts;
  for (int a = lo; a < hi; ++a) {
    Cache& c = g_caches[a];
    std::lock_guard<std::mutex> lk(c.mu);
    if (c.region) {
      s.cap += c.region->size;
      s.live_bytes += c.region->live;
      if (c.region->base) s.mapped_bytes += c.region->size;
    }
    s.live_bytes += c.retired_live;
    s.hits += c.hits;
    s.misses += c.misses;
  }
  return s;
}

namespace detail {
void set_cpu_account_limit(int account, std::uint64_t limit) {
  if (account <= 0 || account >= kMaxAccounts) return;
  g_accounts[account].refused.store(false);
  g_accounts[account].limit.store(limit);
}
bool cpu_account_refused(int account) {
  return account > 0 && account < kMaxAccounts && g_accounts[account].refused.load();
}
int thread_cpu_account() { return t_account; }
AccountScope::AccountScope(int account) : on_(account > 0 && account != t_account), before_(t_account) {
  if (on_) t_account = account;
}
AccountScope::~AccountScope() {
  if (on_) t_account = before_;
}
}  // namespace detail

}  // namespace swapnet
