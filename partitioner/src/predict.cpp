// What a plan costs: the paper's pipeline prediction (predict_ms), evaluate() that fills a
// partition's sizes and prediction (predict_ms or, with a ring, simulate_ms in simulate.cpp),
// and the choice between the contiguous ring and two ends of the same bytes.
#include "swapnet/partitioner.h"

#include "prefix.h"

#include <algorithm>
#include <utility>

namespace swapnet {

using detail::Prefix;

double predict_ms(const std::vector<LayerCost>& layers, const Blocks& blocks, const std::vector<char>& resident,
                  const CostModel& m) {
  Prefix p(layers);
  double t = 0;           // compute clock
  double fetched = 0;     // when the next swapped block's fetch completes
  // The first swapped block is fetched from time 0, during the resident prefix.
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (!resident[b]) {
      fetched = p.io(blocks[b].first, blocks[b].second, m);
      break;
    }
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    const auto [i, j] = blocks[b];
    if (resident[b]) {
      t += p.ex(i, j);
      continue;
    }
    t = std::max(t, fetched) + p.bind(i, j, m);
    // Submit the next swapped block now (this one is bound; the one before it is released).
    for (size_t c = b + 1; c < blocks.size(); ++c) {
      if (!resident[c]) {
        fetched = t + p.io(blocks[c].first, blocks[c].second, m);
        break;
      }
    }
    t += p.ex(i, j) + p.out(i, j, m);
  }
  return t + m.inference_ms;
}

const char* to_string(ReadAhead r) {
  switch (r) {
    case ReadAhead::kRing: return "ring";
    case ReadAhead::kTwoEnded: return "two-ended";
    default: return "paper";
  }
}

bool prefer_two_ended(const std::vector<LayerCost>& layers, const CostModel& m, Partition* p) {
  if (p->ring_depth != 0 || p->ring_bytes == 0 || p->read_bytes == 0 || p->retain_block >= 0) return false;
  if (p->arena_bytes > p->ring_bytes) return false;  // two ends need a pair; the ring holds less
  Partition two = *p;
  two.ring_depth = 2;
  evaluate(layers, m, &two);
  if (two.predicted_ms >= p->predicted_ms - 1e-12) return false;
  *p = std::move(two);
  return true;
}

void evaluate(const std::vector<LayerCost>& layers, const CostModel& m, Partition* part) {
  Prefix p(layers);
  part->arena_bytes = part->resident_bytes = part->read_bytes = part->block_max = 0;
  std::uint64_t prev = 0;
  bool have_prev = false;
  for (size_t b = 0; b < part->blocks.size(); ++b) {
    const std::uint64_t s = p.b(part->blocks[b].first, part->blocks[b].second);
    if (part->resident[b]) {
      part->resident_bytes += s;
      continue;
    }
    const std::uint64_t kept = static_cast<int>(b) == part->retain_block ? std::min(part->retained_bytes, s) : 0;
    part->read_bytes += s - kept;
    part->block_max = std::max(part->block_max, s - kept);
    part->arena_bytes = std::max(part->arena_bytes, have_prev ? prev + s : s);
    prev = s;
    have_prev = true;
  }
  part->predicted_ms = part->ring_bytes == 0
                           ? predict_ms(layers, part->blocks, part->resident, m)
                           : simulate_ms(layers, part->blocks, part->resident, part->ring_bytes, part->ring_depth, m,
                                         true, part->retain_block, part->retained_bytes, true, part->lend_bytes);
}

}  // namespace swapnet
