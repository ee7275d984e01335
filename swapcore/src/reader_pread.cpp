// The pread backend of the block reader, with O_DIRECT or buffered (POSIX_FADV_DONTNEED behind
// each read, in complete() and finish()): one request at a time, read with the lock released.
#include <unistd.h>

#include <cerrno>

#include "reader_impl.h"
#include "shared_disk.h"

namespace swapnet {

void BlockReader::Impl::run_pread() {
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

}  // namespace swapnet
