// BlockReader's public methods past open (reader_open.cpp): reads submitted, waited for and
// cancelled, the reader's priority on a shared disk, whether the file is still the one opened,
// and its counters; and the aligned buffers and page-cache count the reader's callers use.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "reader_impl.h"
#include "shared_disk.h"

namespace swapnet {

using detail::aligned;
using detail::u64s;

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

BlockReader::BlockReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockReader::~BlockReader() = default;

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
  const std::int64_t now_ns = detail::mtime_ns(st);
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

}  // namespace swapnet
