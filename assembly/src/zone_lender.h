// The activation reserve lent to the read-ahead ring (internal to the assembly module; Note
// [Lending the activation reserve] in zone_lender.cpp). The ZoneLender makes the ring's zone the
// region of a CPU-meter account, measures how far each layer's activations reach into it
// (`lease`), and says how far blocks may reach into it now (ring_limit). It holds no ring: the
// ring it lends is passed in, and the executor decides when a ring is made or dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swapnet/allocator.h"

namespace swapnet {

class ZoneLender {
 public:
  ZoneLender(std::string path, std::size_t layers) : path_(std::move(path)), lease_(layers, 0), layers_(layers) {}
  ZoneLender(const ZoneLender&) = delete;
  ZoneLender& operator=(const ZoneLender&) = delete;

  void set_trace_group(std::uint32_t g) { tgroup_ = g; }
  // Whether activations and blocks share the ring's zone now.
  bool lends() const;
  // The account activations are charged to while lending (0: none).
  int account() const { return account_; }
  // Makes `ring`'s zone the account's region (when it is not already), unless `measuring` (a new
  // input's activations are measured without a zone). A ring's zone is attached once: after it
  // was detached its region's chunks may still live there; that ring lends nothing more.
  // `next_layer`: where the inference in progress goes on (0: none).
  void attach(BlockRing* ring, bool measuring, int next_layer);
  // `ring` goes (a new plan, or release): the zone's holes and the ring's pages go back now.
  void drop(BlockRing* ring);
  // The zone stops being the account's region (its live chunks keep its pages until freed).
  void detach();
  // An inference begins charged to `account` (the thread's, or the executor's own) on `ring`.
  void begin(int account, BlockRing* ring);
  // The inference's input tensors outside the zone (the reserve counts them).
  void set_inputs_outside(std::uint64_t bytes) { inputs_outside_ = bytes; }
  // Where a block held over layers now..last may end, as an offset from the ring's base (`now`
  // -1: no inference in progress; `next`: a block of the next inference).
  std::uint64_t ring_limit(const BlockRing& ring, int now, int last, bool next) const;
  // Tells the zone where blocks end and where layer k's activations went before.
  void sync(int k);
  // After layer k ran: how far its activations reached, and whether any found no room.
  void measure(int k);
  // finish(): `copied` output bytes left the zone; the inference ended (one whole inference in
  // this zone measured every layer's reach).
  void outputs_copied(std::uint64_t copied);
  std::uint64_t zone_bytes() const;  // the zone lent now (0: none)
  void end_inference();
  void note_lent(const BlockRing* ring);  // the ring's lent bytes now, for lent_peak

  struct Stats {
    std::uint64_t zone_bytes = 0, lent_peak = 0, zone_peak = 0, zone_misses = 0;
  };
  Stats stats() const;

 private:
  std::uint64_t max_lease(int a, int b) const;
  std::uint64_t window_lease(int now, int last, bool next) const;

  std::string path_;
  std::uint32_t tgroup_ = 0;
  BlockRing* ring_ = nullptr;           // the ring attached last (its zone is lent while zone_id_)
  const BlockRing* zone_ring_ = nullptr;  // the ring whose zone was attached last
  int account_ = 0;
  std::uint64_t zone_id_ = 0;
  std::uint64_t inputs_outside_ = 0;
  // Per layer: the zone bytes (from its end) activations reached while it ran, known once one
  // whole inference measured it in a zone of lease_zone_ bytes; it only grows after that.
  std::vector<std::uint64_t> lease_;
  std::size_t layers_;
  bool lease_known_ = false;
  bool lease_whole_ = false;  // this inference ran in one zone from its first layer
  std::uint64_t lease_zone_ = 0;
  std::uint64_t misses_seen_ = 0;  // the zone's misses at the last look
  std::uint64_t lent_peak_ = 0;
  std::uint64_t zone_misses_ = 0;
  std::uint64_t zone_peak_ = 0;
  // The bytes the last inference's outputs were copied out of the zone in: the last layer's
  // lease counts them, and so do the inputs until the next begin().
  std::uint64_t output_lease_ = 0;
};

}  // namespace swapnet
