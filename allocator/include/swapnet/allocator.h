// swapnet/allocator.h — memory that both processors can address, and what the machine offers.
//
// This is the one place where CUDA is touched (the "CUDA shim"): everything above asks
// cuda_device() and never writes #ifdef CUDA. On a machine without a driver or GPU the probe
// reports "no device" with the reason, once, in the log; that is a normal state, not an error.
//
// BlockRing: swapped blocks in read order, pushed at the head when they fit and popped once
// executed (Note [Block ring] in ring.cpp): a contiguous ring holds as many blocks as fit, in
// host memory or memory the GPU reads in place; asked not to be deep, two blocks at opposite ends.
//
// Arena: one per model, reserved once. Blocks are placed with no allocation per swap: even
// blocks from the low end, odd blocks from the high end, so two adjacent blocks fit exactly
// when their sizes add up to at most the arena's size (Note [Two-ended arena] in arena.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "swapnet/swapcore.h"

namespace swapnet {

struct DeviceInfo {
  bool built_with_cuda = false;  // compiled against the CUDA runtime (SWAPNET_WITH_CUDA)
  bool usable = false;           // a GPU answered and can be used
  int count = 0;                 // number of CUDA devices visible
  std::string name;              // device 0's name, when usable
  bool integrated = false;       // shares DRAM with the CPU (Jetson)
  bool concurrent_managed_access = false;  // CPU may touch managed memory while kernels run
  std::string reason;            // why not usable, e.g. "CUDA driver not found (cudaErrorInsufficientDriver)"
};

// Probes CUDA once per process (thread-safe) and logs the outcome once at info level.
SWAPNET_API const DeviceInfo& cuda_device();

// kManaged: cudaMallocManaged (both processors, one address); kHost: page-aligned anonymous
// memory (CPU only); kRegistered: anonymous memory pinned and mapped for the GPU with
// cudaHostRegister, for systems where O_DIRECT or io_uring refuse managed memory.
enum class MemoryKind { kManaged, kHost, kRegistered };
SWAPNET_API const char* to_string(MemoryKind k);

// How blocks in managed memory reach a discrete GPU that accesses managed memory concurrently
// (H100/H200): SWAPNET_GPU_PREFETCH = host (default) | advise | prefetch | none (Note [Managed
// memory on a discrete GPU], cuda_shim.cpp). Integrated GPUs (Jetson: same DRAM) and machines
// without a usable GPU: nothing is done. A failure is logged once and changes nothing else.
//
// gpu_managed_made: a managed arena was made; "host" advises it to stay in host memory, mapped
// for device 0.
SWAPNET_API void gpu_managed_made(void* p, std::uint64_t bytes);
// A block landed at [p, p+bytes): "prefetch" and "advise" start migrating it to device 0 on the
// shim's own stream (a hint: kernels that start earlier fault the rest in).
SWAPNET_API void gpu_prefetch(const void* p, std::uint64_t bytes);
// The policy in force may move pages under a read in flight ("prefetch" and "none" on a discrete
// GPU: both lost a block's data on an H100, caught by first fetches' checksums; nothing makes a
// later fetch safe), so every fetch must be checked, not only the first.
SWAPNET_API bool gpu_handover_may_lose_reads();
// The policy in force moves a block's pages to the GPU (any but "host", on a discrete GPU):
// measured only with blocks read whole into the two ends of the ring, far from each other.
SWAPNET_API bool gpu_handover_moves_pages();

// Bytes of memory this process holds through swapnet's allocator, process-wide.
struct MemoryStats {
  std::uint64_t current = 0;  // placed (in use) arena bytes now
  std::uint64_t peak = 0;     // highest `current` since the last reset
};
SWAPNET_API MemoryStats memory_stats();
SWAPNET_API void reset_memory_peak();

class SWAPNET_API Arena {
 public:
  // Reserves `capacity` bytes of address space (managed memory when a usable GPU exists and
  // `kind` allows it, else anonymous host memory, populated on touch; kRegistered: host memory
  // pinned at once, so the whole capacity counts). Throws Error with the size and the reason
  // when the reservation fails (kRegistered without a usable GPU included).
  static std::unique_ptr<Arena> create(std::uint64_t capacity, MemoryKind kind);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  MemoryKind kind() const { return kind_; }
  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t budget() const { return budget_; }

  // The usable size (<= capacity). Shrinking releases the physical pages beyond the new size
  // (madvise DONTNEED; advisory: a failure warns once); growing needs no new reservation.
  void set_budget(std::uint64_t bytes);

  // Places a block of `bytes` at the low or high end (4 KiB aligned). Returns nullptr if it does
  // not fit next to what is placed at the other end. Placing replaces the previous block at
  // that end. Accounting follows (memory_stats()).
  void* place(bool high, std::uint64_t bytes);
  void release(bool high);  // the block at that end is no longer used (swap-out: no write-back)
  // Gives the physical pages of [base + offset, +bytes) back now (page-rounded inwards); they
  // read as zeros afterwards. Host memory only (others: nothing).
  void discard(std::uint64_t offset, std::uint64_t bytes);
  std::uint64_t placed(bool high) const { return high ? high_ : low_; }
  char* base() const { return base_; }
  // The address the GPU uses for base() (the same except for kRegistered without unified
  // addressing).
  char* device_base() const { return device_base_; }

 private:
  Arena(char* base, std::uint64_t capacity, MemoryKind kind);
  char* base_;
  char* device_base_;
  std::uint64_t capacity_, budget_;
  std::uint64_t low_ = 0, high_ = 0;  // bytes placed at each end
  MemoryKind kind_;
};

// Swapped blocks in flight and executing, first in, first out (Note [Block ring]).
class SWAPNET_API BlockRing {
 public:
  // `deep`: a contiguous ring of `capacity` bytes (rounded up to pages) holding as many blocks
  // as fit (a block that does not fit before the end goes to the start), in memory of any kind
  // (the GPU's too). !deep: two blocks at the two ends of an Arena. `kept` (deep rings only):
  // that many bytes more, just before the ring's first byte, for the part of a block kept across
  // inferences (Note [Keeping part of a block] in
  // ring.cpp): kept_begin() .. base(); they count as used from the start. Throws Error with the
  // size and the reason when the memory cannot be had.
  // `lend` (deep rings in host memory only): that many bytes more after the ring's last byte,
  // the zone the executor shares between activations and blocks (Note [Lending the activation
  // reserve] in ring.cpp): zone_begin() .. zone_begin() + lend().
  static std::unique_ptr<BlockRing> create(std::uint64_t capacity, MemoryKind kind, bool deep = true,
                                           std::uint64_t kept = 0, std::uint64_t lend = 0);
  ~BlockRing();
  BlockRing(const BlockRing&) = delete;
  BlockRing& operator=(const BlockRing&) = delete;

  MemoryKind kind() const;
  bool deep() const;            // false: at most two blocks (two-ended)
  std::uint64_t capacity() const;
  // Whether a block of `bytes` can be pushed now, and pushing it: the address of `bytes`
  // contiguous bytes (4 KiB aligned), or nullptr when it does not fit next to the blocks held.
  bool fits(std::uint64_t bytes) const;
  void* push(std::uint64_t bytes);
  // The same for a block that may end up to `limit` bytes after base(), into the zone
  // (clamped to capacity() .. capacity() + lend()). The caller vouches that nothing else uses
  // the zone's bytes below `limit` while the block is held.
  bool fits(std::uint64_t bytes, std::uint64_t limit) const;
  void* push(std::uint64_t bytes, std::uint64_t limit);
  std::uint64_t lend() const;
  char* zone_begin() const;          // base() + capacity()
  std::uint64_t lent_bytes() const;  // bytes of blocks held in the zone now (not in used())
  // The end of the highest block held, as an offset from base() (0 when none, or not deep).
  std::uint64_t held_end() const;
  // Keeps the ring's memory mapped for as long as the caller holds it (activations placed in
  // the zone may outlive the ring).
  std::shared_ptr<void> memory() const;
  // Deep rings: pushes a block that does not fit yet where it will once the older blocks it
  // overlaps are gone (Note [Streaming into the ring] in ring.cpp); its bytes may be written
  // only where range_free() says so. Meanwhile blocks that overlap nothing held may still be
  // pushed after it (push, fits), but no other block streams until the overlap is gone
  // (streaming()). A block that fits is pushed as by push(); nullptr for a block larger than
  // the ring, while another block streams, or where the ring is not deep.
  void* push_streamed(std::uint64_t bytes);
  // The same where it may end up to `limit` bytes after base() (as push(bytes, limit)): its
  // bytes in the zone are free at once.
  void* push_streamed(std::uint64_t bytes, std::uint64_t limit);
  bool streaming() const;
  // Deep rings: pushes a block at the ring's first byte (right after the kept bytes), or
  // nullptr while any block holds some of [base(), base() + bytes). push_first_streamed: as
  // push_streamed, at the first byte.
  void* push_first(std::uint64_t bytes);
  void* push_first_streamed(std::uint64_t bytes);
  char* kept_begin() const;
  std::uint64_t kept() const;
  // Whether no block older than the streaming one holds any of [p, p + bytes) (always, when
  // none streams).
  bool range_free(const void* p, std::uint64_t bytes) const;
  // Deep rings: the oldest block gives back its bytes before `p` (page-rounded down), once the
  // layers those bytes hold have run (Note [Giving a block back layer by layer] in ring.cpp); a
  // block streaming over them may then read there. Returns the bytes given back (0 when `p` is
  // not inside the oldest block, or the ring is not deep).
  std::uint64_t release_front_until(const void* p);
  void pop();    // releases the oldest block (swap-out: no write-back)
  void clear();  // releases every block
  std::size_t blocks() const;
  std::uint64_t used() const;   // bytes of the blocks held (page-rounded; not lent ones), and the kept bytes
  // The memory blocks are placed in (capacity bytes), e.g. to register with the block reader;
  // device_address() is the GPU's address of a pushed block.
  char* base() const;
  char* device_address(void* p) const;
  // Gives the physical pages of the whole ring (and the kept bytes) back at once but for those
  // under `keep` (ranges of pushed blocks or kept bytes, page-rounded outwards); what is given
  // back reads as zeros afterwards.
  // The blocks stay pushed (their accounting too): for a ring about to be replaced. Host memory
  // only (managed memory: nothing).
  void discard_except(const std::vector<std::pair<const char*, std::uint64_t>>& keep);

 private:
  struct Impl;
  explicit BlockRing(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where a deep ring places a block (Note [Holes in the ring] and Note [Streaming into the ring] in
// ring.cpp), from the blocks it holds (offsets from base(), oldest first) and where the newest
// ends (`head`): BlockRing and the planner's simulation of it both place blocks with these.
struct RingBlock {
  std::uint64_t offset = 0, bytes = 0;
};
constexpr std::uint64_t kNoRingSlot = ~std::uint64_t{0};
// A block of `bytes` ending at most at `limit` over no byte held: after the newest block when
// those bytes are free, else the lowest free range; kNoRingSlot when none. Sorts `held`.
SWAPNET_API std::uint64_t ring_slot(std::vector<RingBlock>& held, std::uint64_t head, std::uint64_t bytes,
                                    std::uint64_t limit);
// A streamed block of `bytes` ending at most at `limit` (>= bytes): of the places after the
// newest block, at the start, after each block held and ending at `limit`, the one whose newest
// block overlapped leaves first, then the one over the fewest held bytes.
SWAPNET_API std::uint64_t ring_stream_slot(const std::vector<RingBlock>& held, std::uint64_t head, std::uint64_t bytes,
                                           std::uint64_t limit);

}  // namespace swapnet
