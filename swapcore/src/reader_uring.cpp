// The io_uring backend of the block reader: the ring made at open, requests issued into it
// (into registered buffers where the caller registered them) and their completions reaped, up
// to a queue depth in flight, as far as a shared disk lets this reader issue.
#include <liburing.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "reader_impl.h"
#include "shared_disk.h"

namespace swapnet {

// The probe (at open, on a file opened with O_DIRECT): a ring of queue_depth entries makes this
// reader an io_uring one; refused, it stays on pread, said once.
bool BlockReader::Impl::init_uring() {
  int rc = io_uring_queue_init(opt.queue_depth, &ring, 0);
  if (rc == 0) {
    ring_ready = true;
    backend = IoBackend::kIoUring;
    // Advisory: a registered file saves a lookup per request.
    file_registered = io_uring_register_files(&ring, &fd, 1) == 0;
    return true;
  }
  log_once(LogLevel::kWarn, "io_uring_refused",
           path + ": io_uring refused (" + std::strerror(-rc) + ", " + errno_name(-rc) +
               "); falling back to pread with O_DIRECT");
  return false;
}

int BlockReader::Impl::fixed_index(const char* p, std::size_t len) const {
  for (std::size_t i = 0; i < fixed.size(); ++i) {
    if (p >= fixed[i].first && p + len <= fixed[i].first + fixed[i].second) return static_cast<int>(i);
  }
  return -1;
}

void BlockReader::Impl::issue_uring(Request& r, unsigned index) {
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

// 1. Refill the ring and submit without waiting (as far as the shared disk lets us). Returns
// whether the disk held this reader back with pieces left to issue.
bool BlockReader::Impl::uring_refill(unsigned& in_flight) {
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
  return held_back;
}

// 3. Waits for completions with `lock` released. Held back with pieces in flight: a slot the
// disk frees does not complete our reads, so look again within 1 ms (-ETIME) rather than at our
// next completion (the queue would run dry).
int BlockReader::Impl::uring_wait(std::unique_lock<std::mutex>& lock, bool held_back) {
  lock.unlock();
  io_uring_cqe* first = nullptr;
  int wr = 0;
  if (held_back) {
    __kernel_timespec ts{0, 1000000};
    wr = io_uring_wait_cqe_timeout(&ring, &first, &ts);
  } else {
    wr = io_uring_wait_cqe(&ring, &first);
  }
  lock.lock();
  return wr;
}

// Waiting on the ring failed: fail every read in flight and take them out of it.
void BlockReader::Impl::uring_wait_failed(int wr, unsigned& in_flight) {
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
}

// Hands every completion to complete(): a finished request leaves the ring, one to go on is
// issued again for the next submit.
void BlockReader::Impl::uring_reap(std::unique_lock<std::mutex>& lock, unsigned& in_flight) {
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

void BlockReader::Impl::run_uring() {
  unsigned in_flight = 0;
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    if (disk && in_flight == 0 && !has_piece()) disk->state().idle(disk_id);  // never sleep holding others back
    work_cv.wait(lock, [&] { return stopping || in_flight > 0 || has_piece(); });
    if (stopping && in_flight == 0) return;
    // 1. Refill the ring and submit (uring_refill).
    const std::uint64_t wakes = disk_wakes.load();
    const bool held_back = uring_refill(in_flight);
    // 2. Hash what has landed while the reads run, and hand back finished reads.
    hash_unwaited(lock);
    retire_finished_locked();
    if (in_flight == 0) {
      if (held_back) wait_for_disk(lock, wakes);
      continue;
    }
    // 3. Wait for completions (uring_wait) and hand them to complete() (uring_reap).
    const int wr = uring_wait(lock, held_back);
    if (held_back && wr == -ETIME) continue;
    if (wr < 0 && wr != -EINTR && wr != -EAGAIN) {
      uring_wait_failed(wr, in_flight);
      continue;
    }
    uring_reap(lock, in_flight);
  }
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

}  // namespace swapnet
