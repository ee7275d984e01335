// The block ring: swapped blocks in flight and executing, first in, first out.
//
// Note [Block ring]
// ~~~~~~~~~~~~~~~~~
// Blocks are used in the order they are read: the executor pushes the next block at the head
// as soon as it fits and pops the oldest once it has executed. In host memory the ring is
// *mirrored*: one memfd of `capacity` bytes mapped twice, back to back, so the bytes at
// base + x and base + capacity + x are the same page. A block of up to `capacity` bytes placed
// at any offset of the first mapping is then contiguous in virtual memory even where it wraps
// around the end, and the ring holds exactly as many blocks as their bytes allow: no space is
// lost to wrap-around, and read-ahead is as deep as the budget. The reader DMAs into either
// view (O_DIRECT and io_uring fixed buffers accept shared memfd pages). The memory is the
// memfd's pages, counted once by the kernel and by cgroups; RSS counts a page once per
// mapping, so the second view is unmapped behind each block that wrapped into it (it then
// over-counts by at most the one block straddling the end).
//
// Memory the GPU reads in place (managed, or registered) cannot be mapped twice; there the ring
// is the two-ended arena (Note [Two-ended arena]): at most two blocks, at opposite ends, which
// is the paper's pipeline and still guarantees progress whenever any two consecutive blocks fit.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <deque>

#include "accounting.h"
#include "swapnet/allocator.h"

namespace swapnet {
namespace {

constexpr std::uint64_t kPage = 4096;  // bytes
std::uint64_t page_up(std::uint64_t v) { return (v + kPage - 1) / kPage * kPage; }

}  // namespace

struct BlockRing::Impl {
  MemoryKind kind = MemoryKind::kHost;
  std::uint64_t capacity = 0;
  // Mirrored: the memfd and the 2 x capacity mapping.
  int fd = -1;
  char* base = nullptr;
  std::uint64_t head = 0;  // offset where the next block goes (mod capacity)
  // Two-ended otherwise.
  std::unique_ptr<Arena> arena;
  struct Entry {
    std::uint64_t offset = 0;  // mirrored: offset in the ring; two-ended: 0 low, 1 high
    std::uint64_t bytes = 0;
  };
  std::deque<Entry> fifo;
  std::uint64_t used = 0;

  ~Impl() {
    if (base != nullptr) {
      account_memory(-static_cast<std::int64_t>(used));  // a two-ended arena accounts its own
      ::munmap(base, 2 * capacity);
    }
    if (fd >= 0) ::close(fd);
  }
};

std::unique_ptr<BlockRing> BlockRing::create(std::uint64_t capacity, MemoryKind kind, bool mirror) {
  capacity = page_up(capacity);
  if (capacity == 0) throw Error("block ring: capacity must be positive");
  auto impl = std::make_unique<Impl>();
  impl->capacity = capacity;
  const bool host = kind == MemoryKind::kHost || (kind == MemoryKind::kManaged && !cuda_device().usable);
  if (host && mirror) {
    std::string why;
    int fd = ::memfd_create("swapnet-ring", MFD_CLOEXEC);
    if (fd < 0) {
      why = std::string("memfd_create: ") + std::strerror(errno);
    } else if (::ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
      why = std::string("ftruncate: ") + std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
    if (fd >= 0) {
      void* reserve = ::mmap(nullptr, 2 * capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      char* b = static_cast<char*>(reserve);
      if (reserve == MAP_FAILED) {
        why = std::string("reserving address space: ") + std::strerror(errno);
        b = nullptr;
      } else {
        for (int half = 0; half < 2 && b != nullptr; ++half) {
          void* p = ::mmap(b + half * capacity, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
          if (p == MAP_FAILED) {
            why = std::string("mapping the ring twice: ") + std::strerror(errno);
            ::munmap(b, 2 * capacity);
            b = nullptr;
          }
        }
      }
      if (b == nullptr) {
        ::close(fd);
        fd = -1;
      }
      impl->fd = fd;
      impl->base = b;
    }
    if (impl->base != nullptr) {
      impl->kind = MemoryKind::kHost;
      return std::unique_ptr<BlockRing>(new BlockRing(std::move(impl)));
    }
    log_once(LogLevel::kWarn, "ring_mirror",
             "block ring: cannot map a mirrored ring (" + why + "); read-ahead is limited to two blocks");
  }
  impl->arena = Arena::create(capacity, kind);
  impl->kind = impl->arena->kind();
  impl->capacity = impl->arena->capacity();
  return std::unique_ptr<BlockRing>(new BlockRing(std::move(impl)));
}

BlockRing::BlockRing(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockRing::~BlockRing() = default;

MemoryKind BlockRing::kind() const { return impl_->kind; }
bool BlockRing::mirrored() const { return impl_->base != nullptr; }
std::uint64_t BlockRing::capacity() const { return impl_->capacity; }
std::size_t BlockRing::blocks() const { return impl_->fifo.size(); }
std::uint64_t BlockRing::used() const { return impl_->used; }

char* BlockRing::base() const { return impl_->base != nullptr ? impl_->base : impl_->arena->base(); }
std::uint64_t BlockRing::mapped_bytes() const { return impl_->base != nullptr ? 2 * impl_->capacity : impl_->capacity; }

char* BlockRing::device_address(void* p) const {
  if (impl_->base != nullptr) return static_cast<char*>(p);
  return impl_->arena->device_base() + (static_cast<char*>(p) - impl_->arena->base());
}

bool BlockRing::fits(std::uint64_t bytes) const {
  const Impl& m = *impl_;
  bytes = page_up(bytes);
  if (m.base != nullptr) return bytes <= m.capacity - m.used;
  if (m.fifo.size() >= 2) return false;
  return bytes <= m.capacity - m.used;
}

void* BlockRing::push(std::uint64_t bytes) {
  Impl& m = *impl_;
  bytes = page_up(bytes);
  if (!fits(bytes)) return nullptr;
  void* p = nullptr;
  Impl::Entry e;
  e.bytes = bytes;
  if (m.base != nullptr) {
    e.offset = m.head;
    p = m.base + m.head;
    m.head = (m.head + bytes) % m.capacity;
  } else {
    // The end opposite the block already there (low when the ring is empty).
    const bool high = !m.fifo.empty() && m.fifo.back().offset == 0;
    e.offset = high ? 1 : 0;
    p = m.arena->place(high, bytes);
    if (p == nullptr) return nullptr;
  }
  m.fifo.push_back(e);
  m.used += bytes;
  if (m.base != nullptr) account_memory(static_cast<std::int64_t>(bytes));  // the arena accounts its own
  return p;
}

void BlockRing::pop() {
  Impl& m = *impl_;
  if (m.fifo.empty()) return;
  const Impl::Entry e = m.fifo.front();
  m.fifo.pop_front();
  m.used -= e.bytes;
  if (m.base != nullptr) {
    account_memory(-static_cast<std::int64_t>(e.bytes));
    if (e.offset + e.bytes > m.capacity) {
      // The part that wrapped was reached through the second view. Unmap it there (the pages
      // stay in the memfd, mapped by the first view): otherwise RSS, which counts a page once
      // per mapping, would come to count the ring twice.
      if (::madvise(m.base + m.capacity, e.offset + e.bytes - m.capacity, MADV_DONTNEED) != 0) {
        log_once(LogLevel::kWarn, "ring_madvise", std::string("block ring: madvise: ") + std::strerror(errno));
      }
    }
    if (m.fifo.empty()) m.head = 0;  // start over at the beginning: fewer pages touched
  } else {
    m.arena->release(e.offset == 1);
  }
}

void BlockRing::clear() {
  while (!impl_->fifo.empty()) pop();
}

void BlockRing::discard_except(const std::vector<std::pair<const char*, std::uint64_t>>& keep) {
  Impl& m = *impl_;
  // Ranges to keep as offsets into the memfd (or the arena), split where they wrap.
  const std::uint64_t cap = m.capacity;
  const char* base = m.base != nullptr ? m.base : m.arena->base();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> kept;  // [begin, end)
  for (const auto& [p, bytes] : keep) {
    if (bytes == 0) continue;
    std::uint64_t off = static_cast<std::uint64_t>(p - base);
    std::uint64_t a = off / kPage * kPage, b = page_up(off + bytes);
    if (m.base != nullptr) {
      a %= cap;
      b = a + (b - off / kPage * kPage);
      if (b > cap) {
        kept.emplace_back(a, cap);
        kept.emplace_back(0, b - cap);
        continue;
      }
    }
    kept.emplace_back(a, std::min(b, cap));
  }
  std::sort(kept.begin(), kept.end());
  std::uint64_t at = 0;
  auto drop = [&](std::uint64_t a, std::uint64_t b) {
    if (b <= a) return;
    if (m.base != nullptr) {
      if (::fallocate(m.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(a),
                      static_cast<off_t>(b - a)) != 0) {
        log_once(LogLevel::kWarn, "ring_punch", std::string("block ring: fallocate(PUNCH_HOLE): ") + std::strerror(errno));
      }
    } else {
      m.arena->discard(a, b - a);
    }
  };
  for (const auto& [a, b] : kept) {
    drop(at, a);
    at = std::max(at, b);
  }
  drop(at, cap);
}

}  // namespace swapnet
