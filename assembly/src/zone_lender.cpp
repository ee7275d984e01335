// The activation reserve lent to the read-ahead ring: the ZoneLender (zone_lender.h).
#include "zone_lender.h"

#include <algorithm>

#include "cpu_meter.h"
#include "swapnet/assembly.h"

namespace swapnet {

// Note [Lending the activation reserve]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A plan reserves the activations' peak for the whole inference, yet most layers use little of
// it: yolov3 reaches 57 MiB in its first layers and at most 27 MiB from layer 9 on, where its
// 18 MiB convolutions are; vgg19 reaches 39 MiB in its first convolutions and under 1 MiB in its
// fully connected layers. The partitioner's any-schedule bound (memory_bound_ms) lets weights
// use what activations leave; with a constant reserve the ring read one 18 MiB layer at a time
// there. On host memory the reserve is therefore the ring's *zone* (BlockRing `lend`, Note
// [Lending the activation reserve] in ring.cpp), one set of pages shared two ways:
//  - activations: the executor runs each inference under a CPU-meter account (the thread's, or
//    its own) whose region is the zone (detail::set_cpu_account_zone): libtorch's allocations
//    of >= 128 KiB are placed there from the top down, best fit;
//  - blocks: pump() pushes a block (or streams one, ending in the zone) only below a limit: the
//    zone bytes below what activations hold now (the lowest live chunk, the account's other
//    allocations, chunks left in a zone retired mid-inference, the inputs) and below what
//    they may reach while the block is held -- `lease`, per layer, from the next layer to the
//    block's last (across the inference boundary for the next inference's blocks). The limit
//    grows as layers end, so pump() runs after every layer, not only at block boundaries:
//    yolov3 at 83 MB kept its first 26 layers resident in one block, and the next swapped
//    block, held back by layer 2's 54 MB lease, waited for layer 25 where it could have been
//    read from layer 3 on (the disk idled 71 ms per inference at 400 MB/s; PipelineStats::
//    read_at_layer_end counts the reads this starts).
// Safety does not rest on the leases: the zone never places a chunk below its `floor`, the end
// of the highest block held (sync_zone, after every pump and before every layer), and a block
// never goes below what is live. An activation that finds no room goes to libtorch's
// allocator (counted: zone_misses) and the layer's lease becomes the whole zone. So a wrong
// lease costs memory or lending, never a byte of either.
// The leases are measured, not predicted: every layer's reach (the lowest chunk while it ran,
// plus the account's other bytes at their peak) is taken after it; one whole inference in a
// zone of this size makes them known (nothing is lent before), and after that they only grow.
// Chunks are placed where the same layer's went before (`prefer`), so the same shapes land
// in the same bytes every inference. Outputs leave the zone before finish() returns (copied:
// a caller keeping them would hold bytes the next inference plans to use). Not on the GPU,
// not while measuring a new input's activations (Note [Dynamic shapes]), and not where a host
// program's allocator outranks the meter (detail::cpu_meter_active). The zone's bytes count
// as activations: weight_memory() and the ring's accounting leave lent blocks out, and
// cpu_meter().peak_with_lent counts them with the activations they were lent by.
// The planner plans with it (lend_for, PartitionOptions::lend): its simulation lends by each
// layer's activation peak measured at pack, where the executor goes by what it measures.
bool ZoneLender::lends() const { return zone_id_ != 0 && ring_ != nullptr && ring_->lend() > 0; }

std::uint64_t ZoneLender::zone_bytes() const { return lends() ? ring_->lend() : 0; }

void ZoneLender::attach(BlockRing* ring, bool measuring, int next_layer) {
  if (ring == nullptr || ring->lend() == 0 || account_ == 0 || measuring) return;
  if (zone_id_ != 0 && detail::cpu_zone_use(account_, zone_id_, false).attached) return;
  if (zone_ring_ == ring) {
    zone_id_ = 0;
    return;
  }
  zone_ring_ = ring;
  ring_ = ring;
  zone_id_ = detail::set_cpu_account_zone(account_, ring->zone_begin(), ring->lend(), ring->memory());
  misses_seen_ = 0;
  lease_whole_ = false;
  if (lease_zone_ != ring->lend()) {
    lease_.assign(layers_, ring->lend());
    lease_known_ = false;
    lease_zone_ = ring->lend();
  }
  sync(next_layer);
}

void ZoneLender::drop(BlockRing* ring) {
  if (ring != nullptr && ring->lend() > 0) {
    if (lends()) detail::cpu_zone_give_back(account_, zone_id_);
    ring->discard_except({{ring->zone_begin(), ring->lend()}});
  }
  detach();
  ring_ = nullptr;
  zone_ring_ = nullptr;
}

void ZoneLender::detach() {
  if (zone_id_ != 0 && detail::cpu_zone_use(account_, zone_id_, false).attached) set_cpu_account_cache(account_, 0);
  zone_id_ = 0;
}

void ZoneLender::begin(int account, BlockRing* ring) {
  if (account != account_) detach();
  account_ = account;
  attach(ring, false, 0);
  if (lends() && !lease_known_) std::fill(lease_.begin(), lease_.end(), 0);
  lease_whole_ = lends();
  if (lends()) (void)detail::cpu_zone_use(account_, zone_id_, true);
}

std::uint64_t ZoneLender::max_lease(int a, int b) const {
  std::uint64_t v = 0;
  const int last = static_cast<int>(lease_.size()) - 1;
  for (int k = std::max(a, 0); k <= b && k <= last; ++k) v = std::max(v, lease_[k] + (k == last ? output_lease_ : 0));
  return v;
}

// The zone bytes activations may reach while a block is held: from the next layer to its last
// (over the inference boundary for a block of the next inference).
std::uint64_t ZoneLender::window_lease(int now, int last, bool next) const {
  if (!lease_known_) return ring_->lend();
  const int L = static_cast<int>(layers_);
  if (now < 0) return max_lease(0, last);
  // After the last layer and before finish() the last layer's lease holds (its outputs are
  // copied out of the zone there: output_lease_).
  now = std::min(now, L - 1);
  if (next) return std::max(max_lease(now, L - 1), max_lease(0, last));
  return max_lease(now, last);
}

std::uint64_t ZoneLender::ring_limit(const BlockRing& ring, int now, int last, bool next) const {
  if (!lends()) return ring.capacity();
  const detail::ZoneUse u = detail::cpu_zone_use(account_, zone_id_, false);
  if (!u.attached) return ring.capacity();
  const std::uint64_t z = ring.lend();
  // What activations hold now (in the zone, outside it, in zones retired mid-inference), or may
  // reach while the block is held.
  const std::uint64_t need = std::max(u.extent + u.unzoned + u.retired_live, window_lease(now, last, next)) + inputs_outside_;
  return ring.capacity() + (need >= z ? 0 : (z - need) / 4096 * 4096);
}

void ZoneLender::sync(int k) {
  if (!lends()) return;
  const std::uint64_t cap = ring_->capacity(), z = ring_->lend();
  const std::uint64_t end = ring_->held_end();
  const std::uint64_t floor = end > cap ? end - cap : 0;
  std::uint64_t prefer = floor;
  if (lease_known_ && k >= 0 && k < static_cast<int>(lease_.size())) prefer = std::max(floor, z - std::min(z, lease_[k]));
  detail::set_cpu_zone(account_, zone_id_, floor, prefer, ring_->lent_bytes());
}

void ZoneLender::measure(int k) {
  if (!lends()) return;
  const detail::ZoneUse u = detail::cpu_zone_use(account_, zone_id_, true);
  if (!u.attached) return;
  zone_peak_ = std::max(zone_peak_, u.peak);
  std::uint64_t reached = u.low_extent + u.unzoned_peak;  // the account's others share the reserve
  if (u.misses > misses_seen_) {  // never lend around this layer again
    log(LogLevel::kDebug, path_ + ": layer " + std::to_string(k) + ": " + std::to_string(u.misses - misses_seen_) +
                              " activations found no room in the zone (reached " + format_bytes(u.low_extent) +
                              " of " + format_bytes(ring_->lend()) + ", lent " + format_bytes(ring_->lent_bytes()) +
                              (lease_known_ ? "" : ", measuring") + ")");
    zone_misses_ += u.misses - misses_seen_;
    misses_seen_ = u.misses;
    reached = ring_->lend();
  }
  if (tracing()) trace_counter(tgroup_, "activations reached", static_cast<std::int64_t>(reached));
  if (k >= 0 && k < static_cast<int>(lease_.size())) {
    // Until known, `lease_` holds this inference's measurement (started at 0 in begin()).
    lease_[k] = std::max(lease_[k], reached);
  }
}

void ZoneLender::outputs_copied(std::uint64_t copied) {
  output_lease_ = std::max(output_lease_, copied);
  inputs_outside_ += copied;
}

void ZoneLender::end_inference() {
  if (lends() && lease_whole_) lease_known_ = true;
}

void ZoneLender::note_lent(const BlockRing* ring) {
  if (ring != nullptr) lent_peak_ = std::max(lent_peak_, ring->lent_bytes());
}

ZoneLender::Stats ZoneLender::stats() const {
  return Stats{zone_bytes(), lent_peak_, zone_peak_, zone_misses_};
}

}  // namespace swapnet
