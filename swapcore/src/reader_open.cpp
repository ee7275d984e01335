// Opening a block reader: its options checked, the file opened with O_DIRECT where the
// filesystem takes it (buffered otherwise), the I/O backend chosen by probing (io_uring, else
// pread), the reader joined to its shared disk and its I/O thread started.
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "emulated_disk.h"
#include "reader_impl.h"
#include "shared_disk.h"

namespace swapnet {
namespace {

using detail::u64s;

Status check_options(const std::string& path, const ReaderOptions& options) {
  if (options.request_bytes == 0 || !detail::aligned(options.request_bytes) || options.request_bytes > (1u << 30)) {
    return Status::error(EINVAL, path + ": request size " + u64s(options.request_bytes) +
                                     " must be a positive multiple of 4096 up to 1 GiB");
  }
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return Status::error(EINVAL, path + ": queue depth " + std::to_string(options.queue_depth) + " out of 1..4096");
  }
  return Status();
}

}  // namespace

// O_DIRECT first; a filesystem that refuses it (EINVAL at open or at the first read) gets
// buffered reads with the page cache dropped behind them. `*direct_out`: whether O_DIRECT.
Status BlockReader::Impl::open_file(bool* direct_out) {
  bool direct = opt.allow_direct;
  if (direct) {
    fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0 && errno != EINVAL) {
      int e = errno;
      return Status::error(e, path + ": cannot open: " + std::strerror(e) + " (" + errno_name(e) + ")");
    }
    if (fd >= 0) {
      void* probe = alloc_aligned(kImageAlign);
      ssize_t n = ::pread(fd, probe, kImageAlign, 0);
      int e = errno;
      free_aligned(probe);
      if (n < 0 && e == EINVAL) {
        ::close(fd);
        fd = -1;
      }
    }
    if (fd < 0) {
      log_once(LogLevel::kWarn, "o_direct_refused",
               path + ": O_DIRECT refused (EINVAL); falling back to buffered reads with POSIX_FADV_DONTNEED");
      direct = false;
    }
  }
  if (!direct) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      return Status::error(e, path + ": cannot open: " + std::strerror(e) + " (" + errno_name(e) + ")");
    }
    backend = IoBackend::kBuffered;
    // No readahead: pages read ahead of a request would land in the page cache after that
    // request's DONTNEED and stay there.
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  }
  *direct_out = direct;
  return Status();
}

// The file as opened (Note [The image changing on disk] in block_reader.cpp).
Status BlockReader::Impl::stat_file() {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::error(errno, path + ": fstat: " + std::strerror(errno));
  size = static_cast<std::uint64_t>(st.st_size);
  mtime_ns = detail::mtime_ns(st);
  dev = st.st_dev;
  ino = st.st_ino;
  return Status();
}

void BlockReader::Impl::start() {
  requests.resize(backend == IoBackend::kIoUring ? opt.queue_depth : 1);
  Impl* raw = this;
  if (opt.disk) {
    disk = opt.disk;
    disk_id = disk->state().join([raw] {
      raw->disk_wakes.fetch_add(1);
      raw->work_cv.notify_all();
    });
  }
  worker = std::thread([raw] {
    pthread_setname_np(pthread_self(), "swapnet-io");
    if (raw->backend == IoBackend::kIoUring) raw->run_uring();
    else raw->run_pread();
  });
}

Status BlockReader::open(const std::string& path, const ReaderOptions& options, std::unique_ptr<BlockReader>* out) {
  Status s = check_options(path, options);
  if (!s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->opt = options;
  impl->emulate = options.emulate_bytes_per_s >= 0 ? options.emulate_bytes_per_s : detail::emulated_rate_from_env();
  if (impl->emulate > 0) {
    log_once(LogLevel::kInfo, "emulated_disk",
             "block readers emulate a disk of " + std::to_string(static_cast<long long>(impl->emulate / 1e6)) +
                 " MB/s (SWAPNET_EMULATE_READ or ReaderOptions::emulate_bytes_per_s)");
  }
  bool direct = false;
  s = impl->open_file(&direct);
  if (!s.ok()) return s;
  s = impl->stat_file();
  if (!s.ok()) return s;
  if (direct) {  // io_uring if the ring can be made, else pread
    impl->backend = IoBackend::kPreadDirect;
    if (options.allow_io_uring) impl->init_uring();
  }
  impl->start();
  log(LogLevel::kInfo, path + ": block reader on " + to_string(impl->backend) + ", " + u64s(options.request_bytes) +
                           "-byte requests, queue depth " + std::to_string(options.queue_depth));
  out->reset(new BlockReader(std::move(impl)));
  return Status();
}

}  // namespace swapnet
