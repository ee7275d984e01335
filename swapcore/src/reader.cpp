// The block reader: moves byte ranges of an image into caller buffers at the disk's speed,
// without leaving a copy in the page cache.
//
// Policies:
//  - Backends are probed once at open, in order io_uring+O_DIRECT, pread+O_DIRECT, buffered
//    pread + POSIX_FADV_DONTNEED; a fallback is said once per process in the log.
//  - One background thread ("swapnet-io") drives all reads of a reader. Requests of consecutive
//    submits are pipelined, so the queue stays full across block boundaries.
//  - Every completion, whatever the backend, goes through complete(): EINTR and EAGAIN retry,
//    a short read continues where it stopped, end of file and errors fail that read with a
//    message naming path, offset, length and errno. The test hook `fault` rewrites results
//    right before complete() sees them.
//  - Checksums (optional per submit) are verified on the I/O thread once a read has landed.
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <algorithm>
#include <thread>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace {

constexpr int kMaxRetries = 1000;  // EINTR / EAGAIN on one request before giving up

std::string u64s(std::uint64_t v) { return std::to_string(v); }
std::int64_t mtime_ns(const struct stat& st) { return std::int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }

bool aligned(std::uint64_t v) { return v % kImageAlign == 0; }

}  // namespace

const char* to_string(IoBackend b) {
  switch (b) {
    case IoBackend::kIoUring: return "io_uring";
    case IoBackend::kPreadDirect: return "pread_direct";
    default: return "buffered";
  }
}

void* alloc_aligned(std::size_t bytes, std::size_t alignment) {
  void* p = nullptr;
  if (bytes == 0) bytes = alignment;
  if (::posix_memalign(&p, alignment, (bytes + alignment - 1) / alignment * alignment) != 0) return nullptr;
  return p;
}
void free_aligned(void* p) { std::free(p); }

Status page_cache_bytes(const std::string& path, std::uint64_t* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(errno, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  *out = 0;
  if (st.st_size == 0) {
    ::close(fd);
    return Status();
  }
  void* m = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return Status::error(errno, path + ": mmap for mincore: " + std::strerror(errno));
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> vec((static_cast<std::size_t>(st.st_size) + page - 1) / page);
  Status s;
  if (::mincore(m, static_cast<std::size_t>(st.st_size), vec.data()) != 0) {
    s = Status::error(errno, path + ": mincore: " + std::strerror(errno));
  } else {
    for (unsigned char v : vec) *out += (v & 1) ? static_cast<std::uint64_t>(page) : 0;
  }
  ::munmap(m, static_cast<std::size_t>(st.st_size));
  return s;
}

// ---- one disk, several readers ----------------------------------------------------------

// Note [One disk, read by urgency]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The models a Runtime serves read one disk. Each executor reads ahead on its own and each
// reader keeps queue_depth requests in flight, so the kernel (and a throttled cgroup's queue)
// serves the models' reads interleaved in the order they came: the block a request near its
// deadline waits for shares the disk with another model's read-ahead for a frame that has not
// even arrived. Hetero²Pipe orders the stages that contend for a shared resource; here we order
// the reads. A reader of a SharedDisk issues a request only while no more urgent reader (a
// lower priority; equals share) has one to issue; the Runtime sets the priorities from its
// policy's order (Note [The disk as a scheduled resource] in dispatch.cpp). A reader held back
// sleeps until a more urgent one goes idle, a priority changes or, with a cap, a request ends
// (woken; within 1-2 ms if the wake-up raced with its going to sleep). Requests already in flight are never recalled, so a
// reader that becomes the most urgent still finds up to a queue depth of each other reader's
// requests ahead of it. `pieces` > 0 also caps the requests in flight from all readers
// together, which makes that queue shorter: with one queue depth (32 x 256 KiB) four models on
// a disk throttled to 400 MB/s met 46 % fewer deadlines (docs/scheduler.md), so the Runtime
// sets no cap.
struct SharedDisk::State {
  struct Member {
    double priority = 0;
    bool wants = false;  // has a piece to issue (asked, and has not said it is idle since)
    std::function<void()> wake;
  };
  mutable std::mutex mu;
  unsigned cap = 0;  // 0: none
  unsigned in_flight = 0;
  std::map<int, Member> members;
  int next_id = 1;
  std::uint64_t granted = 0, deferred = 0;

  // Wakes are called under mu: a reader leaving (under mu) then knows none is running into it.
  void wake_wanting_locked(int except) {
    for (auto& [id, m] : members) {
      if (id != except && m.wants && m.wake) m.wake();
    }
  }
  int join(std::function<void()> wake) {
    std::lock_guard<std::mutex> lock(mu);
    const int id = next_id++;
    members[id].wake = std::move(wake);
    return id;
  }
  void leave(int id) {
    std::lock_guard<std::mutex> lock(mu);
    members.erase(id);
    wake_wanting_locked(id);
  }
  void set_priority(int id, double p) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = members.find(id);
    if (it == members.end() || it->second.priority == p) return;
    it->second.priority = p;
    wake_wanting_locked(0);
  }
  double priority(int id) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = members.find(id);
    return it == members.end() ? 0.0 : it->second.priority;
  }
  // A reader with a piece to issue asks for a slot on the disk.
  bool acquire(int id) {
    std::lock_guard<std::mutex> lock(mu);
    Member& me = members[id];
    me.wants = true;
    if (cap > 0 && in_flight >= cap) return false;
    for (const auto& [other, m] : members) {
      if (other != id && m.wants && m.priority < me.priority) {
        ++deferred;
        return false;
      }
    }
    ++in_flight;
    ++granted;
    return true;
  }
  // A reader has nothing (more) to issue: it no longer holds others back.
  void idle(int id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = members.find(id);
    if (it == members.end() || !it->second.wants) return;
    it->second.wants = false;
    wake_wanting_locked(id);
  }
  // Requests ended. Without a cap nobody waits for a slot (only for more urgent readers to go
  // idle), so nobody is woken: this runs once per completed request.
  void release(unsigned n) {
    if (n == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    in_flight -= std::min(n, in_flight);
    if (cap > 0) wake_wanting_locked(0);
  }
};

SharedDisk::SharedDisk(unsigned pieces) : state_(std::make_unique<State>()) {
  state_->cap = pieces;
}
SharedDisk::~SharedDisk() = default;
unsigned SharedDisk::pieces() const { return state_->cap; }
SharedDisk::Stats SharedDisk::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return Stats{state_->granted, state_->deferred};
}

// ---- the reader -------------------------------------------------------------------------

// Note [Earliest block first]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Requests are handed out from the job with the lowest `order` submit() was given, then the
// oldest; by default every job has order 0, so reads are served in the order submitted. The
// executor gives each read the position of its block in the read order: a streamed block's
// pieces are submitted one by one as older blocks free their bytes, after blocks pushed past it
// (Note [Streaming into the ring] in allocator/src/ring.cpp), and in submission order each freed
// piece waited for those whole blocks while the computation waited for it. Served by order, a
// freed piece waits only for the requests already in the kernel (up to a queue depth), and the
// later blocks are read while the streamed block's pieces wait for room: the disk stays as busy,
// and the bytes needed first land first.
//
// Note [An emulated disk]
// ~~~~~~~~~~~~~~~~~~~~~~~
// bench/throttle.sh's blkio throttle grants a slice of bytes at once after a group idled, so a
// pipeline that leaves the disk idle gets part of that time back as a burst: the throttled
// disk read 440-620 MB/s while busy at a 400 MB/s setting, and hid idle gaps a real disk would
// charge for. ReaderOptions::emulate_bytes_per_s models a disk of one rate instead: one per
// process (shared by its readers), serving each request's bytes after those before it (from
// the time the read was submitted), holding the completion until then. Nothing accrues while it
// idles.
//
// Note [A sustained read rate]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// That burst also misleads whatever learns the disk's rate from its reads (bytes landed / time
// busy; Note [Learning the costs in service] in executor.cpp): resnet101 under the throttle at
// 400 MB/s learned 533 MB/s from a window whose reads had started again after a 58 ms pause
// (1015 MB/s in the 50 ms after it), re-planned for that disk, and learned 426 MB/s a window
// later; a plan kept from such a window (Note [Learned costs kept]) was made for a disk faster
// than the one it runs on. The throttle grants at most its slice (0.1 s) of idle time, as bytes
// served at once when reads come again, so BlockReader::sustained() counts neither the bytes
// that land nor the time that passes in the first min(gap, 0.1 s) of each busy period, gap
// being the idle time before it (the first busy period: 0.1 s). Whatever the credit was, it was
// served in that time: its bytes came at host speed, faster than the gap's length at the
// throttled rate. A busy period that begins within that time (the pread path is busy a request
// at a time) is in the same burst. On a disk that grants no credit (a real one, the emulated one
// without emulate_idle_credit_s) the samples left are as fast as the rest, and the rate is the
// same from fewer of them; a pipeline whose disk idles between short reads leaves few samples,
// and there the rate matters little to its plan. Tested with emulate_idle_credit_s, a token bucket as the
// throttle's (SustainedRate.LeavesOutTheBurstAfterIdling in image_test).
constexpr std::chrono::steady_clock::duration kBurstCredit = std::chrono::milliseconds(100);

namespace {
std::mutex g_emulated_mu;
std::chrono::steady_clock::time_point g_emulated_free;  // when the emulated disk is next idle
// A read of `bytes` queued at `queued` is served when this returns. With `credit` seconds, the
// disk also serves at once what it could have in the time it idled before, up to that long: a
// token bucket, as blkio's throttle slice (ReaderOptions::emulate_idle_credit_s).
std::chrono::steady_clock::time_point emulated_disk_serves(std::chrono::steady_clock::time_point queued,
                                                           std::uint64_t bytes, double rate, double credit = 0) {
  std::lock_guard<std::mutex> lk(g_emulated_mu);
  const auto start = std::max(g_emulated_free, queued - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                 std::chrono::duration<double>(credit)));
  g_emulated_free = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(static_cast<double>(bytes) / rate));
  return g_emulated_free;
}
// $SWAPNET_EMULATE_READ: bytes per second, or a rate such as 400MB/s, 2GB/s, 1.5GiB/s; 0 when
// unset or unreadable (said once).
double emulated_rate_from_env() {
  const char* e = std::getenv("SWAPNET_EMULATE_READ");
  if (e == nullptr || *e == '\0') return 0;
  char* end = nullptr;
  double v = std::strtod(e, &end);
  std::string unit(end ? end : "");
  if (unit.size() >= 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) unit.resize(unit.size() - 2);
  const std::pair<const char*, double> units[] = {{"", 1},      {"B", 1},          {"KB", 1e3},  {"MB", 1e6},
                                                  {"GB", 1e9},  {"KiB", 1024.0},   {"MiB", 1048576.0},
                                                  {"GiB", 1073741824.0}};
  for (const auto& [u, f] : units) {
    if (unit == u && v > 0) return v * f;
  }
  log_once(LogLevel::kWarn, "emulated_disk_env",
           std::string("SWAPNET_EMULATE_READ='") + e + "' is not a rate (e.g. 400MB/s or bytes per second): no disk emulated");
  return 0;
}
}  // namespace

double emulated_read_bytes_per_s() { return emulated_rate_from_env(); }

void emulated_read_wait(std::chrono::steady_clock::time_point queued, std::uint64_t bytes) {
  static const double rate = emulated_rate_from_env();
  if (rate <= 0 || bytes == 0) return;
  std::this_thread::sleep_until(emulated_disk_serves(queued, bytes, rate));
}

struct BlockReader::Impl {
  struct Job {
    Ticket id = 0;
    std::uint64_t order = 0;  // submit()'s: lower goes first (Note [Earliest block first])
    std::uint64_t offset = 0;
    std::size_t length = 0;
    char* buffer = nullptr;
    std::vector<Check> checks;
    std::chrono::steady_clock::time_point queued;  // when submit() queued it
    std::size_t submitted = 0;  // bytes handed to requests
    std::size_t completed = 0;  // bytes landed
    int in_flight = 0;
    Status status;
    bool done = false;
    // Checksums are computed as the bytes land, in order (Note [Hashing as bytes land]).
    std::uint64_t hashed = 0;                      // bytes from the job's start fed to the checks
    std::map<std::uint64_t, std::uint64_t> landed; // job-relative offset -> length, beyond `hashed`
    std::size_t next_check = 0;                    // first check not yet complete
    XXH3_state_t* state = nullptr;                 // of checks[next_check]
    bool hashing = false;                          // a thread is feeding the checks (unlocked)
    int waiters = 0;                               // threads in wait() for this job
    ~Job() {
      if (state != nullptr) XXH3_freeState(state);
    }
  };
  struct Request {
    Job* job = nullptr;
    std::uint64_t offset = 0;
    std::size_t length = 0;
    char* buffer = nullptr;
    int retries = 0;
    bool busy = false;
    std::uint64_t first_offset = 0;  // the piece as handed out, before short-read advances
    std::size_t first_length = 0;
    TraceClock::time_point issued;  // while tracing (Note [Tracing] in trace.cpp)
  };

  std::string path;
  ReaderOptions opt;
  int fd = -1;
  std::uint64_t size = 0;
  // The file as opened (Note [The image changing on disk]).
  std::int64_t mtime_ns = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  mutable std::atomic<bool> moved_said{false};
  IoBackend backend = IoBackend::kIoUring;
  io_uring ring{};
  bool ring_ready = false;
  bool file_registered = false;
  std::vector<std::pair<char*, std::size_t>> fixed;  // registered buffers (io_uring)

  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<Job*> pending;                     // submitted, not finished, in order
  std::map<Ticket, std::unique_ptr<Job>> jobs;  // all not yet waited for
  Ticket next_ticket = 1;
  bool stopping = false;
  std::atomic<std::uint64_t> bytes_read{0};
  std::thread worker;
  std::vector<Request> requests;
  // Shared with other readers of the disk (Note [One disk, read by urgency]); null: alone.
  std::shared_ptr<SharedDisk> disk;
  int disk_id = 0;
  std::atomic<std::uint64_t> disk_wakes{0};  // bumped by the disk when a slot may be ours
  // Time with at least one request in the kernel (BlockReader::busy_seconds), under `mu`: the
  // periods ended, and when the one going on began.
  double busy_total = 0;  // seconds
  bool busy = false;
  std::chrono::steady_clock::time_point busy_since;
  // The sustained rate's samples (Note [A sustained read rate]), under `mu`: busy time and bytes
  // landed from `fresh_until` on in each busy period.
  bool was_busy = false;
  std::chrono::steady_clock::time_point busy_end, fresh_until;
  double sustained_total = 0;  // seconds
  std::uint64_t sustained_bytes = 0;
  double emulate = 0;  // ReaderOptions::emulate_bytes_per_s (0: none)
  // An emulated read of `bytes` of `job` (ReaderOptions::emulate_bytes_per_s): waits, with `lock`
  // released, until the emulated disk has served it.
  void emulate_read(std::unique_lock<std::mutex>& lock, const Job& job, long bytes) {
    if (emulate <= 0 || bytes <= 0) return;
    const auto done = emulated_disk_serves(job.queued, static_cast<std::uint64_t>(bytes), emulate,
                                           opt.emulate_idle_credit_s);
    if (std::chrono::steady_clock::now() >= done) return;
    lock.unlock();
    std::this_thread::sleep_until(done);
    lock.lock();
  }
  // A request landed (or failed): its span from issue, named by its read's order.
  void trace_landed(const Request& r) const {
    if (!tracing()) return;
    trace_span(opt.trace_group, TraceLane::kReads, "read", static_cast<std::int64_t>(r.job->order), r.issued,
               TraceClock::now(), "bytes", static_cast<std::int64_t>(r.first_length));
  }
  // After `in_flight` changed (under `mu`): a busy period begins or ends.
  void busy_to(unsigned in_flight) {
    if ((in_flight > 0) == busy) return;
    const auto now = std::chrono::steady_clock::now();
    if (busy) {
      busy_total += std::chrono::duration<double>(now - busy_since).count();
      sustained_total += sustained_part(now);
      busy_end = now;
      was_busy = true;
      trace_span(opt.trace_group, TraceLane::kDisk, "busy", -1, busy_since, now);
    } else {
      busy_since = now;
      const auto gap = was_busy ? now - busy_end : kBurstCredit;
      // A busy period that begins within the burst of the one before is in the burst too (the
      // pread path is busy one request at a time; io_uring's queue may run dry between batches).
      fresh_until = std::max(fresh_until, now + std::min<std::chrono::steady_clock::duration>(gap, kBurstCredit));
    }
    busy = !busy;
  }
  // Seconds of the busy period going on (until `now`) past its burst (Note [A sustained read rate]).
  double sustained_part(std::chrono::steady_clock::time_point now) const {
    return std::max(0.0, std::chrono::duration<double>(now - std::max(busy_since, fresh_until)).count());
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    work_cv.notify_all();
    if (worker.joinable()) worker.join();
    if (disk) disk->state().leave(disk_id);
    if (ring_ready) io_uring_queue_exit(&ring);
    if (fd >= 0) ::close(fd);
  }

  std::string range(std::uint64_t off, std::size_t len) const {
    return path + ": read " + u64s(len) + " bytes at offset " + u64s(off);
  }

  // The one place results are interpreted (see the policies above). Returns true when the
  // request is finished (landed or failed); false when it must be issued again as updated.
  bool complete(Request& r, long result) {
    if (opt.fault) result = opt.fault(r.offset, r.length, result);
    Job& j = *r.job;
    if (result == -EINTR || result == -EAGAIN) {
      if (++r.retries <= kMaxRetries) return false;
      fail(j, Status::error(static_cast<int>(-result), range(r.offset, r.length) + " failed after " +
                                                           std::to_string(kMaxRetries) + " retries: " +
                                                           std::strerror(static_cast<int>(-result)) + " (" +
                                                           errno_name(static_cast<int>(-result)) + ")"));
      return true;
    }
    if (result < 0) {
      int e = static_cast<int>(-result);
      fail(j, Status::error(e, range(r.offset, r.length) + " failed: " + std::strerror(e) + " (" + errno_name(e) + ")"));
      return true;
    }
    if (result == 0) {
      fail(j, Status::error(EIO, range(r.offset, r.length) + " failed: unexpected end of file (file is " +
                                     u64s(size) + " bytes; truncated image?)"));
      return true;
    }
    std::size_t got = std::min<std::size_t>(static_cast<std::size_t>(result), r.length);
    bytes_read += got;
    if (std::chrono::steady_clock::now() >= fresh_until) sustained_bytes += got;
    j.completed += got;
    if (got < r.length) {  // short read: continue where it stopped
      r.offset += got;
      r.buffer += got;
      r.length -= got;
      return false;
    }
    if (backend == IoBackend::kBuffered) {
      // No second copy in the page cache: drop what this read brought in.
      (void)::posix_fadvise(fd, static_cast<off_t>(r.first_offset), static_cast<off_t>(r.first_length),
                            POSIX_FADV_DONTNEED);
    }
    if (!j.checks.empty()) j.landed.emplace(r.first_offset - j.offset, r.first_length);
    return true;
  }

  // Note [Hashing as bytes land]
  // Verifying a block after it has fully landed would add its hashing time (~1.5 ms per 20 MB)
  // to the wait. Instead landed pieces are fed, in file order, to the streaming XXH3 state of
  // the check they belong to while later pieces are still in flight, by whichever thread is
  // free: a thread blocked in wait() for the job hashes it (it is idle anyway); a job nobody
  // waits for yet is hashed by the I/O thread after it has refilled the ring. One thread at a
  // time per job (`hashing`), outside the lock. A check is compared as soon as its last byte
  // has been fed.
  bool can_hash(const Job& j) const {
    return !j.checks.empty() && j.status.ok() && !j.hashing && !j.landed.empty() && j.landed.begin()->first == j.hashed;
  }

  // Called with `lock` held; releases it while hashing.
  void hash_landed(Job& j, std::unique_lock<std::mutex>& lock) {
    while (can_hash(j)) {
      std::uint64_t end = j.hashed;
      while (!j.landed.empty() && j.landed.begin()->first == end) {
        end += j.landed.begin()->second;
        j.landed.erase(j.landed.begin());
      }
      const std::uint64_t a = j.offset + j.hashed, b = j.offset + end;
      j.hashing = true;
      lock.unlock();
      Status bad = feed_checks(j, a, b);
      lock.lock();
      j.hashing = false;
      j.hashed = end;
      if (!bad.ok()) fail(j, std::move(bad));
    }
  }

  // Feeds file bytes [a, b) (landed in j's buffer) to the checks; only the hashing thread
  // touches next_check and state.
  Status feed_checks(Job& j, std::uint64_t a, std::uint64_t b) {
    while (j.next_check < j.checks.size()) {
      const Check& c = j.checks[j.next_check];
      if (c.offset >= b) break;
      const std::uint64_t lo = std::max(a, c.offset), hi = std::min(b, c.offset + c.size);
      if (lo < hi) {
        if (j.state == nullptr) {
          j.state = XXH3_createState();
          XXH3_64bits_reset(j.state);
        }
        XXH3_64bits_update(j.state, j.buffer + (lo - j.offset), static_cast<std::size_t>(hi - lo));
      }
      if (c.offset + c.size > b) break;  // this check continues in a later piece
      std::uint64_t got = j.state != nullptr ? XXH3_64bits_digest(j.state) : XXH3_64bits(nullptr, 0);
      if (j.state != nullptr) XXH3_64bits_reset(j.state);
      if (got != c.checksum) {
        return Status::error(-1, path + ": checksum mismatch in " + c.what + " (bytes [" + u64s(c.offset) + ", +" +
                                     u64s(c.size) + "))");
      }
      ++j.next_check;
    }
    return Status();
  }

  // Wakes threads in wait() only when their job has landed bytes to hash (a wake-up per
  // completion batch would cost a context switch each on a small machine).
  void notify_hashers() {
    for (Job* j : pending) {
      if (j->waiters > 0 && can_hash(*j)) {
        done_cv.notify_all();
        return;
      }
    }
  }

  // The I/O thread hashes only jobs nobody is waiting for (waiters hash their own).
  void hash_unwaited(std::unique_lock<std::mutex>& lock) {
    for (size_t i = 0; i < pending.size(); ++i) {
      Job* j = pending[i];
      if (j->waiters == 0 && can_hash(*j)) hash_landed(*j, lock);  // may unlock: re-read pending
    }
  }

  void fail(Job& j, Status s) {
    if (j.status.ok()) j.status = std::move(s);
  }

  // Called with the lock held when a job has nothing in flight and nothing left to issue.
  bool finished(const Job& j) const {
    if (j.in_flight != 0 || j.hashing) return false;
    if (!j.status.ok()) return true;
    return j.submitted == j.length && (j.checks.empty() || j.hashed == j.length);
  }

  void finish(Job& j) {
    if (backend == IoBackend::kBuffered) {
      (void)::posix_fadvise(fd, static_cast<off_t>(j.offset), static_cast<off_t>(j.length), POSIX_FADV_DONTNEED);
    }
    if (j.status.ok() && j.next_check != j.checks.size()) {
      j.status = Status::error(-1, path + ": internal: " + std::to_string(j.checks.size() - j.next_check) +
                                       " checksums of the read were not verified");
    }
    j.done = true;
  }

  int fixed_index(const char* p, std::size_t len) const {
    for (std::size_t i = 0; i < fixed.size(); ++i) {
      if (p >= fixed[i].first && p + len <= fixed[i].first + fixed[i].second) return static_cast<int>(i);
    }
    return -1;
  }

  void issue_uring(Request& r, unsigned index) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);  // never null: requests <= ring entries
    int target = file_registered ? 0 : fd;
    int buf = fixed_index(r.buffer, r.length);
    if (buf >= 0) {
      io_uring_prep_read_fixed(sqe, target, r.buffer, static_cast<unsigned>(r.length), r.offset, buf);
    } else {
      io_uring_prep_read(sqe, target, r.buffer, static_cast<unsigned>(r.length), r.offset);
    }
    if (file_registered) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, index);
  }

  bool has_piece() const {
    for (const Job* j : pending) {
      if (j->submitted < j->length && j->status.ok()) return true;
    }
    return false;
  }
  // With a shared disk: whether this reader may issue a piece now (false: held back, or nothing
  // to issue). Without: whether it has a piece.
  bool may_issue() {
    if (!has_piece()) {
      if (disk) disk->state().idle(disk_id);
      return false;
    }
    return !disk || disk->state().acquire(disk_id);
  }
  void disk_release(unsigned n) {
    if (disk) disk->state().release(n);
  }
  // Held back by the disk with nothing in flight: sleep until woken (or 2 ms, a raced wake-up).
  void wait_for_disk(std::unique_lock<std::mutex>& lock, std::uint64_t seen) {
    work_cv.wait_for(lock, std::chrono::milliseconds(2), [&] { return stopping || disk_wakes.load() != seen; });
  }

  // Hands out the next request-sized piece of the job with bytes left to issue that comes first
  // (the lowest order, then the oldest: Note [Earliest block first]).
  bool next_piece(Request& r) {
    Job* j = nullptr;
    for (Job* c : pending) {
      if (c->submitted < c->length && c->status.ok() && (j == nullptr || c->order < j->order)) j = c;
    }
    if (j == nullptr) return false;
    std::size_t n = std::min(opt.request_bytes, j->length - j->submitted);
    r = Request{j, j->offset + j->submitted, n, j->buffer + j->submitted, 0, true, j->offset + j->submitted, n, {}};
    if (tracing()) r.issued = TraceClock::now();
    j->submitted += n;
    j->in_flight++;
    return true;
  }

  void retire_finished_locked() {
    bool any = false;
    for (auto it = pending.begin(); it != pending.end();) {
      if (finished(**it)) {
        finish(**it);
        it = pending.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    if (any) done_cv.notify_all();
  }

  void run_uring() {
    unsigned in_flight = 0;
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (disk && in_flight == 0 && !has_piece()) disk->state().idle(disk_id);  // never sleep holding others back
      work_cv.wait(lock, [&] { return stopping || in_flight > 0 || has_piece(); });
      if (stopping && in_flight == 0) return;
      // 1. Refill the ring and submit without waiting (as far as the shared disk lets us).
      const std::uint64_t wakes = disk_wakes.load();
      bool held_back = false;
      for (unsigned i = 0; i < requests.size() && !stopping; ++i) {
        if (requests[i].busy) continue;
        if (!may_issue()) {
          held_back = disk && has_piece();
          break;
        }
        if (!next_piece(requests[i])) {
          disk_release(1);
          break;
        }
        issue_uring(requests[i], i);
        ++in_flight;
      }
      busy_to(in_flight);
      int rc = io_uring_submit(&ring);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // The ring itself failed: fail every read in flight, keep the thread alive.
        for (auto& r : requests) {
          if (!r.busy) continue;
          fail(*r.job, Status::error(-rc, range(r.offset, r.length) + " failed: io_uring_submit: " +
                                              std::strerror(-rc) + " (" + errno_name(-rc) + ")"));
        }
      }
      // 2. Hash what has landed while the reads run, and hand back finished reads.
      hash_unwaited(lock);
      retire_finished_locked();
      if (in_flight == 0) {
        if (held_back) wait_for_disk(lock, wakes);
        continue;
      }
      // 3. Wait for completions.
      lock.unlock();
      io_uring_cqe* first = nullptr;
      // Held back with pieces in flight: a slot the disk frees does not complete our reads, so
      // look again within 1 ms rather than at our next completion (the queue would run dry).
      int wr = 0;
      if (held_back) {
        __kernel_timespec ts{0, 1000000};
        wr = io_uring_wait_cqe_timeout(&ring, &first, &ts);
        if (wr == -ETIME) {
          lock.lock();
          continue;
        }
      } else {
        wr = io_uring_wait_cqe(&ring, &first);
      }
      lock.lock();
      if (wr < 0 && wr != -EINTR && wr != -EAGAIN) {
        for (auto& r : requests) {
          if (!r.busy) continue;
          fail(*r.job, Status::error(-wr, range(r.offset, r.length) + " failed: io_uring_wait_cqe: " +
                                              std::strerror(-wr) + " (" + errno_name(-wr) + ")"));
          r.job->in_flight--;
          r.busy = false;
        }
        disk_release(in_flight);
        in_flight = 0;
        busy_to(0);
        continue;
      }
      io_uring_cqe* cqe = nullptr;
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&ring, head, cqe) {
        ++seen;
        unsigned idx = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
        Request& r = requests[idx];
        emulate_read(lock, *r.job, cqe->res);
        if (complete(r, cqe->res)) {
          trace_landed(r);
          r.job->in_flight--;
          r.busy = false;
          --in_flight;
          disk_release(1);
        } else {
          issue_uring(r, idx);  // EINTR, EAGAIN or the rest of a short read: next submit
        }
      }
      io_uring_cq_advance(&ring, seen);
      busy_to(in_flight);
      notify_hashers();
      if (in_flight == 0) {  // nothing more will wake this loop for these jobs: finish them now
        hash_unwaited(lock);
        retire_finished_locked();
      }
    }
  }

  void run_pread() {
    std::unique_lock<std::mutex> lock(mu);
    Request& r = requests[0];
    for (;;) {
      if (disk && !has_piece()) disk->state().idle(disk_id);  // never sleep holding others back
      work_cv.wait(lock, [&] { return stopping || has_piece(); });
      if (stopping) return;
      const std::uint64_t wakes = disk_wakes.load();
      if (!may_issue()) {
        if (disk && has_piece()) wait_for_disk(lock, wakes);
        retire_finished_locked();
        continue;
      }
      if (!next_piece(r)) {
        disk_release(1);
        retire_finished_locked();
        continue;
      }
      busy_to(1);
      lock.unlock();
      bool done = false;
      while (!done) {
        ssize_t n = ::pread(fd, r.buffer, r.length, static_cast<off_t>(r.offset));
        long res = n < 0 ? -static_cast<long>(errno) : static_cast<long>(n);
        lock.lock();
        emulate_read(lock, *r.job, res);
        done = complete(r, res);
        if (done) {
          trace_landed(r);
          busy_to(0);  // before a waiter can see the read done
        }
        lock.unlock();
      }
      lock.lock();
      r.job->in_flight--;
      r.busy = false;
      disk_release(1);
      notify_hashers();
      hash_unwaited(lock);
      retire_finished_locked();
    }
  }
};

BlockReader::BlockReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockReader::~BlockReader() = default;

Status BlockReader::open(const std::string& path, const ReaderOptions& options, std::unique_ptr<BlockReader>* out) {
  if (options.request_bytes == 0 || !aligned(options.request_bytes) || options.request_bytes > (1u << 30)) {
    return Status::error(EINVAL, path + ": request size " + u64s(options.request_bytes) +
                                     " must be a positive multiple of 4096 up to 1 GiB");
  }
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return Status::error(EINVAL, path + ": queue depth " + std::to_string(options.queue_depth) + " out of 1..4096");
  }
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->opt = options;
  impl->emulate = options.emulate_bytes_per_s >= 0 ? options.emulate_bytes_per_s : emulated_rate_from_env();
  if (impl->emulate > 0) {
    log_once(LogLevel::kInfo, "emulated_disk",
             "block readers emulate a disk of " + std::to_string(static_cast<long long>(impl->emulate / 1e6)) +
                 " MB/s (SWAPNET_EMULATE_READ or ReaderOptions::emulate_bytes_per_s)");
  }
  // O_DIRECT first; a filesystem that refuses it (EINVAL at open or at the first read) gets
  // buffered reads with the page cache dropped behind them.
  bool direct = options.allow_direct;
  if (direct) {
    impl->fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (impl->fd < 0 && errno != EINVAL) {
      int e = errno;
      return Status::error(e, path + ": cannot open: " + std::strerror(e) + " (" + errno_name(e) + ")");
    }
    if (impl->fd >= 0) {
      void* probe = alloc_aligned(kImageAlign);
      ssize_t n = ::pread(impl->fd, probe, kImageAlign, 0);
      int e = errno;
      free_aligned(probe);
      if (n < 0 && e == EINVAL) {
        ::close(impl->fd);
        impl->fd = -1;
      }
    }
    if (impl->fd < 0) {
      log_once(LogLevel::kWarn, "o_direct_refused",
               path + ": O_DIRECT refused (EINVAL); falling back to buffered reads with POSIX_FADV_DONTNEED");
      direct = false;
    }
  }
  if (!direct) {
    impl->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (impl->fd < 0) {
      int e = errno;
      return Status::error(e, path + ": cannot open: " + std::strerror(e) + " (" + errno_name(e) + ")");
    }
    impl->backend = IoBackend::kBuffered;
    // No readahead: pages read ahead of a request would land in the page cache after that
    // request's DONTNEED and stay there.
    (void)::posix_fadvise(impl->fd, 0, 0, POSIX_FADV_RANDOM);
  }
  struct stat st {};
  if (::fstat(impl->fd, &st) != 0) return Status::error(errno, path + ": fstat: " + std::strerror(errno));
  impl->size = static_cast<std::uint64_t>(st.st_size);
  impl->mtime_ns = mtime_ns(st);
  impl->dev = st.st_dev;
  impl->ino = st.st_ino;

  if (direct) {
    impl->backend = IoBackend::kPreadDirect;
    if (options.allow_io_uring) {
      int rc = io_uring_queue_init(options.queue_depth, &impl->ring, 0);
      if (rc == 0) {
        impl->ring_ready = true;
        impl->backend = IoBackend::kIoUring;
        // Advisory: a registered file saves a lookup per request.
        impl->file_registered = io_uring_register_files(&impl->ring, &impl->fd, 1) == 0;
      } else {
        log_once(LogLevel::kWarn, "io_uring_refused",
                 path + ": io_uring refused (" + std::strerror(-rc) + ", " + errno_name(-rc) +
                     "); falling back to pread with O_DIRECT");
      }
    }
  }
  impl->requests.resize(impl->backend == IoBackend::kIoUring ? options.queue_depth : 1);
  Impl* raw = impl.get();
  if (options.disk) {
    impl->disk = options.disk;
    impl->disk_id = impl->disk->state().join([raw] {
      raw->disk_wakes.fetch_add(1);
      raw->work_cv.notify_all();
    });
  }
  impl->worker = std::thread([raw] {
    pthread_setname_np(pthread_self(), "swapnet-io");
    if (raw->backend == IoBackend::kIoUring) raw->run_uring();
    else raw->run_pread();
  });
  log(LogLevel::kInfo, path + ": block reader on " + to_string(impl->backend) + ", " + u64s(options.request_bytes) +
                           "-byte requests, queue depth " + std::to_string(options.queue_depth));
  out->reset(new BlockReader(std::move(impl)));
  return Status();
}

BlockReader::Ticket BlockReader::submit(std::uint64_t offset, std::size_t length, void* buffer,
                                        std::vector<Check> verify, std::uint64_t order) {
  Impl& m = *impl_;
  auto job = std::make_unique<Impl::Job>();
  job->order = order;
  job->queued = std::chrono::steady_clock::now();
  job->offset = offset;
  job->length = length;
  job->buffer = static_cast<char*>(buffer);
  job->checks = std::move(verify);
  if (!aligned(offset) || !aligned(length) || !aligned(reinterpret_cast<std::uintptr_t>(buffer))) {
    job->status = Status::error(EINVAL, m.range(offset, length) + ": offset, length and buffer must be multiples of " +
                                            u64s(kImageAlign));
  } else if (offset > m.size || length > m.size - offset) {
    job->status = Status::error(EINVAL, m.range(offset, length) + ": beyond the end of the file (" + u64s(m.size) +
                                            " bytes)");
  }
  std::sort(job->checks.begin(), job->checks.end(),
            [](const Check& a, const Check& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < job->checks.size(); ++i) {
    const Check& c = job->checks[i];
    if (i > 0 && c.offset < job->checks[i - 1].offset + job->checks[i - 1].size) {
      job->status = Status::error(EINVAL, m.path + ": checksum ranges of " + job->checks[i - 1].what + " and " + c.what +
                                              " overlap");
    }
    if (c.offset < offset || c.size > length || c.offset - offset > length - c.size) {
      job->status = Status::error(EINVAL, m.path + ": checksum range of " + c.what + " lies outside the read");
    }
  }
  std::lock_guard<std::mutex> lock(m.mu);
  Ticket t = m.next_ticket++;
  job->id = t;
  Impl::Job* raw = job.get();
  m.jobs.emplace(t, std::move(job));
  if (!raw->status.ok() || raw->length == 0) {
    m.finish(*raw);
  } else {
    m.pending.push_back(raw);
    m.work_cv.notify_one();
  }
  return t;
}

Status BlockReader::wait(Ticket ticket) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  auto it = m.jobs.find(ticket);
  if (it == m.jobs.end()) return Status::error(EINVAL, m.path + ": unknown or already waited-for read " + u64s(ticket));
  Impl::Job* j = it->second.get();
  ++j->waiters;
  while (!j->done) {
    if (m.can_hash(*j)) {
      m.hash_landed(*j, lock);  // this thread is idle anyway (Note [Hashing as bytes land])
      m.retire_finished_locked();
      continue;
    }
    m.done_cv.wait(lock, [&] { return j->done || m.can_hash(*j); });
  }
  Status s = std::move(j->status);
  m.jobs.erase(it);
  return s;
}

namespace {
template <typename Jobs>
std::uint64_t unlanded_locked(const Jobs& jobs, BlockReader::Ticket ticket) {
  auto it = jobs.find(ticket);
  if (it == jobs.end() || it->second->done) return 0;
  const auto& j = *it->second;
  return j.completed >= j.length ? 0 : j.length - j.completed;
}
}  // namespace

std::uint64_t BlockReader::unlanded_bytes(Ticket ticket) const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  return unlanded_locked(m.jobs, ticket);
}

bool BlockReader::try_unlanded_bytes(Ticket ticket, std::uint64_t* out) const {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  *out = unlanded_locked(m.jobs, ticket);
  return true;
}

void BlockReader::cancel(Ticket ticket) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.jobs.find(ticket);
  if (it == m.jobs.end() || it->second->done) return;
  // A failed job issues no more pieces and is finished once its pieces in flight have landed.
  m.fail(*it->second, Status::error(ECANCELED, m.range(it->second->offset, it->second->length) + ": cancelled"));
  m.retire_finished_locked();
}

Status BlockReader::read(std::uint64_t offset, std::size_t length, void* buffer, std::vector<Check> verify) {
  return wait(submit(offset, length, buffer, std::move(verify)));
}

bool BlockReader::register_buffers(const std::vector<std::pair<void*, std::size_t>>& buffers) {
  Impl& m = *impl_;
  if (m.backend != IoBackend::kIoUring || !m.opt.register_buffers) return true;
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.pending.empty()) return false;  // only between reads
  if (!m.fixed.empty()) {
    io_uring_unregister_buffers(&m.ring);
    m.fixed.clear();
  }
  if (buffers.empty()) return true;  // unregistered: the pages are no longer pinned
  std::vector<iovec> iov;
  for (const auto& b : buffers) iov.push_back(iovec{b.first, b.second});
  int rc = io_uring_register_buffers(&m.ring, iov.data(), static_cast<unsigned>(iov.size()));
  if (rc != 0) {
    log_once(LogLevel::kWarn, "register_buffers",
             m.path + ": io_uring buffer registration refused (" + std::strerror(-rc) + ", " + errno_name(-rc) +
                 "; memlock limit?); reading into unregistered buffers");
    return true;
  }
  for (const auto& b : buffers) m.fixed.emplace_back(static_cast<char*>(b.first), b.second);
  return true;
}

void BlockReader::set_priority(double priority) {
  if (impl_->disk) impl_->disk->state().set_priority(impl_->disk_id, priority);
}
double BlockReader::priority() const { return impl_->disk ? impl_->disk->state().priority(impl_->disk_id) : 0.0; }

IoBackend BlockReader::backend() const { return impl_->backend; }
// Note [The image changing on disk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model serves for months; its image may be rewritten, truncated, replaced or deleted under
// it. Blocks are re-read every inference, so bytes written into the file in place would be mixed
// with blocks read (and kept resident) before, and checksums are only checked on the first
// read of each layer. The reader keeps the open file's size and modification time, and the
// executor calls check_file() before and after every inference: a file changed in place
// (written or truncated: its size or mtime moved) fails that inference and every later one,
// saying so, and is never mixed silently. A file replaced (renamed over) or deleted at its path
// is harmless to us: the open descriptor still reads the file as opened, whole and consistent;
// that is said once, and the model keeps serving from it.
Status BlockReader::check_file() const {
  const Impl& m = *impl_;
  struct stat st {};
  if (::fstat(m.fd, &st) != 0) {
    const int e = errno;
    return Status::error(e, m.path + ": fstat: " + std::strerror(e) + " (" + errno_name(e) + ")");
  }
  const std::int64_t now_ns = mtime_ns(st);
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (size != m.size || now_ns != m.mtime_ns) {
    std::string what = size != m.size ? "size " + u64s(m.size) + " -> " + u64s(size) + " bytes"
                                      : "modified " + std::to_string((now_ns - m.mtime_ns) / 1000000) +
                                            " ms after it was opened, same size";
    return Status::error(ESTALE, m.path + ": the image changed on disk since it was opened (" + what +
                                     "): its blocks would no longer match those already read; reopen it "
                                     "(swapnet pack writes a new image beside the old one and renames it)");
  }
  // Replaced or deleted at its path: said once, and not looked for again (no stat per inference).
  struct stat now {};
  if (!m.moved_said.load() && (::stat(m.path.c_str(), &now) != 0 || now.st_ino != m.ino || now.st_dev != m.dev) &&
      !m.moved_said.exchange(true)) {
    log(LogLevel::kWarn, m.path + ": the image was replaced or deleted on disk; this model goes on reading the file "
                                  "it opened (reopen it to use the new one)");
  }
  return Status();
}

const std::string& BlockReader::path() const { return impl_->path; }
std::uint64_t BlockReader::file_size() const { return impl_->size; }
std::uint64_t BlockReader::bytes_read() const { return impl_->bytes_read.load(); }

double BlockReader::busy_seconds() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  double t = impl_->busy_total;
  if (impl_->busy) t += std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->busy_since).count();
  return t;
}

BlockReader::Sustained BlockReader::sustained() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  Sustained s{impl_->sustained_bytes, impl_->sustained_total};
  if (impl_->busy) s.seconds += impl_->sustained_part(std::chrono::steady_clock::now());
  return s;
}

// ---- check ------------------------------------------------------------------------------

Status check_image(const std::string& path, const ImageInfo& info) {
  std::unique_ptr<BlockReader> reader;
  Status s = BlockReader::open(path, ReaderOptions{}, &reader);
  if (!s.ok()) return s;
  // Layers are hashed incrementally from fixed-size chunks, two chunks in flight.
  constexpr std::size_t kChunk = 8u << 20;  // bytes
  void* bufs[2] = {alloc_aligned(kChunk), alloc_aligned(kChunk)};
  if (!bufs[0] || !bufs[1]) {
    free_aligned(bufs[0]);
    free_aligned(bufs[1]);
    return Status::error(ENOMEM, path + ": cannot allocate check buffers");
  }
  XXH3_state_t* hs = XXH3_createState();
  std::uint64_t pos = info.data_offset;
  const std::uint64_t end = info.data_offset + info.data_size;
  auto chunk_len = [&](std::uint64_t at) { return static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, end - at)); };
  BlockReader::Ticket t[2] = {0, 0};
  int cur = 0;
  if (pos < end) t[cur] = reader->submit(pos, chunk_len(pos), bufs[cur]);
  std::size_t layer = 0;  // weightless layers (size 0) have nothing to check
  while (layer < info.layers.size() && info.layers[layer].size == 0) ++layer;
  XXH3_64bits_reset(hs);
  std::uint64_t layer_pos = 0;
  while (s.ok() && pos < end) {
    std::size_t n = chunk_len(pos);
    std::uint64_t next = pos + n;
    if (next < end) t[1 - cur] = reader->submit(next, chunk_len(next), bufs[1 - cur]);
    s = reader->wait(t[cur]);
    if (!s.ok()) {
      if (next < end) reader->wait(t[1 - cur]);
      break;
    }
    const char* p = static_cast<const char*>(bufs[cur]);
    std::size_t used = 0;
    while (used < n && layer < info.layers.size()) {
      const ImageLayer& L = info.layers[layer];
      std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(L.size - layer_pos, n - used));
      XXH3_64bits_update(hs, p + used, take);
      used += take;
      layer_pos += take;
      if (layer_pos == L.size) {
        if (XXH3_64bits_digest(hs) != L.checksum) {
          s = Status::error(-1, path + ": checksum mismatch in layer " + std::to_string(layer) + " (" + L.name +
                                    "), bytes [" + u64s(L.offset) + ", +" + u64s(L.size) + ")");
          break;
        }
        XXH3_64bits_reset(hs);
        layer_pos = 0;
        ++layer;
        while (layer < info.layers.size() && info.layers[layer].size == 0) ++layer;
      }
    }
    if (!s.ok() && next < end) reader->wait(t[1 - cur]);
    pos = next;
    cur = 1 - cur;
  }
  XXH3_freeState(hs);
  free_aligned(bufs[0]);
  free_aligned(bufs[1]);
  return s;
}

}  // namespace swapnet
