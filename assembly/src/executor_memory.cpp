// Memory: shed() at a budget cut mid-layer (Note [Shedding]), release(), the C heap given back
// (Note [Giving the C heap back]), and what the executor holds and counted.
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "executor_impl.h"

namespace swapnet {

// Note [Giving the C heap back]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// libtorch mallocs and frees activations at every layer, and glibc keeps freed memory for reuse
// (once a large chunk has been freed it also raises its mmap threshold, so later large chunks
// come from the heap and stay there). In bench/soak.sh that was 300-400 MB of RSS the process
// did not use (mallinfo2's free bytes; live heap flat at ~100 MB), growing as the budget cycled:
// RSS the budget does not have. After a change that shrinks the budget, and on release, the
// executor asks glibc to give the free pages of every arena back (malloc_trim(0); what it keeps
// is reused as before, and the settings of the host process are not touched).
void give_heap_back(const std::string& path) {
#if defined(__GLIBC__)
  const auto t0 = std::chrono::steady_clock::now();
  malloc_trim(0);
  log(LogLevel::kDebug, path + ": C heap trimmed in " +
                            std::to_string(std::chrono::duration<double, std::milli>(
                                               std::chrono::steady_clock::now() - t0).count()) + " ms");
#else
  (void)path;
#endif
}

// Note [Shedding]
// ~~~~~~~~~~~~~~~
// A layer cannot be stopped, and one layer of a big model on a busy CPU can take hundreds of
// milliseconds; a budget cut should not wait for it. shed() (from any thread) takes the executor
// while the layer runs (the thread using it releases `mu` only around run_layer) and gives back
// at once everything that layer does not read: reads in flight are cancelled and waited for,
// the ring's pages are punched out but for the running layer's bytes (and the layers owning
// weights it reads), resident blocks are dropped (read again later). The layer's own weights and
// the pinned slots stay: at most the minimum budget. When the layer ends the thread sees
// `shed_pending` and stops before the next layer; the next set_budget() (or the next step(), at the
// budget in force) re-plans from there and reads what it needs again. Not on the GPU (kernels
// run ahead of this thread: there is no one running layer to keep).
bool Executor::shed(std::uint64_t budget) {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  if (!m.caps().sheds || m.released || m.shed_pending || m.w.plan.total() <= budget) return false;
  const auto t0 = std::chrono::steady_clock::now();
  // What the running layer reads: its own bytes and those of the layers in its block owning
  // weights it uses (weights owned outside its block are pinned).
  std::vector<std::pair<int, int>> keep_layers;  // [first, last] of byte ranges to keep, as layers
  int block = -1;
  const int k = m.running_layer;
  if (k >= 0) {
    for (size_t b = 0; b < m.w.plan.blocks.size(); ++b) {
      if (m.w.plan.blocks[b].first <= k && k <= m.w.plan.blocks[b].second) block = static_cast<int>(b);
    }
    keep_layers.emplace_back(k, k);
    for (int s : m.sk.layers()[k].used_slots) {
      const int owner = m.sk.slots()[s].layer;
      if (block >= 0 && owner >= m.w.plan.blocks[block].first && owner < k) keep_layers.emplace_back(owner, owner);
    }
  }
  // Reads: cancelled, and waited for (their pages are about to go), the running block's
  // pieces after the running layer too (Note [Layer by layer]).
  m.cursor->drop_fetches();
  // Registered (io_uring fixed buffer) pages are pinned by the kernel: dropping them from the
  // mapping would not free them. The reader is idle now: unregister first.
  if (m.w.registered) {
    m.w.registered = !m.reader->register_buffers({});
    if (m.w.registered) log(LogLevel::kError, m.path + ": internal: reads in flight after cancelling them; the ring stays pinned");
  }
  // The ring's bytes and the resident blocks, but for the running layer's (when it runs from a
  // swapped block: where the cursor read it).
  const Fetch* cf = m.cursor->executing();
  const bool from_ring = block >= 0 && !m.w.plan.resident[block] && cf != nullptr && cf->block == block;
  const std::uint64_t kept = m.w.shed(m.info, block, keep_layers, from_ring ? cf->at : nullptr, from_ring ? cf->first : 0);
  m.shed_pending = true;
  m.shed_held = kept + m.w.pinned_need;
  log(LogLevel::kDebug, m.path + ": shed down to " + format_bytes(m.shed_held) + " (layer " + std::to_string(k) +
                            " running) in " +
                            std::to_string(std::chrono::duration<double, std::milli>(
                                               std::chrono::steady_clock::now() - t0).count()) +
                            " ms");
  return true;
}

const ExecutionPlan& Executor::plan() const { return impl_->w.plan; }
const ImageInfo& Executor::info() const { return impl_->planner->view(); }
const Skeleton& Executor::skeleton() const { return impl_->sk; }
std::uint64_t Executor::bytes_read() const { return impl_->reader->bytes_read(); }
void Executor::set_read_priority(double priority) { impl_->reader->set_priority(priority); }
std::uint64_t Executor::bytes_used() const { return impl_->cursor->stats().used_bytes; }
Executor::PipelineStats Executor::pipeline_stats() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  PipelineStats p;
  p.read_wait_ms = impl_->cursor->stats().read_wait_seconds * 1e3;
  p.layers_started_early = impl_->counters.layers_started_early;
  p.released_early_bytes = impl_->backend->released_early();
  p.read_past_streamed = impl_->cursor->stats().read_past_streamed;
  p.read_at_layer_end = impl_->counters.read_at_layer_end;
  const ZoneLender::Stats z = impl_->lender.stats();
  p.zone_bytes = z.zone_bytes;
  p.lent_peak_bytes = z.lent_peak;
  p.zone_peak_bytes = z.zone_peak;
  p.zone_misses = z.zone_misses;
  p.disk_busy_ms = impl_->reader->busy_seconds() * 1e3;
  return p;
}
std::uint64_t Executor::streamed_blocks() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->cursor->stats().streamed;
}
double Executor::bind_us_per_tensor() const {
  const Impl::Counters& c = impl_->counters;
  return c.bound_tensors ? c.bind_seconds * 1e6 / static_cast<double>(c.bound_tensors) : 0.0;
}
IoBackend Executor::backend() const { return impl_->reader->backend(); }
MemoryKind Executor::memory() const { return impl_->w.ring ? impl_->w.ring->kind() : impl_->opt.memory; }

namespace {
// Bytes of [p, p + bytes) whose pages are resident now.
std::uint64_t resident_bytes_of(const void* p, std::uint64_t bytes) {
  if (p == nullptr || bytes == 0) return 0;
  const std::uintptr_t page = 4096, a = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const std::uintptr_t e = reinterpret_cast<std::uintptr_t>(p) + bytes;
  std::vector<unsigned char> v((e - a + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(a), e - a, v.data()) != 0) return 0;
  std::uint64_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n * page;
}
}  // namespace

std::uint64_t Executor::held_bytes() const {
  const Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  if (m.released) return 0;
  return m.shed_pending ? m.shed_held : (m.w.ring ? m.w.ring->kept() + m.w.ring->capacity() : 0) + m.w.kept_bytes + m.w.pinned_need;
}
WeightMemory Executor::weight_memory() const {
  const Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  WeightMemory w;
  w.peak = m.w.peak;
  if (m.released) return w;
  w.held = held_bytes();
  if (m.caps().host_pages) {
    if (m.w.ring) w.resident_pages += resident_bytes_of(m.w.ring->kept_begin(), m.w.ring->kept() + m.w.ring->capacity());
    if (m.w.kept) w.resident_pages += resident_bytes_of(m.w.kept->base(), m.w.kept->capacity());
    w.resident_pages += resident_bytes_of(m.w.pinned_buf, m.w.pinned_need);
  }
  return w;
}
void Executor::reset_weight_peak() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  m.w.peak = 0;
  if (!m.shed_pending) m.note_in_use();
}
bool Executor::released() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->released;
}

void Executor::release() {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  if (impl_->run) abort();
  release_all(*impl_);
}

void release_all(Executor::Impl& m) {
  if (m.released) return;
  if (m.meter.measuring()) {  // an inference measuring activations ends here: its limit and reserve go
    m.planner->set_reserve(m.meter.end(false));
  }
  m.run.reset();
  m.bound = false;
  try {
    m.drain();
    m.backend->idle(m.w.ring.get());
  } catch (const std::exception& e) {
    log(LogLevel::kError, m.path + ": waiting for the GPU before releasing failed: " + e.what());
  }
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  if (!m.reader->register_buffers({})) {  // unpin before freeing; drained, so never refused
    log(LogLevel::kError, m.path + ": internal: reads in flight after draining; the ring is kept");
    return;
  }
  m.drop_ring();
  m.w.free_resident();
  m.released = true;
  m.shed_pending = false;
  log(LogLevel::kInfo, m.path + ": released every byte held for weights");
  give_heap_back(m.path);
}


}  // namespace swapnet
