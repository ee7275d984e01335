// The block reader: moves byte ranges of an image into caller buffers at the disk's speed,
// without leaving a copy in the page cache. This file holds the core every I/O backend runs on:
// the reads handed out in order, each result interpreted, checksums fed as bytes land, and the
// time the disk is busy. The rest of the reader: its state (reader_impl.h), open and the probing
// of the backends (reader_open.cpp), io_uring (reader_uring.cpp), pread (reader_pread.cpp), the
// public methods (block_reader.cpp; Note [The image changing on disk] there), the disk shared by
// several readers (shared_disk.cpp; Note [One disk, read by urgency]) and the emulated disk
// (emulated_disk.cpp; Note [An emulated disk]).
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
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "emulated_disk.h"
#include "reader_impl.h"
#include "shared_disk.h"

namespace swapnet {
namespace {

constexpr int kMaxRetries = 1000;  // EINTR / EAGAIN on one request before giving up

}  // namespace

using detail::u64s;

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
// Note [A sustained read rate]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The burst a blkio throttle serves after idling (Note [An emulated disk] in emulated_disk.cpp)
// also misleads whatever learns the disk's rate from its reads (bytes landed / time busy; Note
// [Learning the costs in service] in cost_learner.cpp): resnet101 under the throttle at
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

// An emulated read of `bytes` of `job` (ReaderOptions::emulate_bytes_per_s): waits, with `lock`
// released, until the emulated disk has served it.
void BlockReader::Impl::emulate_read(std::unique_lock<std::mutex>& lock, const Job& job, long bytes) {
  if (emulate <= 0 || bytes <= 0) return;
  const auto done = detail::emulated_disk_serves(job.queued, static_cast<std::uint64_t>(bytes), emulate,
                                                 opt.emulate_idle_credit_s);
  if (std::chrono::steady_clock::now() >= done) return;
  lock.unlock();
  std::this_thread::sleep_until(done);
  lock.lock();
}
// A request landed (or failed): its span from issue, named by its read's order.
void BlockReader::Impl::trace_landed(const Request& r) const {
  if (!tracing()) return;
  trace_span(opt.trace_group, TraceLane::kReads, "read", static_cast<std::int64_t>(r.job->order), r.issued,
             TraceClock::now(), "bytes", static_cast<std::int64_t>(r.first_length));
}
// After `in_flight` changed (under `mu`): a busy period begins or ends.
void BlockReader::Impl::busy_to(unsigned in_flight) {
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
double BlockReader::Impl::sustained_part(std::chrono::steady_clock::time_point now) const {
  return std::max(0.0, std::chrono::duration<double>(now - std::max(busy_since, fresh_until)).count());
}

BlockReader::Impl::~Impl() {
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

std::string BlockReader::Impl::range(std::uint64_t off, std::size_t len) const {
  return path + ": read " + u64s(len) + " bytes at offset " + u64s(off);
}

// The one place results are interpreted (see the policies above). Returns true when the
// request is finished (landed or failed); false when it must be issued again as updated.
bool BlockReader::Impl::complete(Request& r, long result) {
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
bool BlockReader::Impl::can_hash(const Job& j) const {
  return !j.checks.empty() && j.status.ok() && !j.hashing && !j.landed.empty() && j.landed.begin()->first == j.hashed;
}

// Called with `lock` held; releases it while hashing.
void BlockReader::Impl::hash_landed(Job& j, std::unique_lock<std::mutex>& lock) {
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
Status BlockReader::Impl::feed_checks(Job& j, std::uint64_t a, std::uint64_t b) {
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
void BlockReader::Impl::notify_hashers() {
  for (Job* j : pending) {
    if (j->waiters > 0 && can_hash(*j)) {
      done_cv.notify_all();
      return;
    }
  }
}

// The I/O thread hashes only jobs nobody is waiting for (waiters hash their own).
void BlockReader::Impl::hash_unwaited(std::unique_lock<std::mutex>& lock) {
  for (size_t i = 0; i < pending.size(); ++i) {
    Job* j = pending[i];
    if (j->waiters == 0 && can_hash(*j)) hash_landed(*j, lock);  // may unlock: re-read pending
  }
}

void BlockReader::Impl::fail(Job& j, Status s) {
  if (j.status.ok()) j.status = std::move(s);
}

// Called with the lock held when a job has nothing in flight and nothing left to issue.
bool BlockReader::Impl::finished(const Job& j) const {
  if (j.in_flight != 0 || j.hashing) return false;
  if (!j.status.ok()) return true;
  return j.submitted == j.length && (j.checks.empty() || j.hashed == j.length);
}

void BlockReader::Impl::finish(Job& j) {
  if (backend == IoBackend::kBuffered) {
    (void)::posix_fadvise(fd, static_cast<off_t>(j.offset), static_cast<off_t>(j.length), POSIX_FADV_DONTNEED);
  }
  if (j.status.ok() && j.next_check != j.checks.size()) {
    j.status = Status::error(-1, path + ": internal: " + std::to_string(j.checks.size() - j.next_check) +
                                     " checksums of the read were not verified");
  }
  j.done = true;
}

bool BlockReader::Impl::has_piece() const {
  for (const Job* j : pending) {
    if (j->submitted < j->length && j->status.ok()) return true;
  }
  return false;
}
// With a shared disk: whether this reader may issue a piece now (false: held back, or nothing
// to issue). Without: whether it has a piece.
bool BlockReader::Impl::may_issue() {
  if (!has_piece()) {
    if (disk) disk->state().idle(disk_id);
    return false;
  }
  return !disk || disk->state().acquire(disk_id);
}
void BlockReader::Impl::disk_release(unsigned n) {
  if (disk) disk->state().release(n);
}
// Held back by the disk with nothing in flight: sleep until woken (or 2 ms, a raced wake-up).
void BlockReader::Impl::wait_for_disk(std::unique_lock<std::mutex>& lock, std::uint64_t seen) {
  work_cv.wait_for(lock, std::chrono::milliseconds(2), [&] { return stopping || disk_wakes.load() != seen; });
}

// Hands out the next request-sized piece of the job with bytes left to issue that comes first
// (the lowest order, then the oldest: Note [Earliest block first]).
bool BlockReader::Impl::next_piece(Request& r) {
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

void BlockReader::Impl::retire_finished_locked() {
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

}  // namespace swapnet
