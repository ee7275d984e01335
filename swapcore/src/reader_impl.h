// Internal to swapcore/: the block reader's state (BlockReader::Impl) and the steps its parts
// share: the core every backend runs on (reader.cpp), the I/O backends chosen by probing at open
// (reader_open.cpp; io_uring in reader_uring.cpp, pread in reader_pread.cpp), and the public
// methods (block_reader.cpp). The policies are listed at the top of reader.cpp.
#pragma once

#include <liburing.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "swapnet/swapcore.h"
#include "u64s.h"

namespace swapnet {
namespace detail {

inline std::int64_t mtime_ns(const struct stat& st) { return std::int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }
inline bool aligned(std::uint64_t v) { return v % kImageAlign == 0; }

}  // namespace detail

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

  ~Impl();  // stops and joins the I/O thread, then leaves the disk, the ring and the file

  // ---- the core every backend runs on (reader.cpp); all under `mu` unless said ----
  std::string range(std::uint64_t off, std::size_t len) const;  // "<path>: read N bytes at offset O"
  // An emulated read of `bytes` of `job`: waits, with `lock` released, until served.
  void emulate_read(std::unique_lock<std::mutex>& lock, const Job& job, long bytes);
  void trace_landed(const Request& r) const;
  void busy_to(unsigned in_flight);  // after `in_flight` changed: a busy period begins or ends
  double sustained_part(std::chrono::steady_clock::time_point now) const;
  // Interprets a request's result: true when finished (landed or failed), false when it must be
  // issued again as updated (EINTR, EAGAIN, the rest of a short read).
  bool complete(Request& r, long result);
  bool can_hash(const Job& j) const;
  void hash_landed(Job& j, std::unique_lock<std::mutex>& lock);  // releases `lock` while hashing
  Status feed_checks(Job& j, std::uint64_t a, std::uint64_t b);  // unlocked, by the hashing thread
  void notify_hashers();
  void hash_unwaited(std::unique_lock<std::mutex>& lock);  // may release `lock`
  void fail(Job& j, Status s);
  bool finished(const Job& j) const;
  void finish(Job& j);
  bool has_piece() const;
  bool may_issue();  // with a shared disk: whether it lets us issue a piece now
  void disk_release(unsigned n);
  void wait_for_disk(std::unique_lock<std::mutex>& lock, std::uint64_t seen);
  bool next_piece(Request& r);  // hands out the next piece (Note [Earliest block first])
  void retire_finished_locked();

  // ---- the I/O backends ----
  // BlockReader::open probes them in order (reader_open.cpp): io_uring with O_DIRECT, pread with
  // O_DIRECT, buffered pread with POSIX_FADV_DONTNEED (`backend` says which). Each is a loop the
  // I/O thread runs until `stopping`, taking requests from the core above and handing every
  // result to complete().
  Status open_file(bool* direct);  // O_DIRECT if the file takes it, else buffered (reader_open.cpp)
  Status stat_file();              // size and identity of the file as opened (reader_open.cpp)
  void start();                    // requests, the shared disk, the I/O thread (reader_open.cpp)
  // io_uring (reader_uring.cpp).
  bool init_uring();  // the ring, the file registered; false: refused (said once)
  void run_uring();
  bool uring_refill(unsigned& in_flight);
  int uring_wait(std::unique_lock<std::mutex>& lock, bool held_back);
  void uring_wait_failed(int wr, unsigned& in_flight);
  void uring_reap(std::unique_lock<std::mutex>& lock, unsigned& in_flight);
  int fixed_index(const char* p, std::size_t len) const;
  void issue_uring(Request& r, unsigned index);
  // pread, with O_DIRECT or buffered: one request at a time (reader_pread.cpp).
  void run_pread();
};

}  // namespace swapnet
