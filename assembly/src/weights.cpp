// The weights in memory for the plan in force (weights.h).
#include "weights.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <cstring>

#include "planning.h"

namespace swapnet {

void Weights::note_in_use(std::uint32_t tgroup) {
  if (!ring && !kept) return;
  peak = std::max(peak, (ring ? ring->used() : 0) + kept_bytes + pinned_need);
  trace(tgroup);
}

void Weights::trace(std::uint32_t tgroup) const {
  if (!tracing()) return;
  trace_counter(tgroup, "weights held", static_cast<std::int64_t>((ring ? ring->used() : 0) + kept_bytes + pinned_need));
  if (ring && ring->lend() > 0) trace_counter(tgroup, "blocks in the zone", static_cast<std::int64_t>(ring->lent_bytes()));
}

void Weights::make(const ExecutionPlan& p, MemoryKind memory, std::uint64_t lend, const std::string& path) {
  if (p.arena_bytes > 0) {
    ring = BlockRing::create(p.arena_bytes, memory, p.read_ahead == ReadAhead::kRing, p.retained_bytes, lend);
  }
  retained_valid = false;
  kept_at.assign(p.blocks.size(), 0);
  kept_state.assign(p.blocks.size(), Kept::kNone);
  std::uint64_t bytes = 0;
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    if (p.resident[b]) {
      kept_at[b] = bytes;
      bytes += p.block_bytes[b];
    }
  }
  kept_bytes = bytes;
  if (bytes > 0) {
    kept = Arena::create(bytes, memory);
    if (kept->place(false, bytes) == nullptr) throw Error(path + ": internal: resident blocks do not fit");
  }
}

void Weights::read_pinned(const ImageInfo& info, Skeleton& sk, BlockReader& reader, const DeviceBackend& backend,
                          MemoryKind memory, const std::string& path) {
  pinned_bytes(info, sk, block_of_layer(info, plan.blocks), plan.resident, &pinned);
  if (pinned.empty()) return;
  std::uint64_t need = 0;
  std::vector<std::uint64_t> at;
  for (int s : pinned) {
    at.push_back(need);
    need += (info.tensors[s].nbytes + 63) / 64 * 64;
  }
  pinned_need = need;
  char* pinned_at = nullptr;  // CPU address of the pinned slots
  pinned_gpu = backend.pinned_arena(need, memory);
  if (pinned_gpu) {
    pinned_at = static_cast<char*>(pinned_gpu->place(false, need));
  } else {
    pinned_buf = alloc_aligned(need);
    pinned_at = static_cast<char*>(pinned_buf);
  }
  std::uint64_t scratch_len = 0;
  for (int s : pinned) scratch_len = std::max(scratch_len, info.layers[info.tensors[s].layer].size);
  void* scratch = alloc_aligned(scratch_len);
  if (pinned_at == nullptr || scratch == nullptr) {
    free_aligned(scratch);
    throw Error(path + ": cannot allocate " + format_bytes(need) + " for shared weights");
  }
  for (size_t i = 0; i < pinned.size(); ++i) {
    const ImageTensor& t = info.tensors[pinned[i]];
    const ImageLayer& L = info.layers[t.layer];
    Status s = reader.read(L.offset, L.size, scratch, {{L.offset, L.size, L.checksum, "layer " +
                                                        std::to_string(t.layer) + " (" + L.name + ")"}});
    if (!s.ok()) {
      free_aligned(scratch);
      throw Error(s.message());
    }
    char* dst = pinned_at + at[i];
    std::memcpy(dst, static_cast<char*>(scratch) + (t.offset - L.offset), t.nbytes);
    const SlotInfo& sl = sk.slots()[pinned[i]];
    void* view = pinned_gpu ? backend.address(*pinned_gpu, dst) : dst;
    pinned_views.push_back(at::for_blob(view, sl.sizes)
                               .strides(sl.strides)
                               .options(at::TensorOptions().dtype(sl.dtype).device(backend.device()))
                               .target_device(backend.device())
                               .make_tensor());
  }
  free_aligned(scratch);
  if (pinned_gpu) backend.hand_over(pinned_gpu->kind(), pinned_at, need);
  rebind_pinned(sk);
}

void Weights::rebind_pinned(Skeleton& sk) const {
  for (size_t i = 0; i < pinned.size(); ++i) sk.bind_slot(pinned[i], pinned_views[i]);
}

std::uint64_t Weights::shed(const ImageInfo& info, int block, const std::vector<std::pair<int, int>>& keep_layers,
                            const char* at_ring, int at_first) {
  auto offset = [&](int layer) { return info.layers[layer].offset; };
  std::uint64_t held = 0;  // bytes kept
  // The ring: only the running layer's bytes, when it runs from a swapped block.
  if (ring) {
    std::vector<std::pair<const char*, std::uint64_t>> keep;
    if (at_ring != nullptr) {
      for (const auto& [a, b] : keep_layers) {
        if (a < at_first) continue;
        keep.emplace_back(at_ring + (offset(a) - offset(at_first)), layers_span(info, a, b));
        held += layers_span(info, a, b);
      }
    }
    // The zone is the activation reserve (Note [Lending the activation reserve]): activations of
    // the running layer live there; blocks lent its bytes are within it.
    if (ring->lend() > 0) keep.emplace_back(ring->zone_begin(), ring->lend());
    ring->discard_except(keep);
    retained_valid = false;  // the kept bytes went too, but for the running layer's
  }
  // Resident blocks: dropped (but the running layer's bytes, when it runs from one).
  if (kept) {
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      if (!plan.resident[b] || plan.block_bytes[b] == 0) continue;
      const std::uint64_t base = kept_at[b];
      std::uint64_t at = base;
      if (static_cast<int>(b) == block) {
        std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
        for (const auto& [a, e] : keep_layers) {
          ranges.emplace_back(base + (offset(a) - offset(plan.blocks[b].first)), layers_span(info, a, e));
        }
        std::sort(ranges.begin(), ranges.end());
        for (const auto& [off, len] : ranges) {
          if (off > at) kept->discard(at, off - at);
          at = std::max(at, off + len);
          held += len;
        }
      }
      kept->discard(at, base + plan.block_bytes[b] - at);
      kept_state[b] = Kept::kNone;
    }
  }
  return held;
}

void Weights::free_resident() {
  kept.reset();
  kept_bytes = 0;
  kept_state.assign(kept_state.size(), Kept::kNone);
  drop_pinned();
}

void Weights::drop_pinned() {
  pinned.clear();
  pinned_views.clear();
  free_aligned(pinned_buf);
  pinned_buf = nullptr;
  pinned_gpu.reset();
  pinned_need = 0;
}

}  // namespace swapnet
