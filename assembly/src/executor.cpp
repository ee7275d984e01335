// Swapped execution within a budget: plan blocks, read swapped blocks ahead into a ring while
// earlier ones run, bind by reference, release after use; inference resumable between layers.
// Also the CPU allocation meter used to account activations.
//
// Budget accounting (ExecutionPlan): budget = ring + resident + activations + pinned slots, where
//  - ring: the read-ahead ring of swapped blocks (Note [Read-ahead ring]; at least the largest
//    swapped block, deeper where the budget allows; two-ended, at least the largest pair of
//    adjacent swapped blocks, on the GPU and with ReadAhead::kPaper);
//  - resident: blocks read once and kept across inferences;
//  - activations: the peak bytes forward allocated at the image's example input (measured by
//    the CPU meter when packing);
//  - pinned: slots read by a layer outside the block that owns them (shared weights); they are
//    read once at open and stay resident, so a released block never leaves a dangling view.
//
// The GPU: Note [Swapping onto the GPU] and Note [Device backends] in device_backend.cpp.
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>

#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <initializer_list>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cmath>
#include <deque>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "cost_learner.h"
#include "cpu_meter.h"
#include "device_backend.h"
#include "input_meter.h"
#include "planning.h"
#include "zone_lender.h"
#include "swapnet/assembly.h"

namespace swapnet {
using detail::AccountScope;
using detail::cpu_account_refused;
using detail::set_cpu_account_limit;

// Note [Read-ahead ring]
// ~~~~~~~~~~~~~~~~~~~~~~
// The reader walks the plan's blocks in order, cyclically, with a cursor: a swapped block is
// submitted as soon as it fits in the ring (BlockRing, Note [Block ring]) next to the blocks not
// yet executed; a resident block not yet read is submitted into its place in the resident arena
// (read once, in disk order, overlapping execution like any other block). After the last block
// the cursor wraps to the first block of the *next* inference and goes on until it reaches the
// block the current inference is executing (so the ring never holds two copies of a block, and
// the reader is never more than one inference ahead): in a closed loop the disk does not wait
// for an inference boundary, and between inferences it fills the ring for the next one. The
// compute side takes the submitted reads in the same order (`fetches`): waits for a block,
// binds it by reference, runs its layers, unbinds it and pops it from the ring, which lets the
// cursor submit more. Every budget is a promise: the ring, resident and pinned bytes are the
// plan's, whatever is in flight.
//
// Note [A ring of one block]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The ring must hold the largest swapped block, not a pair: where the next block does not fit
// next to the one executing, it streams into the bytes the blocks before it free (Note
// [Streaming into the ring] in ring.cpp; only what the executing block holds waits for it to
// end; before streaming the whole read waited). That costs time only at those blocks, and it buys memory: vgg19 at
// its minimum budget (517 MB: fc6 411 MB + fc7 67 MB + 39 MB of activations) could only swap
// everything with a pair-sized ring (575 MB read per inference); with a ring of fc7's size it
// keeps fc6 resident and reads 164 MB. The planner (partitioner's optimal_partition, kRing)
// and simulate_ms() price the serialised reads; the two-ended pipelines still need a pair.
//
// Note [Dynamic shapes] is in input_meter.cpp.
// Resumable inference: `run` holds the activations between layers; `cur` is the block being
// executed and `bound` says whether its weights are bound (a step interrupted inside a block).
// A budget change during an inference (set_budget between steps) cancels the reads in flight
// and waits for the pieces already issued (BlockReader::cancel), drops everything read ahead,
// frees the old ring and resident arena (their pages go back at once), adopts the new plan and
// puts the cursor at the next layer: the block of the new plan containing it is read from that
// layer on (a *trimmed* block; from the first layer owning a weight it reads, so shared weights
// inside the block come along), and the inference goes on. The reads dropped are the price of
// giving memory back within one layer.
//
// GPU: kernels run asynchronously, so a swapped block's ring space is popped only once an event
// recorded behind its kernels has completed (`gpu_pending`); the cursor waits for the oldest such
// event when the next block does not fit otherwise. The ring there is two-ended (two blocks).
struct Executor::Impl {
  std::string path;
  ImageInfo info;
  Skeleton sk;
  ExecutorOptions opt;
  ExecutionPlan plan;
  std::unique_ptr<BlockReader> reader;
  std::unique_ptr<BlockRing> ring;   // swapped blocks in flight and executing
  std::unique_ptr<Arena> kept;       // resident blocks, one after another
  std::vector<std::uint64_t> kept_at;  // per block: its offset in `kept` (resident blocks)
  enum class Kept : char { kNone, kLoading, kLoaded };
  std::vector<Kept> kept_state;        // per block (resident ones)
  std::unique_ptr<PartitionTable> grid;  // ExecutorOptions::grid_step
  std::uint64_t grid_reserve = 0;        // budget - capacity the grid was built for
  std::vector<int> pinned;           // slot indices kept resident
  void* pinned_buf = nullptr;
  std::vector<at::Tensor> pinned_views;
  std::vector<bool> verified;  // per layer: its checksum has passed once since open
  double bind_seconds = 0;      // spent in bind_layers (assembly by reference)
  std::uint64_t bound_tensors = 0;  // tensors bound by it
  bool released = false;        // Executor::release(): nothing held until the next set_budget
  std::uint64_t kept_bytes = 0;   // resident blocks' arena
  std::uint64_t pinned_need = 0;  // pinned slots' buffer
  std::uint64_t weight_peak = 0;  // Executor::weight_memory().peak
  std::uint64_t used_bytes = 0;   // Executor::bytes_used()
  bool registered = false;        // the ring is registered with the reader (register_ring)
  std::uint64_t streamed = 0;     // blocks read streamed (Executor::streamed_blocks)
  // The ring's kept bytes hold the first plan.retained_bytes of block plan.retain_block, read
  // whole once since the ring was made (Note [Keeping part of a block] in ring.cpp).
  bool retained_valid = false;
  // Held by the thread using the executor except while a layer runs, so that shed() (any
  // thread) finds the state between two changes (Note [Shedding]).
  mutable std::recursive_mutex mu;
  int running_layer = -1;         // the layer running now, unlocked (-1: none)
  bool shed_pending = false;      // shed() gave memory back: re-plan before the next layer
  std::uint64_t shed_held = 0;    // what is held since (the running layer's weights, pinned slots)
  bool cross_inference = true;    // the cursor reads on into the next inference (not kPaper)

  // Note [Dynamic shapes] (input_meter.cpp): the inputs the activation reserve
  // (info.activation_bytes) was measured for, and the inference measuring a new one.
  InputMeter meter;
  std::uint64_t weights_min = 0;  // the least weight memory any plan needs (minimum budget less activations)
  int own_account = 0;            // CPU meter account when the thread has none (measuring, lending)
  // The account an inference's activations are charged to: the thread's (a Runtime model's), else
  // the executor's own.
  int inference_account() {
    int account = detail::thread_cpu_account();
    if (account == 0) {
      if (own_account == 0) own_account = new_cpu_account();
      account = own_account;
    }
    return account;
  }

  // Reads submitted, in cursor order (Note [Read-ahead ring]).
  struct Fetch {
    int block = 0;
    int first = 0, last = 0;     // layers read (first > the block's first: trimmed)
    std::uint64_t bytes = 0;
    // Bytes at the start not read (the part kept of plan.retain_block; then `at` is the ring's
    // kept_begin() and the read lands at its first byte).
    std::uint64_t skip = 0;
    char* at = nullptr;          // CPU address of the first layer's bytes
    BlockReader::Ticket ticket = 0;
    bool resident = false;       // into `kept`
    bool next = false;           // for the next inference
    // A block streamed into ring space older blocks still hold (Note [Streaming into the ring]
    // in ring.cpp): read in pieces of kPiece bytes, pieces[i] the ticket of piece i once
    // submitted (0 before); `ticket` stays 0.
    // A block that fits is read in pieces too (all submitted at once) where its layers may run
    // as their bytes land (Note [Layer by layer]); `stream` marks the streamed ones.
    std::vector<BlockReader::Ticket> pieces;
    bool stream = false;
    // Its place in the read order: the reader serves lower first (Note [Earliest block first] in
    // swapcore/src/reader.cpp), so a streamed block's pieces go before blocks pushed past it.
    std::uint64_t order = 0;
    bool streamed() const { return stream; }
    bool reads() const { return ticket != 0 || !pieces.empty(); }
  };
  static constexpr std::uint64_t kPiece = kStreamPieceBytes;  // as the planner's simulation
  static_assert(kPiece % kImageAlign == 0);
  std::deque<Fetch> fetches;
  std::uint64_t fetch_order = 0;  // Fetch::order of the newest fetch (fetches pushed so far)
  // Note [Tracing] (swapcore's trace.cpp): this executor's group in a trace, why the cursor last
  // stopped (traced when it changes), and when the inference in progress began.
  std::uint32_t tgroup = 0;
  static constexpr std::chrono::microseconds kTraceWaitMin{10};  // shorter waits are not traced
  const char* held_why = nullptr;
  int held_block = -1;
  TraceClock::time_point inference_t0;
  std::int64_t inferences = 0;
  // The cursor stopped at block b for `why` (a literal): traced once per change of either.
  void held(const char* why, int b) {
    if (!tracing() || (why == held_why && b == held_block)) return;
    held_why = why;
    held_block = b;
    trace_instant(tgroup, TraceLane::kCursor, why, b);
  }
  // The weights held now and the blocks lent the activation zone, as trace counters.
  void trace_memory() {
    if (!tracing()) return;
    trace_counter(tgroup, "weights held", static_cast<std::int64_t>((ring ? ring->used() : 0) + kept_bytes + pinned_need));
    if (ring && ring->lend() > 0) trace_counter(tgroup, "blocks in the zone", static_cast<std::int64_t>(ring->lent_bytes()));
  }
  int rd_block = 0;      // the cursor: next block to consider
  int rd_first = -1;     // its first layer when trimmed (-1: the block's own)
  bool rd_next = false;  // the cursor is in the next inference
  // The cursor has come round to the inference after the next (Note [One inference ahead]).
  bool rd_beyond = false;

  // The inference in progress.
  std::unique_ptr<Skeleton::Run> run;
  int cur = 0;         // block executing (or next to execute)
  bool bound = false;  // cur's weights are bound (a step stopped inside it)
  Fetch cur_fetch;     // what cur was read as (swapped, or a resident block loading)
  bool cur_from_fetch = false;
  // cur_fetch.pieces[0, cur_waited) have landed and been waited for; the rest are waited for
  // layer by layer (Note [Layer by layer]).
  std::size_t cur_waited = 0;
  // Note [Lending the activation reserve] (zone_lender.cpp).
  ZoneLender lender;
  bool lend_off = false;  // planning the measuring inference (Note [Dynamic shapes])
  // Note [Layer by layer] counters, since open.
  double read_wait_seconds = 0;        // the executing thread waiting for bytes to land
  // Note [Learning the costs in service] (cost_learner.cpp): what each inference cost, and the
  // grid being rebuilt for costs learned (Note [A re-plan must gain]).
  std::optional<CostLearner> learner;
  std::future<std::unique_ptr<PartitionTable>> grid_next;
  double grid_next_before_ms = 0;  // the plan's prediction when the grid began to be rebuilt
  bool fixed_plan = false;         // ExecutorOptions::partition / blocks at open: not learned
  std::uint64_t layers_started_early = 0;  // layers run before the rest of their block landed
  std::uint64_t released_early = 0;    // ring bytes given back before their block ended
  std::uint64_t read_past_streamed = 0;  // blocks pushed while a streamed one waited
  std::uint64_t read_at_layer_end = 0;   // fetches pushed by the pump after a layer (lending)
  std::atomic<bool> yield{false};

  // Where layers run (Note [Device backends]): the host until open() says otherwise.
  std::unique_ptr<DeviceBackend> backend = make_host_backend();
  std::unique_ptr<Arena> pinned_gpu;    // pinned slots, where the device reads them
  const DeviceBackend::Caps& caps() const { return backend->caps(); }

  std::uint64_t offset(int layer) const { return info.layers[layer].offset; }
  std::uint64_t span(int first, int last) const {
    return info.layers[last].offset + info.layers[last].size - info.layers[first].offset;
  }
  // The checks a read of layers [first, last] must make under the verify policy.
  std::vector<BlockReader::Check> checks_for(int first, int last) const {
    std::vector<BlockReader::Check> c;
    if (opt.verify == ExecutorOptions::Verify::kNever) return c;
    for (int k = first; k <= last; ++k) {
      const ImageLayer& L = info.layers[k];
      if (L.size == 0 || (opt.verify == ExecutorOptions::Verify::kFirst && verified[k])) continue;
      c.push_back({L.offset, L.size, L.checksum, "layer " + std::to_string(k) + " (" + L.name + ")"});
    }
    return c;
  }
  void mark_verified(int first, int last) {
    for (int k = first; k <= last; ++k) verified[k] = true;
  }
  // Weights in use now: blocks in the ring, resident blocks, pinned slots (blocks lent the
  // activation zone apart: the zone is the activation reserve's).
  void note_in_use() {
    if (!ring && !kept) return;
    weight_peak = std::max(weight_peak, (ring ? ring->used() : 0) + kept_bytes + pinned_need);
    lender.note_lent(ring.get());
    trace_memory();
  }

  // Makes the ring's zone the region of the lender's account (Note [Lending the activation
  // reserve] in zone_lender.cpp).
  void attach_zone() { lender.attach(ring.get(), meter.measuring(), run ? run->next_layer() : 0); }
  // The ring goes (a new plan, or release): the zone's holes and the ring's pages go back now;
  // activations of the inference in progress may live in the zone, and its live chunks keep
  // their pages until the last is freed.
  void drop_ring() {
    lender.drop(ring.get());
    ring.reset();
  }
  // Where a block of fetch `f` may end, as an offset from the ring's base.
  std::uint64_t ring_limit(const Fetch& f) const {
    return lender.ring_limit(*ring, run ? run->next_layer() : -1, f.last, f.next);
  }
  // The first layer a read of block b from layer k must start at: the lowest layer in the block
  // that owns a weight read by layers k.. of it (weights shared within a block are not pinned).
  int first_needed(int b, int k) const {
    const auto [first, last] = plan.blocks[b];
    int f = k;
    for (int l = k; l <= last; ++l) {
      for (int s : sk.layers()[l].used_slots) {
        const int owner = sk.slots()[s].layer;
        if (owner >= first && owner < f) f = owner;
      }
    }
    return f;
  }

  // Registers the ring with the reader (Note above adopt) if it is not, and the reader is idle.
  void register_ring() {
    if (registered || !ring || shed_pending) return;  // registering maps (zero-fills) every page
    if (ring->kind() == MemoryKind::kManaged) {
      registered = true;  // io_uring cannot pin CUDA managed memory (EFAULT on the H100): unregistered reads
      return;
    }
    registered = reader->register_buffers({{ring->kept_begin(), ring->kept() + ring->capacity()}});
  }

  // Where weightless blocks' views point (they have no bytes, but need an address).
  static char* zero_page() {
    alignas(4096) static char page[4096];
    return page;
  }

  Impl(std::string p, ImageInfo i, Skeleton s)
      : path(std::move(p)), info(std::move(i)), sk(std::move(s)), meter(path), lender(path, info.layers.size()) {}
  ~Impl() {
    try {
      drain();
      backend->idle(ring.get());
    } catch (...) {  // a failing GPU at teardown: nothing left to protect
    }
    run.reset();  // its activations go back to their account first
    lender.detach();
    ring.reset();
    if (own_account != 0) detail::release_cpu_account(own_account);  // when nothing is charged to it
    free_aligned(pinned_buf);
  }

  // Frees the pinned slots' buffer (their views are dropped first).
  void drop_pinned() {
    pinned.clear();
    pinned_views.clear();
    free_aligned(pinned_buf);
    pinned_buf = nullptr;
    pinned_gpu.reset();
    pinned_need = 0;
  }
  void rebind_pinned() {
    for (size_t i = 0; i < pinned.size(); ++i) sk.bind_slot(pinned[i], pinned_views[i]);
  }
  void bind_range(int first, int last, char* at) {
    auto t0 = std::chrono::steady_clock::now();
    sk.bind_layers(first, last, at, offset(first), backend->device());
    bind_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int k = first; k <= last; ++k) bound_tensors += sk.layers()[k].slots.size();
  }
  // Binds every resident block read whole.
  void bind_loaded() {
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      if (plan.resident[b] && kept_state[b] == Kept::kLoaded) {
        char* at = plan.block_bytes[b] > 0 ? backend->address(*kept, kept->base() + kept_at[b]) : zero_page();
        sk.bind_layers(plan.blocks[b].first, plan.blocks[b].second, at, offset(plan.blocks[b].first), backend->device());
      }
    }
    rebind_pinned();
  }

  // ---- the reader's cursor ----
  // Note [One inference ahead]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // The cursor reads on into the next inference up to the block executing (`cur`). After the
  // last block ran and before finish(), `cur` is the number of blocks, and the cursor went on
  // past the next inference's last block into the one after, pushing those blocks too: held
  // through a whole inference more than the zone's leases were looked up for (window_lease
  // counts a block of the next inference as held until its own last layer). fcn_resnet101 at
  // 246,413,715 bytes in serve (Runtime, the budget grid's plan of 170 blocks, most of them of
  // 8-36 KiB) held the next-but-one inference's first blocks 13-19 MiB into its 32 MiB zone
  // while its head's activations needed 14-26 MiB there: 15-20 activations per inference found
  // no room and went outside the zone, 10 MB over the budget (over_budget in 8 of 15
  // inferences). The cursor now stops where it comes round the second time; finish() makes
  // that the next inference's first block.
  void advance() {
    rd_first = -1;
    if (++rd_block == static_cast<int>(plan.blocks.size())) {
      rd_block = 0;
      if (rd_next) rd_beyond = true;
      rd_next = true;
    }
  }
  // Submits every read the ring (and the cursor's limits) allow now. GPU: with `may_wait`, waits
  // for the kernels of executed blocks but the newest (which may be running now) to free space.
  void pump(bool may_wait = false) {
    try {
      pump_reads(may_wait);
    } catch (...) {
      lender.sync(run ? run->next_layer() : 0);
      throw;
    }
    lender.sync(run ? run->next_layer() : 0);  // the zone's floor follows the blocks held
  }
  void pump_reads(bool may_wait) {
    if (released || shed_pending || plan.blocks.empty()) return;
    // A streamed block's pieces whose bytes are free now; blocks that overlap nothing held may
    // still go after it (Note [Streaming into the ring]).
    bool streaming = false;
    for (Fetch& f : fetches) {
      if (f.streamed() && !stream_pieces(f)) streaming = true;
    }
    if (streaming && !opt.read_past_streamed) return held("held: a block streams", rd_block);
    const int n = static_cast<int>(plan.blocks.size());
    for (int guard = 0; guard < 2 * n + 2; ++guard) {
      if (rd_beyond || (rd_next && (!cross_inference || rd_block >= cur))) {
        return held("held: an inference ahead", rd_block);
      }
      const int b = rd_block;
      const auto [bf, bl] = plan.blocks[b];
      const int first = rd_first >= 0 ? rd_first : bf;
      Fetch f;
      f.block = b;
      f.first = first;
      f.last = bl;
      f.bytes = span(first, bl);
      f.next = rd_next;
      f.order = fetch_order + 1;
      if (plan.resident[b]) {
        if (kept_state[b] != Kept::kNone) {
          advance();
          continue;
        }
        f.resident = true;
        f.at = f.bytes > 0 ? kept->base() + kept_at[b] + (offset(first) - offset(bf)) : zero_page();
        if (first == bf) kept_state[b] = Kept::kLoading;
      } else if (f.bytes > 0) {
        // The block kept in part (Note [Keeping part of a block]): read from its first layer
        // (never trimmed), its rest at the ring's first byte; whole (into the kept bytes too)
        // until that has been done once, or when its checksums are to be verified.
        const bool keeps = b == plan.retain_block;
        std::uint64_t kept = 0;
        if (keeps) {
          f.first = bf;
          f.bytes = span(bf, bl);
          kept = plan.retained_bytes;
          f.skip = retained_valid && checks_for(bf, bl).empty() ? kept : 0;
        }
        backend->reclaim(*ring, false);
        while (may_wait && !ring->fits(f.bytes) && backend->pending() > 1) backend->reclaim(*ring, true, true);
        char* at = static_cast<char*>(keeps ? ring->push_first(f.bytes - kept) : ring->push(f.bytes, ring_limit(f)));
        if (at == nullptr) {
          // Streamed (Note [Streaming into the ring]): its pieces are read as older blocks free
          // their bytes. Not with checksums to verify (they need the layer whole in one read).
          if (!opt.stream || f.bytes - kept <= kPiece || !checks_for(f.first, bl).empty() || f.skip != kept) {
            return held(!keeps && ring->lend() > 0 && ring->fits(f.bytes, ring->capacity() + ring->lend())
                            ? "held: activations' zone"
                            : "held: no room",
                        b);
          }
          at = static_cast<char*>(keeps ? ring->push_first_streamed(f.bytes - kept)
                                        : ring->push_streamed(f.bytes, ring_limit(f)));
          if (at == nullptr) {
            return held(ring->streaming()                                             ? "held: a block streams"
                        : !keeps && ring->lend() > 0 && ring->fits(f.bytes, ring->capacity() + ring->lend())
                            ? "held: activations' zone"
                            : "held: no room to stream",
                        b);
          }
          f.at = at - kept;
          f.pieces.assign((f.bytes - f.skip + kPiece - 1) / kPiece, 0);
          f.stream = true;
          ++streamed;
          trace_submitted(f);
          fetch_order = f.order;
          fetches.push_back(std::move(f));
          streaming = !stream_pieces(fetches.back());
          note_in_use();
          advance();
          if (streaming && !opt.read_past_streamed) return;
          continue;  // blocks that overlap nothing held may follow it
        }
        f.at = at - kept;
        if (streaming) ++read_past_streamed;
      }
      if (f.bytes > 0 && layer_by_layer(f)) {
        // In pieces, so that its first layers run while the rest lands (Note [Layer by layer]).
        f.pieces.assign((f.bytes - f.skip + kPiece - 1) / kPiece, 0);
        for (size_t i = 0; i < f.pieces.size(); ++i) {
          const std::uint64_t at = f.skip + i * kPiece, len = std::min(kPiece, f.bytes - at);
          f.pieces[i] = reader->submit(offset(f.first) + at, len, f.at + at, {}, f.order);
        }
      } else if (f.bytes > 0) {
        f.ticket = reader->submit(offset(f.first) + f.skip, f.bytes - f.skip, f.at + f.skip,
                                  f.skip ? std::vector<BlockReader::Check>{} : checks_for(f.first, bl), f.order);
      } else {
        f.at = zero_page();  // weightless layers: views of nothing, somewhere valid
      }
      trace_submitted(f);
      fetch_order = f.order;
      fetches.push_back(f);
      note_in_use();
      advance();
    }
  }
  // A fetch was queued: traced as "read block b" (its reads are named by f.order).
  void trace_submitted(const Fetch& f) {
    if (!tracing()) return;
    held_why = nullptr;
    trace_instant(tgroup, TraceLane::kCursor, f.streamed() ? "stream block" : "read block", f.block, "order",
                  static_cast<std::int64_t>(f.order));
  }
  // Submits the pieces of a streamed fetch whose ring bytes no older block holds now; whether
  // every piece is submitted.
  bool stream_pieces(Fetch& f) {
    bool all = true;
    for (size_t i = 0; i < f.pieces.size(); ++i) {
      if (f.pieces[i] != 0) continue;
      const std::uint64_t at = f.skip + i * kPiece, len = std::min(kPiece, f.bytes - at);
      if (!ring->range_free(f.at + at, len)) {
        all = false;
        continue;
      }
      f.pieces[i] = reader->submit(offset(f.first) + at, len, f.at + at, {}, f.order);
    }
    return all;
  }
  // Cancels a fetch's reads (pieces not submitted yet: never will be).
  void cancel_reads(const Fetch& f) {
    if (f.ticket) reader->cancel(f.ticket);
    for (auto t : f.pieces) {
      if (t) reader->cancel(t);
    }
  }
  // Waits for a fetch's reads: the first error, else ok. Every piece is waited for.
  Status wait_reads(const Fetch& f) {
    Status st;
    if (f.ticket) st = reader->wait(f.ticket);
    for (auto t : f.pieces) {
      if (!t) continue;
      Status s = reader->wait(t);
      if (st.ok() && !s.ok()) st = s;
    }
    return st;
  }
  // Bytes of a fetch not landed yet (pieces not submitted: all of theirs); false when `wait` is
  // false and the reader's lock is busy.
  bool unlanded(const Fetch& f, bool wait, std::uint64_t* out) const {
    std::uint64_t n = 0;
    auto one = [&](BlockReader::Ticket t, std::uint64_t bytes) {
      if (!t) {
        n += bytes;
        return true;
      }
      if (wait) {
        n += reader->unlanded_bytes(t);
        return true;
      }
      std::uint64_t u = 0;
      if (!reader->try_unlanded_bytes(t, &u)) return false;
      n += u;
      return true;
    };
    if (f.ticket && !one(f.ticket, f.bytes - f.skip)) return false;
    for (size_t i = 0; i < f.pieces.size(); ++i) {
      if (!one(f.pieces[i], std::min(kPiece, f.bytes - f.skip - i * kPiece))) return false;
    }
    *out = n;
    return true;
  }
  // Cancels every read submitted and waits for the pieces already issued; releases the ring's
  // blocks. Resident blocks read whole stay.
  void drain() {
    cancel_cur_pieces();
    for (auto& f : fetches) cancel_reads(f);
    for (auto& f : fetches) {
      (void)wait_reads(f);
      if (f.resident && f.first == plan.blocks[f.block].first) kept_state[f.block] = Kept::kNone;
    }
    fetches.clear();
    if (ring) backend->reclaim(*ring, true);
    if (ring) ring->clear();
    rd_block = 0;
    rd_first = -1;
    rd_next = false;
    rd_beyond = false;
  }
  // Note [Layer by layer]
  // ~~~~~~~~~~~~~~~~~~~~~
  // A block's layers run in the order their bytes lie in it, and the memory bound a plan is
  // judged by (partitioner's memory_bound_ms) is layer-granular: a layer may start once its own
  // weights are in, and its bytes may be reused once it has run. The executor used to be
  // block-granular on both ends: a block ran only when all of it had landed (the disk's last
  // megabytes of a 20 MB block stalled its first layer), and its ring bytes were free only after
  // its last layer (with a ring of one large block the next block's pieces waited for that). On
  // host memory it now reads a block that fits in pieces of kPiece bytes too, waits before each
  // layer only for the pieces that hold it (and the layers before it in the block, whose
  // weights it may share), and after each layer gives the ring back the bytes before the lowest
  // layer the rest of the block still reads (BlockRing::release_front_until), so a block
  // streaming over it reads on while it computes. Not with checksums to verify (a layer's
  // checksum needs it in one read: the first inference under --verify first reads whole), not
  // for the block kept in part, not on the GPU (kernels run ahead of this thread). Pieces of
  // the executing block not yet waited for are cancelled and waited for wherever reads are
  // (drain, shed, an error).
  bool layer_by_layer(const Fetch& f) const {
    return opt.layer_by_layer && caps().layer_by_layer && ring && ring->deep() && !f.resident && f.block != plan.retain_block &&
           f.bytes - f.skip > kPiece && checks_for(f.first, f.last).empty();
  }
  // Whether a fetch's layers run as its pieces land (streamed ones too).
  bool runs_by_layer(const Fetch& f) const {
    return !f.pieces.empty() && opt.layer_by_layer && caps().layer_by_layer && f.block != plan.retain_block;
  }
  Status timed_wait(const Fetch& f) {
    const auto t0 = std::chrono::steady_clock::now();
    Status st = wait_reads(f);
    const auto t1 = std::chrono::steady_clock::now();
    read_wait_seconds += std::chrono::duration<double>(t1 - t0).count();
    if (t1 - t0 >= kTraceWaitMin) trace_span(tgroup, TraceLane::kWait, "wait for block", f.block, t0, t1, "layer", f.first);
    return st;
  }
  // Waits for the pieces of `f` (read in pieces) that hold layers f.first..k; cur_waited counts
  // them. The first error, else ok.
  Status wait_pieces(const Fetch& f, int k) {
    const std::uint64_t end = offset(k) + info.layers[k].size - offset(f.first);
    const std::size_t need = end <= f.skip ? 0 : std::min<std::size_t>(f.pieces.size(), (end - f.skip + kPiece - 1) / kPiece);
    if (cur_waited >= need) return Status();
    const auto t0 = std::chrono::steady_clock::now();
    Status st;
    for (; cur_waited < need; ++cur_waited) {
      Status s = reader->wait(f.pieces[cur_waited]);
      if (st.ok() && !s.ok()) st = s;
    }
    const auto t1 = std::chrono::steady_clock::now();
    read_wait_seconds += std::chrono::duration<double>(t1 - t0).count();
    if (t1 - t0 >= kTraceWaitMin) trace_span(tgroup, TraceLane::kWait, "wait for block", f.block, t0, t1, "layer", k);
    return st;
  }
  // Cancels and waits for the pieces of `f` not waited for yet (f.pieces[cur_waited..]).
  void cancel_pieces_left(const Fetch& f) {
    for (std::size_t i = cur_waited; i < f.pieces.size(); ++i) reader->cancel(f.pieces[i]);
    for (; cur_waited < f.pieces.size(); ++cur_waited) (void)reader->wait(f.pieces[cur_waited]);
  }
  // The same for the executing block.
  void cancel_cur_pieces() {
    if (cur_from_fetch) cancel_pieces_left(cur_fetch);
  }

  // Waits for the front fetch, which must be block `b` of this inference.
  Fetch take(int b) {
    if (fetches.empty()) pump(true);  // GPU: its space may have waited for kernels to finish
    if (fetches.empty() || fetches.front().block != b || fetches.front().next) {
      throw Error(path + ": internal: block " + std::to_string(b) + " was not read ahead in order");
    }
    if (fetches.front().streamed() && !stream_pieces(fetches.front())) {
      throw Error(path + ": internal: block " + std::to_string(b) + " streamed while older blocks hold its bytes");
    }
    Fetch f = fetches.front();
    fetches.pop_front();
    cur_waited = 0;
    if (f.reads()) {
      // In pieces: only its first layer's bytes now, the rest layer by layer (step()).
      const bool by_layer = runs_by_layer(f);
      Status st = by_layer ? wait_pieces(f, f.first) : timed_wait(f);
      if (!by_layer) cur_waited = f.pieces.size();
      if (!st.ok()) {
        cancel_pieces_left(f);  // the pieces after a failed one may still be in flight
        if (f.resident && kept_state[b] == Kept::kLoading) kept_state[b] = Kept::kNone;
        if (!f.resident) ring_pop_now();
        throw Error(st.message() + " (block " + std::to_string(b) + " of " + std::to_string(plan.blocks.size()) + ")");
      }
      mark_verified(f.first, f.last);
      used_bytes += f.bytes - f.skip;
      if (b == plan.retain_block && !f.resident) retained_valid = true;
    }
    if (f.bytes > 0) backend->hand_over(f.resident ? kept->kind() : ring->kind(), f.at, f.bytes);
    return f;
  }
  // The oldest ring entry goes now (the block failed or was never run).
  void ring_pop_now() {
    backend->reclaim(*ring, true);
    ring->pop();
  }
};

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() = default;

// Makes `p` the plan in force: a ring and resident arena of its sizes (the old ones are freed
// first: nothing may be in flight), and the slots this partition must keep resident read. The
// cursor starts at block 0; resident blocks are read on the way.
void adopt(Executor::Impl& m, ExecutionPlan p);
// Frees every byte held for weights (Executor::release).
void release_all(Executor::Impl& m);
void give_heap_back(const std::string& path);

namespace {
// `v` with every tensor whose storage lies in [lo, hi) replaced by a copy (`copied` counts the
// bytes); containers are rebuilt only where something was copied.
c10::IValue evict_from(const c10::IValue& v, const char* lo, const char* hi, std::uint64_t* copied) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.has_storage()) return v;
    const char* p = static_cast<const char*>(t.storage().data());
    if (p == nullptr || p < lo || p >= hi) return v;
    *copied += t.nbytes();
    return t.clone();
  }
  if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    std::vector<c10::IValue> out;
    bool changed = false;
    for (const auto& e : elems) {
      out.push_back(evict_from(e, lo, hi, copied));
      changed = changed || !out.back().isSameIdentity(e);
    }
    if (!changed) return v;
    return c10::ivalue::Tuple::createNamed(std::move(out), c10::TypePtr(v.toTupleRef().type()));  // named stays named
  }
  if (v.isList()) {
    c10::List<c10::IValue> l = v.toList();
    c10::impl::GenericList out(l.elementType());
    bool changed = false;
    for (size_t i = 0; i < l.size(); ++i) {
      const c10::IValue e = l.get(i);
      out.push_back(evict_from(e, lo, hi, copied));
      changed = changed || !out.get(i).isSameIdentity(e);
    }
    return changed ? c10::IValue(out) : v;
  }
  if (v.isGenericDict()) {
    c10::impl::GenericDict d = v.toGenericDict();
    c10::impl::GenericDict out(d.keyType(), d.valueType());
    bool changed = false;
    for (const auto& e : d) {
      c10::IValue nv = evict_from(e.value(), lo, hi, copied);
      changed = changed || !nv.isSameIdentity(e.value());
      out.insert(e.key(), std::move(nv));
    }
    return changed ? c10::IValue(out) : v;
  }
  return v;
}
}  // namespace
// Note [One re-plan path]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Every change of the plan in force goes through replan(), with `m.mu` held, and says why: a
// budget move (set_budget, also mid-inference), the budget in force again after shed() (step),
// a new activation reserve (InputMeter's measuring, begun or ended), or costs learned (the
// CostLearner's decision, or a budget grid rebuilt with them). Components return what they
// found (a reserve, costs) and never plan themselves; the path from a budget to the ring is
// replan() -> planning (grid or search) -> adopt() -> the cursor.
enum class Replan { kBudget, kShed, kReserve, kLearned };
const char* replan_reason(Replan why) {
  switch (why) {
    case Replan::kBudget: return "budget";
    case Replan::kShed: return "after shedding";
    case Replan::kReserve: return "activation reserve";
    case Replan::kLearned: return "learned costs";
  }
  return "?";
}
// Plans for `bytes` and puts the plan in force. With `must_beat_ms` > 0, only a plan predicted
// under that is put in force (Note [A re-plan must gain]); false when it was not. (While a new
// input's activations are measured it is ignored: learning never re-plans then.)
bool replan(Executor::Impl& m, Replan why, std::uint64_t bytes, double must_beat_ms = 0, double* best_ms = nullptr);
void learn_costs(Executor::Impl& m, bool whole);
void load_learned(Executor::Impl& m);
void store_learned(Executor::Impl& m);

std::unique_ptr<Executor> Executor::open(const std::string& image, const ExecutorOptions& options) {
  ImageInfo info;
  read_image_info(image, &info).throw_if_error();
  Skeleton sk = Skeleton::from_image(info, image);
  auto impl = std::make_unique<Impl>(image, std::move(info), std::move(sk));
  Impl& m = *impl;
  m.opt = options;
  if (options.device == ExecutorOptions::Device::kCUDA) m.backend = make_cuda_backend(image);
  m.backend->configure(image, &m.opt);
  if (host_blocks(m.opt)) m.opt.memory = MemoryKind::kHost;
  m.cross_inference = options.read_ahead != ReadAhead::kPaper;
  if (m.opt.lend && m.caps().meters_activations && m.info.version < kImageZoneReserveVersion && m.info.activation_bytes >= (1u << 20)) {
    // Its activation figures are the bytes live alone; as a zone places them they may need more
    // (Note [Lending the activation reserve]), so the zone could not hold them within the budget.
    log(LogLevel::kWarn, image + ": packed in image format " + std::to_string(m.info.version) +
                             ", whose activation reserve counts the bytes live, not as a zone places them: it runs "
                             "without lending the reserve to blocks (slower where activations leave it idle); "
                             "re-pack it (swapnet pack) to lend it");
  }
  // Note [Dynamic shapes]: the reserve holds the largest input measured.
  std::vector<InputProfile> profiles = m.info.input_profiles;
  if (profiles.empty()) {
    std::vector<ImageInput> legacy = legacy_input_profile(m.info.input_shapes);
    if (!legacy.empty() || m.info.num_inputs == 0) profiles.push_back(InputProfile{m.info.activation_bytes, legacy});
  }
  m.meter.set_profiles(std::move(profiles));
  m.info.activation_bytes = m.meter.largest(m.info.activation_bytes);
  m.weights_min = min_budget_for(m.info, m.sk, effective_read_ahead(m.opt)) - m.info.activation_bytes;
  m.fixed_plan = !options.partition.empty() || options.blocks > 0;
  if (!learn_after_valid(options.learn_after)) {
    throw Error(image + ": learn_after " + std::to_string(options.learn_after) + " is not 0 (never) or 3.." +
                std::to_string(kMaxLearnAfter) + " inferences: a window's median needs 3 to set one disturbed "
                "inference aside");
  }
  m.learner.emplace(CostLearner::Config{options.learn_after, options.learn_window_ms, options.learn_threshold,
                                       options.measured_exec},
                    m.info.layers.size());
  load_learned(m);
  ExecutionPlan p = plan_for(m.info, m.sk, m.opt, image);
  ReaderOptions ro = options.reader;
  if (tracing()) {  // Note [Tracing]: a group of its own, shared with its reader
    m.tgroup = trace_group(image.substr(image.find_last_of('/') + 1));
    m.lender.set_trace_group(m.tgroup);
    ro.trace_group = m.tgroup;
  }
  BlockReader::open(image, ro, &m.reader).throw_if_error();
  m.backend->check_reads(image, *m.reader, m.info, &m.opt);
  m.verified.assign(m.info.layers.size(), false);
  m.learner->restart(CostLearner::io_count(*m.reader));
  if (options.grid_step > 0 && options.planner == ExecutorOptions::Planner::kOptimal) {
    m.grid_reserve = planning_reserve(m.info, m.sk, m.opt);
    m.grid = std::make_unique<PartitionTable>(layer_costs(m.info, m.opt), m.opt.cost, options.grid_step,
                                              partition_options(m.info, m.opt));
  }
  adopt(m, std::move(p));
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

void adopt(Executor::Impl& m, ExecutionPlan p) {
  using Ms = std::chrono::duration<double, std::milli>;
  const auto t0 = std::chrono::steady_clock::now();
  m.drain();
  m.backend->idle(m.ring.get());
  const auto t_drained = std::chrono::steady_clock::now();
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  if (!m.reader->register_buffers({})) throw Error(m.path + ": internal: reads in flight after draining");  // unpin
  m.drop_ring();
  if (m.kept) m.kept->release(false);
  m.kept.reset();
  m.drop_pinned();
  const auto t_freed = std::chrono::steady_clock::now();
  if (p.arena_bytes > 0) {
    // Note [Lending the activation reserve]: the activation reserve becomes the ring's zone.
    const std::uint64_t lend = lend_for(m.info, m.opt) > 0 && !m.meter.measuring() && !m.lend_off && p.read_ahead == ReadAhead::kRing &&
                                       p.activation_bytes >= (1u << 20) && detail::cpu_meter_active()
                                   ? p.activation_bytes
                                   : 0;
    m.ring = BlockRing::create(p.arena_bytes, m.opt.memory, p.read_ahead == ReadAhead::kRing, p.retained_bytes, lend);
  }
  m.retained_valid = false;
  m.kept_at.assign(p.blocks.size(), 0);
  m.kept_state.assign(p.blocks.size(), Executor::Impl::Kept::kNone);
  std::uint64_t kept_bytes = 0;
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    if (p.resident[b]) {
      m.kept_at[b] = kept_bytes;
      kept_bytes += p.block_bytes[b];
    }
  }
  m.kept_bytes = kept_bytes;
  if (kept_bytes > 0) {
    m.kept = Arena::create(kept_bytes, m.opt.memory);
    if (m.kept->place(false, kept_bytes) == nullptr) throw Error(m.path + ": internal: resident blocks do not fit");
  }
  // io_uring fixed buffers pin (and map, zero-filling) the pages they cover when registered. The
  // ring is registered once the reader is idle (now between inferences; after a move during
  // one, at the next inference boundary the reader is idle at): a move is not made to wait for
  // the whole new ring to be zero-filled. Resident blocks are read once per plan: not registered.
  m.registered = false;
  if (!m.run) m.register_ring();
  const auto t_ring = std::chrono::steady_clock::now();
  m.plan = std::move(p);
  // Pinned slots: read once, each from its own layer's range, into one resident buffer.
  pinned_bytes(m.info, m.sk, block_of_layer(m.info, m.plan.blocks), m.plan.resident, &m.pinned);
  if (!m.pinned.empty()) {
    std::uint64_t need = 0;
    std::vector<std::uint64_t> at;
    for (int s : m.pinned) {
      at.push_back(need);
      need += (m.info.tensors[s].nbytes + 63) / 64 * 64;
    }
    m.pinned_need = need;
    char* pinned_at = nullptr;  // CPU address of the pinned slots
    m.pinned_gpu = m.backend->pinned_arena(need, m.opt.memory);
    if (m.pinned_gpu) {
      pinned_at = static_cast<char*>(m.pinned_gpu->place(false, need));
    } else {
      m.pinned_buf = alloc_aligned(need);
      pinned_at = static_cast<char*>(m.pinned_buf);
    }
    std::uint64_t scratch_len = 0;
    for (int s : m.pinned) scratch_len = std::max(scratch_len, m.info.layers[m.info.tensors[s].layer].size);
    void* scratch = alloc_aligned(scratch_len);
    if (pinned_at == nullptr || scratch == nullptr) {
      free_aligned(scratch);
      throw Error(m.path + ": cannot allocate " + format_bytes(need) + " for shared weights");
    }
    for (size_t i = 0; i < m.pinned.size(); ++i) {
      const ImageTensor& t = m.info.tensors[m.pinned[i]];
      const ImageLayer& L = m.info.layers[t.layer];
      Status s = m.reader->read(L.offset, L.size, scratch, {{L.offset, L.size, L.checksum, "layer " +
                                                             std::to_string(t.layer) + " (" + L.name + ")"}});
      if (!s.ok()) {
        free_aligned(scratch);
        throw Error(s.message());
      }
      char* dst = pinned_at + at[i];
      std::memcpy(dst, static_cast<char*>(scratch) + (t.offset - L.offset), t.nbytes);
      const SlotInfo& sl = m.sk.slots()[m.pinned[i]];
      void* view = m.pinned_gpu ? m.backend->address(*m.pinned_gpu, dst) : dst;
      m.pinned_views.push_back(
          at::for_blob(view, sl.sizes)
              .strides(sl.strides)
              .options(at::TensorOptions().dtype(sl.dtype).device(m.backend->device()))
              .target_device(m.backend->device())
              .make_tensor());
    }
    free_aligned(scratch);
    if (m.pinned_gpu) m.backend->hand_over(m.pinned_gpu->kind(), pinned_at, need);
    m.rebind_pinned();
  }
  log(LogLevel::kInfo, m.path + ": " + std::to_string(m.plan.blocks.size()) + " blocks (" +
                           std::to_string(std::count(m.plan.resident.begin(), m.plan.resident.end(), 1)) +
                           " resident, " + format_bytes(m.plan.resident_bytes) + "), ring " +
                           format_bytes(m.plan.arena_bytes) +
                           (m.ring ? std::string(" (") + to_string(m.ring->kind()) +
                                         (m.ring->deep() ? ", deep)" : ", two-ended)")
                                   : std::string()) +
                           ", activations " + format_bytes(m.plan.activation_bytes) + ", pinned " +
                           format_bytes(m.plan.pinned_bytes));
  const auto t_end = std::chrono::steady_clock::now();
  log(LogLevel::kDebug, m.path + ": plan adopted in " + std::to_string(Ms(t_end - t0).count()) + " ms (reads drained " +
                            std::to_string(Ms(t_drained - t0).count()) + ", memory freed " +
                            std::to_string(Ms(t_freed - t_drained).count()) + ", ring and resident arena " +
                            std::to_string(Ms(t_ring - t_freed).count()) + ", pinned slots " +
                            std::to_string(Ms(t_end - t_ring).count()) + ")");
  m.released = false;
  m.shed_pending = false;
  m.attach_zone();  // at once: the rest of an inference in progress places its activations there
  m.note_in_use();
}

// adopt() failing part-way (an allocation, a read of pinned slots) leaves the executor released:
// nothing half-built is used, and forward() says so until the next set_budget().
static void adopt_or_release(Executor::Impl& m, ExecutionPlan p) {
  try {
    adopt(m, std::move(p));
  } catch (...) {
    m.released = false;
    release_all(m);
    throw;
  }
}

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

void Executor::set_budget(std::uint64_t bytes) {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  const std::uint64_t before = impl_->released ? 0 : impl_->plan.total();
  replan(*impl_, Replan::kBudget, bytes);
  if (impl_->plan.total() < before) give_heap_back(impl_->path);
}

bool replan(Executor::Impl& m, Replan why, std::uint64_t bytes, double must_beat_ms, double* best_ms) {
  trace_instant(m.tgroup, TraceLane::kControl, "budget", -1, "bytes", static_cast<std::int64_t>(bytes));
  const auto t_plan = std::chrono::steady_clock::now();
  if (m.meter.measuring()) {
    // Measuring a new input's activations (Note [Dynamic shapes]): weights stay at their least
    // and activations get the rest of the new budget, less than they hold already: refused.
    const std::uint64_t allowance = m.meter.allowance_at(bytes, m.weights_min);
    const std::uint64_t before = m.info.activation_bytes;
    m.grid_reserve = m.grid_reserve - before + allowance;
    m.info.activation_bytes = allowance;
    InputMeter::Measurement ms = m.meter.suspend();  // plan as for any reserve
    try {
      (void)replan(m, why, bytes);
    } catch (...) {
      m.grid_reserve = m.grid_reserve - allowance + before;
      m.info.activation_bytes = before;
      m.meter.resume(std::move(ms), 0);
      throw;
    }
    m.meter.resume(std::move(ms), allowance);
    return true;
  }
  ExecutorOptions o = m.opt;
  o.budget = bytes;
  o.partition.clear();
  o.blocks = 0;
  o.resident.clear();
  o.retain_block = -1;
  std::optional<ExecutionPlan> next;
  if (m.grid && bytes > m.grid_reserve) {
    const Partition& part = m.grid->lookup(bytes - m.grid_reserve);
    if (part.feasible) {
      ExecutionPlan p = finish_plan(m.info, m.sk, part.blocks, part.resident, layer_costs(m.info, o), o.cost,
                                    effective_read_ahead(o), bytes, part.retain_block, part.retained_bytes,
                                    lend_for(m.info, o));
      if (p.total() <= bytes) {
        p.min_budget = m.weights_min + m.info.activation_bytes;
        next = std::move(p);
      }
    }
  }
  if (!next) next = plan_for(m.info, m.sk, o, m.path);  // throws if infeasible: nothing changes
  if (best_ms != nullptr) *best_ms = next->predicted_ms;
  if (must_beat_ms > 0 && !(next->predicted_ms < must_beat_ms)) return false;
  log(LogLevel::kDebug, m.path + ": planned " + format_bytes(bytes) + " in " +
                            std::to_string(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                                     t_plan).count()) +
                            " ms (" + (m.grid ? "budget grid" : "search") + ", " + replan_reason(why) + ")");
  m.opt = o;
  const bool running = m.run != nullptr;
  const int k = running ? m.run->next_layer() : 0;
  m.bound = false;
  adopt_or_release(m, std::move(*next));
  if (!running) {
    m.pump();  // the next inference's first blocks, now
    return true;
  }
  // Go on from layer k under the new plan (Note [Read-ahead ring]): the block containing it,
  // read from the first layer it needs.
  const int n = static_cast<int>(m.plan.blocks.size());
  m.cur = n;
  for (int b = 0; b < n; ++b) {
    if (m.plan.blocks[b].first <= k && k <= m.plan.blocks[b].second) {
      m.cur = b;
      break;
    }
  }
  m.rd_block = m.cur == n ? 0 : m.cur;
  m.rd_next = m.cur == n;
  m.rd_beyond = false;
  m.rd_first = m.cur == n ? -1 : m.first_needed(m.cur, k);
  if (m.rd_first == m.plan.blocks[m.rd_block].first) m.rd_first = -1;
  m.bind_loaded();
  m.pump();
  return true;
}

namespace {

// The activation reserve becomes `bytes`; re-plans at the budget in force (throws if it does not
// fit, the reserve restored).
void set_reserve(Executor::Impl& m, std::uint64_t bytes) {
  const std::uint64_t before = m.info.activation_bytes;
  m.grid_reserve = m.grid_reserve - before + bytes;
  m.info.activation_bytes = bytes;
  try {
    replan(m, Replan::kReserve, m.opt.budget);
  } catch (...) {
    m.grid_reserve = m.grid_reserve - bytes + before;
    m.info.activation_bytes = before;
    throw;
  }
}

// Before an inference whose input no profile covers: weights planned at their least, activations
// allowed the rest of the budget, the allocator refusing past it (Note [Dynamic shapes]).
void start_measuring(Executor::Impl& m, std::vector<ImageInput> in, const std::vector<c10::IValue>& inputs) {
  InputMeter::Measurement ms = m.meter.prepare(std::move(in), inputs, !m.caps().meters_activations, m.opt.budget, m.weights_min,
                                               m.info.activation_bytes, [&] { return m.inference_account(); });
  {
    // No zone while measuring: the allowance is all the budget leaves, past it the account refuses.
    m.lender.detach();
    m.lend_off = true;
    struct On {
      bool& b;
      ~On() { b = false; }
    } on{m.lend_off};
    set_reserve(m, ms.allowance);
  }
  m.meter.start(std::move(ms));
}

// After the measuring inference (between inferences): records the input's activations and plans
// with the larger reserve (`ok`), or restores the reserve before.
void end_measuring(Executor::Impl& m, bool ok) {
  if (!m.meter.measuring()) return;
  const std::uint64_t reserve = m.meter.end(ok && !m.released);
  if (m.released) {  // nothing to re-plan: the next set_budget() plans with the reserve before
    m.grid_reserve = m.grid_reserve - m.info.activation_bytes + reserve;
    m.info.activation_bytes = reserve;
    return;
  }
  try {
    set_reserve(m, reserve);
  } catch (const std::exception& e) {
    // Cannot happen (the measurement stayed within the budget); if it does, keep the measuring
    // plan, which fits.
    log(LogLevel::kError, m.path + ": re-planning after measuring activations failed: " + e.what());
  }
}

}  // namespace

std::uint64_t Executor::remeasured() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->meter.remeasured();
}

std::vector<InputProfile> Executor::input_profiles() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->meter.profiles();
}

// Note [A re-plan must gain]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A window whose costs are off re-planned with them, and put in force whatever plan was best
// with them, however close the plan in force came. Another plan is not free: its resident
// blocks are read again, its ring laid out again, and its prediction rests on costs one window
// measured. Under the 400 MB/s throttle, fcn_resnet101 at 73 MB with the profile measured there
// learned the disk at 336 MB/s in its first window (the plan's 451 ms became 568 ms with that
// rate) and re-planned to 45 blocks from 39 for a plan predicted 565 ms: 0.5 % faster, and
// measured 1-2 % slower than the plan it replaced in three interleaved rounds. So the costs are
// taken (the next plan and the learned-costs store use them) but the plan in force stays unless
// the best plan with them is predicted faster by more than kReplanGain; Learning::kept_plans
// counts the windows where it stayed. Not by the window's noise as well: both plans are
// predicted with the same costs, so their difference is not that noise, and it is usually the
// model's underestimate. resnet101 at 60 MB with a host-speed profile under the same throttle
// learned 402 MB/s with 11 % noise, and its best plan was predicted 6.2 % faster than the plan in
// force; it measured 20 % faster (392 -> 314 ms). With a budget grid (a Runtime's executors) the
// same rule decides once the grid rebuilt with the costs is ready: its plan at the budget in force
// against the plan in force. Either way the Runtime splits its budget again with the new curve
// (Note [Splitting with learned costs] in runtime.cpp); a model whose budget that split leaves
// as it was keeps its plan. In serve --learn 3 with resnet18 and mobilenet_v2 (70 % of their
// bytes, 8 s, 7 interleaved rounds), mobilenet_v2 put 19 learned plans in force before and 0
// after (17 kept); requests served moved within the VM's noise (medians of same-round ratios
// 1.047 and 1.038; bench/results/learn_serve_grid_margin.jsonl).
constexpr double kReplanGain = 0.02;

namespace {

bool learns(const Executor::Impl& m) {
  return m.opt.learn_after > 0 && m.caps().learns && !m.fixed_plan && m.opt.planner == ExecutorOptions::Planner::kOptimal;
}

}  // namespace

// Note [Learned costs kept] (cost_learner.cpp): at open, the costs learned before.
void load_learned(Executor::Impl& m) {
  if (!learns(m)) return;
  std::optional<LearnedCosts> got = load_learned_costs(m.opt.learn_store, m.path, m.info, m.opt.measured_exec);
  if (!got) return;
  CostLearner& l = *m.learner;
  if (got->layer_ms) {
    for (std::size_t i = 0; i < got->layer_ms->size(); ++i) m.info.layers[i].time_ms = (*got->layer_ms)[i];
    l.stats().loaded_times = l.times_learned = true;
  }
  if (got->read_mb_s > 0) {
    m.opt.cost.alpha_ms_per_byte = 1e3 / (got->read_mb_s * 1e6);
    l.stats().loaded_rate = l.rate_learned = true;
  }
}

// The costs in force, where ExecutorOptions::learn_store says.
void store_learned(Executor::Impl& m) {
  const std::string& path = m.opt.learn_store;
  if (path.empty()) return;
  CostLearner& l = *m.learner;
  std::vector<double> t;
  for (const ImageLayer& L : m.info.layers) t.push_back(L.time_ms);
  const double mb_s = l.rate_learned && m.opt.cost.alpha_ms_per_byte > 0 ? 1e-3 / m.opt.cost.alpha_ms_per_byte : 0.0;
  if (store_learned_costs(path, m.path, m.info, l.times_learned ? &t : nullptr, mb_s)) ++l.stats().stored;
}

// The plan in force (its blocks, residency and kept part) predicted with costs `c` and `k`.
static double in_force_ms(const Executor::Impl& m, const std::vector<LayerCost>& c, const CostModel& k) {
  return finish_plan(m.info, m.sk, m.plan.blocks, m.plan.resident, c, k, effective_read_ahead(m.opt), m.opt.budget,
                     m.plan.retain_block, m.plan.retained_bytes, lend_for(m.info, m.opt))
      .predicted_ms;
}

// A budget grid rebuilt for learned costs that is ready now is taken, and its plan at the budget in
// force put in force where it gains (Note [A re-plan must gain]); whether one was taken.
bool take_rebuilt_grid(Executor::Impl& m) {
  bool adopted_now = false;
  if (m.grid_next.valid() && m.grid_next.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    adopted_now = true;
    std::unique_ptr<PartitionTable> g;
    try {
      g = m.grid_next.get();
    } catch (const std::exception& e) {
      log(LogLevel::kWarn, m.path + ": rebuilding the budget grid for learned costs failed (" + e.what() +
                               "): plans search instead");
    }
    m.grid = std::move(g);
    if (!m.released) {
      // Note [A re-plan must gain], with the grid as without: the grid's plan at this budget is
      // put in force only if predicted faster than the plan in force, with the same (learned)
      // costs, by more than kReplanGain. Either way the Runtime sees the costs were taken
      // (adopted or kept_plans) and splits its budget again with the new grid's curve.
      // A re-plan that fails keeps the plan too, and counts as kept: the costs are taken and the
      // grid is new, so the Runtime's curve must follow them all the same.
      double in_force = m.plan.predicted_ms, best = 0;
      bool put = false;
      std::string failed;
      try {
        in_force = in_force_ms(m, layer_costs(m.info, m.opt), m.opt.cost);
        put = replan(m, Replan::kLearned, m.opt.budget, in_force * (1 - kReplanGain), &best);
      } catch (const std::exception& e) {
        failed = e.what();
      }
      if (put) {
        m.learner->stats().predicted_before_ms = m.grid_next_before_ms;
        m.learner->stats().predicted_after_ms = m.plan.predicted_ms;
        ++m.learner->stats().adopted;
      } else {
        m.plan.predicted_ms = in_force;
        ++m.learner->stats().kept_plans;
        if (!failed.empty()) {
          log(LogLevel::kWarn, m.path + ": re-planning with learned costs failed, the plan stays: " + failed);
        } else {
          log(LogLevel::kInfo, m.path + ": the budget grid rebuilt with learned costs is in use; the plan stays, predicted " +
                                   std::to_string(in_force) + " ms with them; the grid's plan at this budget " +
                                   std::to_string(best) + " ms is not more than " +
                                   std::to_string(static_cast<long long>(std::lround(100 * kReplanGain))) + " % faster");
        }
      }
    }
  }
  return adopted_now;
}

// Takes the costs the CostLearner decided on: planning uses them from now on (the grid rebuilt
// with them, or a re-plan at the budget in force that must gain, Note [A re-plan must gain]).
void take_learned(Executor::Impl& m, CostLearner::Decision d) {
  using Ms = std::chrono::duration<double, std::milli>;
  CostLearner& learner = *m.learner;
  Executor::Learning& l = learner.stats();
  const std::size_t L = m.info.layers.size();
  const bool take_times = d.take_times, take_reads = d.take_reads;
  const double before = m.plan.predicted_ms;
  const CostModel cost_before = m.opt.cost;
  std::vector<double> times_before;
  if (take_times) {
    for (std::size_t i = 0; i < L; ++i) {
      times_before.push_back(m.info.layers[i].time_ms);
      m.info.layers[i].time_ms = d.layer_ms[i];
    }
  }
  if (take_reads) m.opt.cost = d.cost;
  // The costs stay taken (Note [Learned costs kept]): written where they are kept only then, not
  // when the re-plan below fails and puts the old ones back.
  auto keep = [&] {
    learner.times_learned = learner.times_learned || take_times;
    learner.rate_learned = learner.rate_learned || take_reads;
    store_learned(m);
  };
  const std::string& what = d.what;
  const auto t0 = std::chrono::steady_clock::now();
  if (m.grid) {
    // The table is rebuilt off this thread; the plan in force runs until it is ready.
    const PartitionOptions po = partition_options(m.info, m.opt);
    std::vector<LayerCost> learned_costs = layer_costs(m.info, m.opt);
    const CostModel learned_cm = m.opt.cost;
    const std::uint64_t step = m.opt.grid_step;
    m.grid_next_before_ms = before;
    try {
      auto build = std::make_shared<GridBuild>();  // counted from now until the table is built
      m.grid_next = std::async(std::launch::async, [learned_costs = std::move(learned_costs), learned_cm, step, po,
                                                    build]() mutable {
        const std::shared_ptr<GridBuild> done = std::move(build);
        // The lowest priority: the inferences come first (a core of a Jetson's six, or of this VM's two).
        (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
        return std::make_unique<PartitionTable>(learned_costs, learned_cm, step, po);
      });
      keep();
      log(LogLevel::kInfo, m.path + ": over " + std::to_string(l.window) + " inferences, " + what +
                               ": the budget grid is rebuilt with them, and the plan follows once it is");
      return;
    } catch (const std::exception& e) {  // no thread: plans search from now on
      log(LogLevel::kWarn, m.path + ": no thread to rebuild the budget grid (" + e.what() +
                               "): budget changes search for their plan from now on");
      m.grid.reset();
    }
  }
  if (m.released) {  // the next set_budget() plans with them
    keep();
    return;
  }
  // Note [A re-plan must gain]: the plan in force, predicted with the costs just taken, stays
  // unless the best plan with them is predicted faster by more than kReplanGain (also for an
  // executor whose grid could not be rebuilt above: its Runtime splits again on a kept plan too).
  const double in_force = in_force_ms(m, layer_costs(m.info, m.opt), m.opt.cost);
  double best = 0;
  bool adopted = false;
  try {
    adopted = replan(m, Replan::kLearned, m.opt.budget, in_force * (1 - kReplanGain), &best);
  } catch (const std::exception& e) {
    // Cannot happen (the minimum budget does not depend on times); if it does, keep the plan
    // and the costs it was made with.
    if (take_times) {
      for (std::size_t i = 0; i < L; ++i) m.info.layers[i].time_ms = times_before[i];
    }
    m.opt.cost = cost_before;
    log(LogLevel::kError, m.path + ": re-planning with learned costs failed, the plan stays: " + e.what());
    return;
  }
  keep();
  if (!adopted) {
    m.plan.predicted_ms = in_force;
    ++l.kept_plans;
    log(LogLevel::kInfo, m.path + ": over " + std::to_string(l.window) + " inferences, " + what +
                             ": the plan stays, predicted " + std::to_string(in_force) + " ms with them; the best plan with them " +
                             std::to_string(best) + " ms is not more than " +
                             std::to_string(static_cast<long long>(std::lround(100 * kReplanGain))) + " % faster");
    return;
  }
  l.predicted_before_ms = before;
  l.predicted_after_ms = m.plan.predicted_ms;
  ++l.adopted;
  log(LogLevel::kInfo, m.path + ": over " + std::to_string(l.window) + " inferences, " + what + ": re-planned in " +
                           std::to_string(Ms(std::chrono::steady_clock::now() - t0).count()) +
                           " ms, predicted " + std::to_string(before) + " -> " + std::to_string(m.plan.predicted_ms) +
                           " ms, " + std::to_string(m.plan.blocks.size()) + " blocks");
}

// After an inference: a rebuilt grid taken, the inference shown to the CostLearner, and the
// costs it decides on taken (Note [Learning the costs in service] in cost_learner.cpp).
void learn_costs(Executor::Impl& m, bool whole) {
  const bool adopted_now = take_rebuilt_grid(m);
  if (!learns(m)) return;
  CostLearner& learner = *m.learner;
  if (!learner.timed(whole)) return;
  const CostLearner::IoCount now = CostLearner::io_count(*m.reader);
  if (m.grid_next.valid() || adopted_now) {  // a new window begins with the new plan
    learner.restart(now);
    return;
  }
  std::vector<double> planned_ms;
  for (const ImageLayer& L : m.info.layers) planned_ms.push_back(L.time_ms);
  auto predict = [&](const std::vector<LayerCost>& c, const CostModel& k) { return in_force_ms(m, c, k); };
  std::optional<CostLearner::Decision> d =
      learner.observe(now, planned_ms, layer_costs(m.info, m.opt), m.opt.cost, predict);
  if (d) take_learned(m, std::move(*d));
}

Executor::Learning Executor::learning() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->learner->stats();
}

CostModel Executor::cost() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->opt.cost;
}

void Executor::begin(std::vector<c10::IValue> inputs) {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  // Shed (shed_pending): the first step() re-plans, or returns at once for the move a cut's
  // interrupt asks for; re-planning here would read back at the old budget first.
  if (m.released) throw Error(m.path + ": released (no memory held): set_budget() first");
  if (m.run) throw Error(m.path + ": an inference is already in progress (finish() or abort() it first)");
  m.reader->check_file().throw_if_error();  // Note [The image changing on disk] (reader.cpp)
  {
    std::vector<ImageInput> in = describe_inputs(inputs);
    if (!m.meter.covers(in)) start_measuring(m, std::move(in), inputs);
  }
  m.backend->place_inputs(&inputs);
  std::uint64_t inputs_outside = 0;
  for (const auto& v : inputs) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu()) inputs_outside += v.toTensor().nbytes();
  }
  m.lender.set_inputs_outside(inputs_outside);
  try {
    m.run = std::make_unique<Skeleton::Run>(m.sk.begin(std::move(inputs)));
  } catch (...) {
    end_measuring(m, false);
    throw;
  }
  m.cur = 0;
  m.bound = false;
  m.cur_from_fetch = false;
  m.learner->begin();
  m.inference_t0 = TraceClock::now();
  m.held_why = nullptr;  // Note [Tracing]: the first stop of every inference is traced
  if (m.ring && m.ring->lend() > 0 && !m.meter.measuring()) {
    // Note [Lending the activation reserve]: this thread's account (a Runtime model's), else the
    // executor's own, places the inference's activations in the ring's zone.
    m.lender.begin(m.inference_account(), m.ring.get());
  }
  m.pump();
}

bool Executor::step(int stop_before) {
  Impl& m = *impl_;
  std::unique_lock<std::recursive_mutex> lk(m.mu);
  if (!m.run) throw Error(m.path + ": no inference in progress (begin() first)");
  if (m.cur >= static_cast<int>(m.plan.blocks.size())) return true;
  AccountScope charge(m.meter.measuring() ? m.meter.account() : m.lender.lends() ? m.lender.account() : 0);
  try {
    if (m.shed_pending) {
      // Shed between two steps for a cut whose set_budget() comes next (Runtime: the caller
      // checks for a move when step() returns): do not read back at the old budget first.
      if (m.yield.exchange(false)) return false;
      replan(m, Replan::kShed, m.opt.budget);  // no cut follows: read again what was shed
    }
    const int n = static_cast<int>(m.plan.blocks.size());
    if (m.cur >= n) return true;
    const int b = m.cur;
    const auto [first, last] = m.plan.blocks[b];
    if (!m.bound) {
      m.cur_from_fetch = false;
      if (!m.plan.resident[b] || m.kept_state[b] != Impl::Kept::kLoaded) {
        m.cur_fetch = m.take(b);
        m.cur_from_fetch = true;
        char* at = m.cur_fetch.bytes == 0 ? m.cur_fetch.at
                   : m.cur_fetch.resident     ? m.backend->address(*m.kept, m.cur_fetch.at)
                                              : m.backend->address(*m.ring, m.cur_fetch.at);
        m.bind_range(m.cur_fetch.first, last, at);
        if (m.cur_fetch.resident && m.cur_fetch.first == first) m.kept_state[b] = Impl::Kept::kLoaded;
        m.rebind_pinned();
        if (!m.caps().async) m.pump();  // the CPU computes now: queue what fits before it does
      }
      m.bound = true;
    }
    // An interrupt is taken after at least one layer, so that a storm of them cannot stall
    // the inference.
    bool ran = false;
    const bool pieces = m.cur_from_fetch && m.runs_by_layer(m.cur_fetch);
    while (m.run->next_layer() <= last) {
      if (m.run->next_layer() == stop_before) return false;
      if (ran && m.yield.exchange(false)) return false;  // interrupted at a layer boundary
      if (pieces && m.cur_waited < m.cur_fetch.pieces.size()) {
        // Note [Layer by layer]: this layer's bytes (and those before it in the block).
        Status st = m.wait_pieces(m.cur_fetch, m.run->next_layer());
        if (!st.ok()) throw Error(st.message() + " (block " + std::to_string(b) + " of " + std::to_string(n) + ")");
        if (m.cur_waited < m.cur_fetch.pieces.size()) ++m.layers_started_early;
      }
      m.running_layer = m.run->next_layer();
      m.lender.sync(m.running_layer);  // its activations go where they went before
      lk.unlock();  // shed() may give back what this layer does not read, meanwhile
      const auto layer_t0 = TraceClock::now();
      try {
        m.sk.run_layer(*m.run);
      } catch (...) {
        lk.lock();
        m.running_layer = -1;
        throw;
      }
      const auto layer_t1 = TraceClock::now();
      if (tracing()) trace_span(m.tgroup, TraceLane::kCompute, "layer", m.running_layer, layer_t0, layer_t1, "block", b);
      lk.lock();
      m.learner->time_layer(m.running_layer, std::chrono::duration<double, std::milli>(layer_t1 - layer_t0).count());
      m.meter.note_reach();
      m.lender.measure(m.running_layer);
      m.running_layer = -1;
      ran = true;
      // The rest of the block may have been given back: no further layer before a re-plan.
      if (m.shed_pending && m.run->next_layer() <= last) return false;
      std::uint64_t n_back = 0;
      if (pieces && m.run->next_layer() <= last) {
        // Note [Layer by layer]: the bytes before the lowest layer the rest still reads are dead.
        const int need = m.first_needed(b, m.run->next_layer());
        if (need > m.cur_fetch.first) {
          n_back = m.ring->release_front_until(m.cur_fetch.at + (m.offset(need) - m.offset(m.cur_fetch.first)));
          m.released_early += n_back;
        }
      }
      // Reads on: a block streaming over the bytes given back; and, lending, a block whose limit
      // the layer that ended was the last in the way of (the zone its activations needed is free
      // now), also inside a resident block or one read whole (Note [Lending the activation
      // reserve]).
      const bool lending = m.lender.lends() && m.caps().meters_activations && m.run->next_layer() <= last;
      if (n_back > 0 || lending) {
        const std::uint64_t pushed = m.fetch_order;
        m.pump();
        if (lending) m.read_at_layer_end += m.fetch_order - pushed;
      }
    }
    if (pieces) {
      Status st = m.wait_pieces(m.cur_fetch, last);  // all landed by now; weightless tails
      if (!st.ok()) throw Error(st.message() + " (block " + std::to_string(b) + " of " + std::to_string(n) + ")");
    }
    // Swap-out: drop the views, release the block's ring space (GPU: once its kernels are done).
    if (m.cur_from_fetch && !m.cur_fetch.resident && m.cur_fetch.bytes > 0) {
      m.sk.unbind_layers(m.cur_fetch.first, last);
      m.rebind_pinned();
      m.backend->block_done(*m.ring);
      if (m.caps().async) {
        m.pump(true);  // this block's kernels are queued: wait for the previous block's to read on
      } else {
        m.trace_memory();
      }
    } else if (m.cur_from_fetch && m.cur_fetch.resident && m.kept_state[b] != Impl::Kept::kLoaded) {
      m.sk.unbind_layers(m.cur_fetch.first, last);  // a trimmed resident block: read whole next time
      m.rebind_pinned();
    }
    m.bound = false;
    m.cur_from_fetch = false;
    ++m.cur;
    m.pump();
    return m.cur >= n;
  } catch (...) {
    if (m.meter.refused()) {
      const int k = m.run->next_layer();
      Error why(m.meter.refusal(m.opt.budget, m.weights_min, k, m.info.layers[k].name));
      abort();
      throw why;
    }
    abort();
    throw;
  }
}

c10::IValue Executor::finish() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  if (!m.run || m.cur < static_cast<int>(m.plan.blocks.size())) {
    throw Error(m.path + ": finish() before every block has run");
  }
  c10::IValue out;
  try {
    AccountScope charge(m.meter.measuring() ? m.meter.account() : m.lender.lends() ? m.lender.account() : 0);
    out = m.sk.finish(*m.run);
    // Outputs copied out of [lo, hi) (outside any account); the bytes copied.
    auto evict = [&](const char* lo, std::uint64_t bytes) {
      const int before = set_thread_cpu_account(0);
      struct Restore {
        int a;
        ~Restore() { set_thread_cpu_account(a); }
      } restore{before};
      std::uint64_t copied = 0;
      out = evict_from(out, lo, lo + bytes, &copied);
      return copied;
    };
    if (const auto [base, bytes] = m.meter.scratch(); bytes != 0) {
      // Note [Dynamic shapes]: outputs leave the scratch zone, which goes after this inference.
      m.meter.note_reach();
      (void)evict(base, bytes);
    }
    if (m.lender.lends()) {
      // Note [Lending the activation reserve]: outputs the caller keeps would hold zone bytes
      // the next inference's activations (or blocks) are planned to use: copied out, the zone's
      // chunks freed with the inference.
      const std::uint64_t copied = evict(m.ring->zone_begin(), m.ring->lend());
      m.lender.outputs_copied(copied);
    }
    // Blocks read after a write into the file would be mixed with those read before it.
    m.reader->check_file().throw_if_error();
  } catch (...) {
    abort();
    throw;
  }
  m.run.reset();
  trace_span(m.tgroup, TraceLane::kInference, "inference", m.inferences++, m.inference_t0, TraceClock::now());
  // Note [Lending the activation reserve]: one whole inference in this zone measured every
  // layer's reach.
  m.lender.end_inference();
  // Reads ahead of this inference belong to the next one now.
  for (auto& f : m.fetches) f.next = false;
  // The cursor at block 0 of the inference after the one that begins next (rd_beyond is set
  // only where advance() wraps: rd_block 0, rd_first -1) is at block 0 of the next one now.
  m.rd_next = m.rd_beyond;
  m.rd_beyond = false;
  m.cur = 0;
  m.register_ring();
  m.pump();
  const bool measured_input = m.meter.measuring();
  end_measuring(m, true);  // re-plans with the reserve this input needs
  try {
    learn_costs(m, !measured_input);
  } catch (const std::exception& e) {  // never this inference's failure: the plan in force stays
    log(LogLevel::kWarn, m.path + ": learning the costs failed, the plan stays: " + e.what());
  }
  return out;
}

void Executor::abort() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  m.cancel_cur_pieces();  // before cur_fetch is forgotten: its pieces may be in flight
  m.run.reset();
  m.bound = false;
  m.cur_from_fetch = false;
  m.cur = 0;
  m.yield.store(false);
  if (m.released) {
    end_measuring(m, false);
    return;
  }
  // Nothing half-read stays: reads cancelled and waited for, the ring emptied, swapped views
  // dropped; resident blocks read whole and pinned slots stay bound.
  try {
    m.drain();
    m.backend->idle(m.ring.get());
  } catch (const std::exception& e) {  // keep the first error; the GPU's is logged
    log(LogLevel::kError, m.path + ": waiting for the GPU after an error failed: " + e.what());
  }
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  m.bind_loaded();
  end_measuring(m, false);
}

bool Executor::in_inference() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->run != nullptr;
}
int Executor::next_layer() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->run ? impl_->run->next_layer() : 0;
}
void Executor::interrupt() { impl_->yield.store(true); }
namespace {
// Executor::next_block_unread_bytes with the executor's lock held; `wait`: block on the reader's.
bool next_unread_locked(const Executor::Impl& m, bool wait, std::uint64_t* out);
}  // namespace
std::uint64_t Executor::next_block_unread_bytes() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  std::uint64_t n = 0;
  next_unread_locked(*impl_, true, &n);
  return n;
}
bool Executor::try_next_block_unread_bytes(std::uint64_t* out) const {
  std::unique_lock<std::recursive_mutex> lk(impl_->mu, std::try_to_lock);
  return lk.owns_lock() && next_unread_locked(*impl_, false, out);
}
namespace {
bool next_unread_locked(const Executor::Impl& m, bool wait, std::uint64_t* out) {
  const int b = m.run ? m.cur : 0;
  if (m.released || b >= static_cast<int>(m.plan.blocks.size())) {
    *out = 0;
    return true;
  }
  // After shed() the block's bytes are gone: the next step re-plans and reads them again.
  if (m.shed_pending) {
    *out = m.plan.block_bytes[b];
    return true;
  }
  if (m.bound || (m.plan.resident[b] && m.kept_state[b] == Executor::Impl::Kept::kLoaded)) {
    *out = 0;
    return true;
  }
  for (const auto& f : m.fetches) {
    // Reads for this inference (between inferences: the next one's, `next` cleared by finish()).
    if (f.block != b || f.next) continue;
    return m.unlanded(f, wait, out);
  }
  *out = m.plan.block_bytes[b];  // not submitted yet
  return true;
}
}  // namespace

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
  if (!m.caps().sheds || m.released || m.shed_pending || m.plan.total() <= budget) return false;
  const auto t0 = std::chrono::steady_clock::now();
  // What the running layer reads: its own bytes and those of the layers in its block owning
  // weights it uses (weights owned outside its block are pinned).
  std::vector<std::pair<int, int>> keep_layers;  // [first, last] of byte ranges to keep, as layers
  int block = -1;
  const int k = m.running_layer;
  if (k >= 0) {
    for (size_t b = 0; b < m.plan.blocks.size(); ++b) {
      if (m.plan.blocks[b].first <= k && k <= m.plan.blocks[b].second) block = static_cast<int>(b);
    }
    keep_layers.emplace_back(k, k);
    for (int s : m.sk.layers()[k].used_slots) {
      const int owner = m.sk.slots()[s].layer;
      if (block >= 0 && owner >= m.plan.blocks[block].first && owner < k) keep_layers.emplace_back(owner, owner);
    }
  }
  // Reads: cancelled, and waited for (their pages are about to go), the running block's
  // pieces after the running layer too (Note [Layer by layer]).
  m.cancel_cur_pieces();
  for (auto& f : m.fetches) m.cancel_reads(f);
  for (auto& f : m.fetches) (void)m.wait_reads(f);
  m.fetches.clear();
  // Registered (io_uring fixed buffer) pages are pinned by the kernel: dropping them from the
  // mapping would not free them. The reader is idle now: unregister first.
  if (m.registered) {
    m.registered = !m.reader->register_buffers({});
    if (m.registered) log(LogLevel::kError, m.path + ": internal: reads in flight after cancelling them; the ring stays pinned");
  }
  std::uint64_t kept = 0;
  // The ring: only the running layer's bytes, when it runs from a swapped block.
  if (m.ring) {
    std::vector<std::pair<const char*, std::uint64_t>> keep;
    if (block >= 0 && !m.plan.resident[block] && m.cur_from_fetch && m.cur_fetch.block == block) {
      for (const auto& [a, b] : keep_layers) {
        if (a < m.cur_fetch.first) continue;
        keep.emplace_back(m.cur_fetch.at + (m.offset(a) - m.offset(m.cur_fetch.first)), m.span(a, b));
        kept += m.span(a, b);
      }
    }
    // The zone is the activation reserve (Note [Lending the activation reserve]): activations of
    // the running layer live there; blocks lent its bytes are within it.
    if (m.ring->lend() > 0) keep.emplace_back(m.ring->zone_begin(), m.ring->lend());
    m.ring->discard_except(keep);
    m.retained_valid = false;  // the kept bytes went too, but for the running layer's
  }
  // Resident blocks: dropped (but the running layer's bytes, when it runs from one).
  if (m.kept) {
    for (size_t b = 0; b < m.plan.blocks.size(); ++b) {
      if (!m.plan.resident[b] || m.plan.block_bytes[b] == 0) continue;
      const std::uint64_t base = m.kept_at[b];
      std::uint64_t at = base;
      if (static_cast<int>(b) == block) {
        std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
        for (const auto& [a, e] : keep_layers) {
          ranges.emplace_back(base + (m.offset(a) - m.offset(m.plan.blocks[b].first)), m.span(a, e));
        }
        std::sort(ranges.begin(), ranges.end());
        for (const auto& [off, len] : ranges) {
          if (off > at) m.kept->discard(at, off - at);
          at = std::max(at, off + len);
          kept += len;
        }
      }
      m.kept->discard(at, base + m.plan.block_bytes[b] - at);
      m.kept_state[b] = Executor::Impl::Kept::kNone;
    }
  }
  m.shed_pending = true;
  m.shed_held = kept + m.pinned_need;
  log(LogLevel::kDebug, m.path + ": shed down to " + format_bytes(m.shed_held) + " (layer " + std::to_string(k) +
                            " running) in " +
                            std::to_string(std::chrono::duration<double, std::milli>(
                                               std::chrono::steady_clock::now() - t0).count()) +
                            " ms");
  return true;
}

c10::IValue Executor::forward(std::vector<c10::IValue> inputs) {
  begin(std::move(inputs));
  while (!step()) {
  }
  return finish();
}

const ExecutionPlan& Executor::plan() const { return impl_->plan; }
const ImageInfo& Executor::info() const { return impl_->info; }
const Skeleton& Executor::skeleton() const { return impl_->sk; }
std::uint64_t Executor::bytes_read() const { return impl_->reader->bytes_read(); }
void Executor::set_read_priority(double priority) { impl_->reader->set_priority(priority); }
std::uint64_t Executor::bytes_used() const { return impl_->used_bytes; }
Executor::PipelineStats Executor::pipeline_stats() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  PipelineStats p;
  p.read_wait_ms = impl_->read_wait_seconds * 1e3;
  p.layers_started_early = impl_->layers_started_early;
  p.released_early_bytes = impl_->released_early;
  p.read_past_streamed = impl_->read_past_streamed;
  p.read_at_layer_end = impl_->read_at_layer_end;
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
  return impl_->streamed;
}
double Executor::bind_us_per_tensor() const {
  return impl_->bound_tensors ? impl_->bind_seconds * 1e6 / static_cast<double>(impl_->bound_tensors) : 0.0;
}
IoBackend Executor::backend() const { return impl_->reader->backend(); }
MemoryKind Executor::memory() const { return impl_->ring ? impl_->ring->kind() : impl_->opt.memory; }

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

WeightMemory Executor::weight_memory() const {
  const Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  WeightMemory w;
  w.peak = m.weight_peak;
  if (m.released) return w;
  w.held = m.shed_pending ? m.shed_held : (m.ring ? m.ring->kept() + m.ring->capacity() : 0) + m.kept_bytes + m.pinned_need;
  if (m.caps().host_pages) {
    if (m.ring) w.resident_pages += resident_bytes_of(m.ring->kept_begin(), m.ring->kept() + m.ring->capacity());
    if (m.kept) w.resident_pages += resident_bytes_of(m.kept->base(), m.kept->capacity());
    w.resident_pages += resident_bytes_of(m.pinned_buf, m.pinned_need);
  }
  return w;
}
void Executor::reset_weight_peak() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  m.weight_peak = 0;
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
    const std::uint64_t reserve = m.meter.end(false);
    m.grid_reserve = m.grid_reserve - m.info.activation_bytes + reserve;
    m.info.activation_bytes = reserve;
  }
  m.run.reset();
  m.bound = false;
  try {
    m.drain();
    m.backend->idle(m.ring.get());
  } catch (const std::exception& e) {
    log(LogLevel::kError, m.path + ": waiting for the GPU before releasing failed: " + e.what());
  }
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  if (!m.reader->register_buffers({})) {  // unpin before freeing; drained, so never refused
    log(LogLevel::kError, m.path + ": internal: reads in flight after draining; the ring is kept");
    return;
  }
  m.drop_ring();
  m.kept.reset();
  m.kept_bytes = 0;
  m.kept_state.assign(m.kept_state.size(), Executor::Impl::Kept::kNone);
  m.drop_pinned();
  m.released = true;
  m.shed_pending = false;
  log(LogLevel::kInfo, m.path + ": released every byte held for weights");
  give_heap_back(m.path);
}

std::vector<std::pair<std::uint64_t, double>> Executor::latency_curve() const {
  const Impl& m = *impl_;
  std::unique_ptr<PartitionTable> local;
  const PartitionTable* table = m.grid.get();
  std::uint64_t reserve = m.grid_reserve;
  if (table == nullptr) {
    reserve = planning_reserve(m.info, m.sk, m.opt);
    local = std::make_unique<PartitionTable>(layer_costs(m.info, m.opt), m.opt.cost, default_grid_step(m.info),
                                             partition_options(m.info, m.opt));
    table = local.get();
  }
  std::vector<std::pair<std::uint64_t, double>> curve;
  const std::uint64_t minimum = min_budget_for(m.info, m.sk, effective_read_ahead(m.opt));
  ExecutorOptions o = m.opt;
  o.budget = minimum;
  o.partition.clear();
  o.blocks = 0;
  o.resident.clear();
  o.retain_block = -1;
  curve.emplace_back(minimum, plan_for(m.info, m.sk, o, m.path).predicted_ms);
  for (std::size_t i = 0; i < table->size(); ++i) {
    const Partition& p = table->at(i);
    const std::uint64_t budget = table->grid()[i] + reserve;
    if (!p.feasible || budget <= curve.back().first) continue;
    curve.emplace_back(budget, std::min(p.predicted_ms, curve.back().second));
  }
  return curve;
}

}  // namespace swapnet
