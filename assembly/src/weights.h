// The weights in memory for the plan in force (internal to the assembly module): the ring of
// swapped blocks, the resident arena, the pinned slots. The executor decides when they are made
// and freed (adopt, shed, release); the BlockCursor reads into them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_backend.h"
#include "swapnet/assembly.h"

namespace swapnet {

// The weights in memory for the plan in force: the ring of swapped blocks, the resident arena,
// the pinned slots (shared weights read outside their block), and what they hold.
struct Weights {
  ExecutionPlan plan;
  std::unique_ptr<BlockRing> ring;     // swapped blocks in flight and executing
  std::unique_ptr<Arena> kept;         // resident blocks, one after another
  std::vector<std::uint64_t> kept_at;  // per block: its offset in `kept` (resident blocks)
  enum class Kept : char { kNone, kLoading, kLoaded };
  std::vector<Kept> kept_state;        // per block (resident ones)
  std::vector<int> pinned;             // slot indices kept resident
  void* pinned_buf = nullptr;          // their bytes on the host
  std::unique_ptr<Arena> pinned_gpu;   // their bytes where the device reads them
  std::vector<at::Tensor> pinned_views;
  std::uint64_t kept_bytes = 0;        // resident blocks' arena
  std::uint64_t pinned_need = 0;       // pinned slots' buffer
  std::uint64_t peak = 0;              // Executor::weight_memory().peak
  bool registered = false;             // the ring is registered with the reader
  // The ring's kept bytes hold the first plan.retained_bytes of block plan.retain_block, read
  // whole once since the ring was made (Note [Keeping part of a block] in ring.cpp).
  bool retained_valid = false;

  // Weights in use now (blocks in the ring, resident blocks, pinned slots; blocks lent the
  // activation zone apart: the zone is the activation reserve's) into `peak`, and traced.
  void note_in_use(std::uint32_t tgroup);
  void trace(std::uint32_t tgroup) const;  // the weights held, the blocks in the zone

  // The ring and resident arena of plan `p` (the old ones freed first), the ring lending `lend`
  // bytes of the activation reserve; throws Error naming `path` where they cannot be had.
  void make(const ExecutionPlan& p, MemoryKind memory, std::uint64_t lend, const std::string& path);
  // The pinned slots of the plan in force: read once, each from its own layer's range, into one
  // buffer where the backend's device reads them, bound in `sk`.
  void read_pinned(const ImageInfo& info, Skeleton& sk, BlockReader& reader, const DeviceBackend& backend,
                   MemoryKind memory, const std::string& path);
  void rebind_pinned(Skeleton& sk) const;
  // Note [Shedding] (executor_memory.cpp): gives back every byte of the ring and the resident
  // blocks but the byte ranges of layers `keep` ([first, last] each) of block `block`, and the
  // ring's activation zone. `at`: where the ring holds that block from layer `at_first` on
  // (nullptr: not in the ring). The ring must be unregistered from the reader. Returns the bytes
  // kept; resident blocks are to be read again.
  std::uint64_t shed(const ImageInfo& info, int block, const std::vector<std::pair<int, int>>& keep, const char* at,
                     int at_first);
  void drop_pinned();  // frees the pinned slots' buffer (their views are dropped first)
  // Frees the resident blocks and the pinned slots (Executor::release; the ring goes with its
  // zone, ZoneLender::drop, first).
  void free_resident();
};

}  // namespace swapnet
