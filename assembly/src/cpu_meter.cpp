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
#define SWAPNET_TORCH_COMPAT_ALLOCATOR_ONLY
#include "torch_compat.h"
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
  // Bytes not placed in a zone (Note [Lending the activation reserve] in zone_lender.cpp), now and
  // the most since the zone's last reset: they share the reserve with the zone's chunks.
  std::atomic<std::uint64_t> unzoned{0};
  std::atomic<std::uint64_t> unzoned_peak{0};
  // Its zone's bytes lent to blocks now, and the most of current + those at once.
  std::atomic<std::uint64_t> lent{0};
  std::atomic<std::uint64_t> peak_with_lent{0};
};
constexpr int kMaxAccounts = 256;
Account g_accounts[kMaxAccounts];
std::atomic<int> g_next_account{1};
// Accounts given back (detail::release_cpu_account) with nothing charged to them.
std::mutex g_free_accounts_mu;
std::vector<int> g_free_accounts;
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
  // A zone (Note [Lending the activation reserve] in zone_lender.cpp): a ring's memory, kept mapped
  // by `owner` while chunks live in it; the ring lends the bytes below `floor` to blocks.
  std::shared_ptr<void> owner;
  std::uint64_t id = 0;
  std::size_t floor = 0;    // nothing is placed below it
  std::size_t prefer = 0;   // placed at or above it when a hole there fits
  std::size_t low = 0;      // the lowest offset live since the last reset
  std::uint64_t lent = 0;   // bytes the ring lends blocks now
  std::uint64_t peak = 0;   // the most live + lent since the last reset
  std::uint64_t misses = 0; // allocations that did not fit above the floor

  // Whole 64-byte units (chunks are placed from the top: their offsets stay aligned).
  explicit Region(std::size_t bytes) : size(bytes / 64 * 64), low(size) { holes.emplace(0, size); }
  Region(char* at, std::size_t bytes, std::shared_ptr<void> keep, std::uint64_t zone)
      : base(at), size(bytes / 64 * 64), owner(std::move(keep)), id(zone), low(size) {
    holes.emplace(0, size);
  }
  // The lowest offset a chunk holds (size when none).
  std::size_t lowest_live() const {
    if (holes.empty()) return 0;
    return holes.begin()->first == 0 ? holes.begin()->second : 0;
  }
  // Best fit among the holes that hold `len` at or above `at`, placed at the hole's top: the
  // chunks pack against the region's end, so a zone's low bytes stay free for the ring. The
  // bottom hole (from offset 0 to the lowest chunk) is taken only where no other hole fits: so
  // the chunks land at the same distances from the end in a zone of any size they fit in, and a
  // zone as large as the extent measured at pack (measure_activation_bytes, in a zone of
  // unbounded size) places them all (best fit counting the bottom hole by its length put a
  // chunk low in a small zone, where it had gone into a hole above in a large one: resnet101's
  // zone refused two chunks every inference at 10.0 and 11.2 of its 11.8 MiB).
  char* place(std::size_t len) {
    auto pick = [&](std::size_t at) {
      auto best = holes.end();
      for (auto it = holes.begin(); it != holes.end(); ++it) {
        if (it->first == 0) continue;  // the bottom hole, below
        if (it->second >= len && it->first + it->second - len >= at &&
            (best == holes.end() || it->second < best->second)) {
          best = it;
        }
      }
      if (best == holes.end() && !holes.empty()) {
        auto bottom = holes.begin();
        if (bottom->first == 0 && bottom->second >= len && bottom->second - len >= at) best = bottom;
      }
      return best;
    };
    auto best = pick(std::max(prefer, floor));
    if (best == holes.end() && prefer > floor) best = pick(floor);
    if (best == holes.end()) {
      ++misses;
      return nullptr;
    }
    if (base == nullptr) {  // mapped at first use: a cap costs nothing until the model runs
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      base = static_cast<char*>(p);
    }
    const std::size_t hole = best->first;
    const std::size_t off = best->first + best->second - len;
    holes.erase(best);
    if (off > hole) holes.emplace(hole, off - hole);
    live += len;
    low = std::min(low, off);
    peak = std::max<std::uint64_t>(peak, live + lent);
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
  // The pages of a zone's holes go back now (its ring is going: nothing is lent or read there).
  void give_holes_back() {
    if (!owner || base == nullptr) return;
    constexpr std::size_t kPage = 4096;
    for (const auto& [off, len] : holes) {
      const std::uintptr_t a = (reinterpret_cast<std::uintptr_t>(base + off) + kPage - 1) / kPage * kPage;
      const std::uintptr_t e = reinterpret_cast<std::uintptr_t>(base + off + len) / kPage * kPage;
      if (e > a) (void)::madvise(reinterpret_cast<void*>(a), e - a, MADV_DONTNEED);  // advisory
    }
  }
  ~Region() {
    if (base && !owner) ::munmap(base, size);
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
constexpr std::uint32_t kZoned = 1;  // Header::pad: placed in a ring's zone
// Zone bytes lent to blocks now (all zones), and the most of allocations + those at once.
std::atomic<std::uint64_t> g_cpu_lent{0};
std::atomic<std::uint64_t> g_cpu_peak_with_lent{0};

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
  if (c.region->owner) h.pad |= kZoned;
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
  if (h.account > 0) {
    g_accounts[h.account].current.fetch_sub(h.bytes);
    if (!(h.pad & kZoned)) g_accounts[h.account].unzoned.fetch_sub(h.bytes);
  }
  if (h.region != nullptr) {
    cache_free(h, base);
  } else {
    c10::free_cpu(base);
  }
}

class MeterAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) SWAPNET_ALLOCATE_CONST override {
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
      raise_peak(a.peak_with_lent, now + a.lent.load());
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
    if (account > 0 && !(h.pad & kZoned)) {
      Account& a = g_accounts[account];
      raise_peak(a.unzoned_peak, a.unzoned.fetch_add(n) + n);
    }
    const std::uint64_t now = g_cpu_current.fetch_add(n) + n;
    raise_peak(g_cpu_peak, now);
    raise_peak(g_cpu_peak_with_lent, now + g_cpu_lent.load());
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &meter_free, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &meter_free; }
  SWAPNET_ALLOCATOR_COPY_DATA
};

}  // namespace

namespace {
MeterAllocator& meter_allocator() {
  static MeterAllocator meter;
  return meter;
}
}  // namespace

void install_cpu_meter() {
  static std::once_flag once;
  std::call_once(once, [] { c10::SetCPUAllocator(&meter_allocator(), /*priority=*/1); });
}

CpuMeterStats cpu_meter() {
  return CpuMeterStats{g_cpu_current.load(), g_cpu_peak.load(), g_cpu_lent.load(), g_cpu_peak_with_lent.load()};
}
void reset_cpu_meter_peak() {
  g_cpu_peak.store(g_cpu_current.load());
  g_cpu_peak_with_lent.store(g_cpu_current.load() + g_cpu_lent.load());
}

int new_cpu_account() {
  {
    std::lock_guard<std::mutex> lk(g_free_accounts_mu);
    if (!g_free_accounts.empty()) {
      const int a = g_free_accounts.back();
      g_free_accounts.pop_back();
      return a;
    }
  }
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
  const Account& a = g_accounts[account];
  return CpuMeterStats{a.current.load(), a.peak.load(), a.lent.load(), a.peak_with_lent.load()};
}
void reset_cpu_account_peak(int account) {
  if (account <= 0 || account >= kMaxAccounts) return;
  g_accounts[account].peak.store(g_accounts[account].current.load());
  g_accounts[account].peak_with_lent.store(g_accounts[account].current.load() + g_accounts[account].lent.load());
}


namespace {
// Replaces the account's region (c.mu held); the old one goes with its last chunk (cache_free),
// or now (returned, to be freed after the lock is dropped).
std::unique_ptr<Region> replace_region(Cache& c, std::unique_ptr<Region> region) {
  std::unique_ptr<Region> old = std::move(c.region);
  c.region = std::move(region);
  if (old) {  // a zone detached lends nothing any more
    g_cpu_lent.fetch_sub(old->lent);
    g_accounts[&c - g_caches].lent.fetch_sub(old->lent);
    old->lent = 0;
  }
  if (old && old->live > 0) {  // owned by its last chunk from now on (cache_free)
    // A zone's holes keep their pages: the ring may still hold blocks there (lent bytes are
    // holes here), and may be reading into them. The executor gives them back itself, when
    // its ring goes (detail::cpu_zone_give_back).
    old->retired = true;
    c.retired_live += old->live;
    old.release();
  }
  return old;
}
std::atomic<std::uint64_t> g_next_zone{1};
}  // namespace

void set_cpu_account_cache(int account, std::uint64_t cap) {
  if (account <= 0 || account >= kMaxAccounts) return;
  Cache& c = g_caches[account];
  std::unique_ptr<Region> old;
  {
    std::lock_guard<std::mutex> lk(c.mu);
    // A ring's zone is the model's activation cache already (Note [Lending the activation
    // reserve] in zone_lender.cpp): it stays until the cache is turned off.
    if (c.region && (c.region->size == cap || (c.region->owner && cap > 0))) return;
    old = replace_region(c, cap > 0 ? std::make_unique<Region>(cap) : nullptr);
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
bool cpu_meter_active() {
  install_cpu_meter();
  return c10::GetCPUAllocator() == &meter_allocator();
}
std::uint64_t set_cpu_account_zone(int account, char* base, std::uint64_t bytes, std::shared_ptr<void> owner) {
  if (account <= 0 || account >= kMaxAccounts || base == nullptr || bytes == 0) return 0;
  Cache& c = g_caches[account];
  const std::uint64_t id = g_next_zone.fetch_add(1);
  std::unique_ptr<Region> old;
  {
    std::lock_guard<std::mutex> lk(c.mu);
    old = replace_region(c, std::make_unique<Region>(base, bytes, std::move(owner), id));
  }
  return id;
}
std::uint64_t set_cpu_account_scratch_zone(int account, std::uint64_t bytes, char** base) {
  *base = nullptr;
  if (account <= 0 || account >= kMaxAccounts || bytes == 0) return 0;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return 0;
  std::shared_ptr<void> owner(p, [bytes](void* q) { ::munmap(q, bytes); });
  const std::uint64_t id = set_cpu_account_zone(account, static_cast<char*>(p), bytes, std::move(owner));
  if (id != 0) *base = static_cast<char*>(p);
  return id;
}
std::uint64_t zone_reach(const ZoneUse& u, std::uint64_t unzoned_before) {
  if (!u.attached) return 0;
  return u.low_extent + (u.unzoned_peak > unzoned_before ? u.unzoned_peak - unzoned_before : 0);
}
void set_cpu_zone(int account, std::uint64_t id, std::uint64_t floor, std::uint64_t prefer, std::uint64_t lent) {
  if (account <= 0 || account >= kMaxAccounts) return;
  Cache& c = g_caches[account];
  std::lock_guard<std::mutex> lk(c.mu);
  Region* r = c.region.get();
  if (r == nullptr || r->id != id || id == 0) return;
  r->floor = std::min<std::size_t>(floor, r->size);
  r->prefer = std::min<std::size_t>(prefer, r->size);
  const std::uint64_t all = g_cpu_lent.fetch_add(lent - r->lent) + (lent - r->lent);  // wraps back when smaller
  Account& a = g_accounts[account];
  const std::uint64_t mine = a.lent.fetch_add(lent - r->lent) + (lent - r->lent);
  raise_peak(a.peak_with_lent, a.current.load() + mine);
  r->lent = lent;
  r->peak = std::max<std::uint64_t>(r->peak, r->live + lent);
  raise_peak(g_cpu_peak_with_lent, g_cpu_current.load() + all);
}
void cpu_zone_give_back(int account, std::uint64_t id) {
  if (account <= 0 || account >= kMaxAccounts) return;
  Cache& c = g_caches[account];
  std::lock_guard<std::mutex> lk(c.mu);
  if (c.region && c.region->id == id && id != 0) c.region->give_holes_back();
}
void release_cpu_account(int account) {
  if (account <= 0 || account >= kMaxAccounts) return;
  Account& a = g_accounts[account];
  Cache& c = g_caches[account];
  {
    std::lock_guard<std::mutex> lk(c.mu);
    // A tensor still charged to it, or a region: kept (a free must find its account).
    if (a.current.load() != 0 || c.region || c.retired_live != 0) return;
    c.hits = c.misses = 0;
  }
  a.peak.store(0);
  a.limit.store(0);
  a.refused.store(false);
  a.unzoned_peak.store(0);
  a.peak_with_lent.store(0);
  std::lock_guard<std::mutex> lk(g_free_accounts_mu);
  g_free_accounts.push_back(account);
}
ZoneUse cpu_zone_use(int account, std::uint64_t id, bool reset) {
  ZoneUse u;
  if (account <= 0 || account >= kMaxAccounts) return u;
  Cache& c = g_caches[account];
  std::lock_guard<std::mutex> lk(c.mu);
  u.retired_live = c.retired_live;
  Account& a = g_accounts[account];
  u.unzoned = a.unzoned.load();
  u.unzoned_peak = a.unzoned_peak.load();
  if (reset) a.unzoned_peak.store(u.unzoned);
  Region* r = c.region.get();
  if (r == nullptr || r->id != id || id == 0) return u;
  u.attached = true;
  const std::size_t lowest = r->lowest_live();
  u.extent = r->size - lowest;
  u.low_extent = r->size - std::min(r->low, lowest);
  u.misses = r->misses;
  u.peak = r->peak;
  if (reset) {
    r->low = lowest;
    r->peak = r->live + r->lent;
  }
  return u;
}
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
