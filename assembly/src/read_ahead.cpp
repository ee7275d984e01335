// The read-ahead cursor: BlockCursor (read_ahead.h).
#include "read_ahead.h"

#include <algorithm>

namespace swapnet {

namespace {
constexpr std::chrono::microseconds kTraceWaitMin{10};  // shorter waits are not traced
static_assert(BlockCursor::kPiece % kImageAlign == 0);
}  // namespace

char* zero_page() {
  alignas(4096) static char page[4096];
  return page;
}

BlockCursor::BlockCursor(std::string path, const ImageInfo& info, Config cfg, Weights& w, BlockReader& reader,
                     DeviceBackend& backend, ZoneLender& lender)
    : path_(std::move(path)), info_(info), cfg_(cfg), w_(w), reader_(reader), backend_(backend), lender_(lender),
      verified_(info.layers.size(), false) {}

void BlockCursor::note_in_use() {
  w_.note_in_use(tgroup_);
  lender_.note_lent(w_.ring.get());
}

void BlockCursor::seek(int b, int first, bool next) {
  at_ahead_limit_ = false;
  rd_block = b;
  rd_first = first;
  rd_next = next;
  rd_beyond = false;
}

void BlockCursor::inference_done() {
  for (auto& f : fetches_) f.next = false;
  // The cursor at block 0 of the inference after the one that begins next (rd_beyond is set
  // only where advance() wraps: rd_block 0, rd_first -1) is at block 0 of the next one now.
  rd_next = rd_beyond;
  rd_beyond = false;
}

void BlockCursor::drop_fetches() {
  cancel_executing();
  for (auto& f : fetches_) cancel_reads(f);
  for (auto& f : fetches_) (void)wait_reads(f);
  fetches_.clear();
}

bool BlockCursor::unlanded_of(int b, bool wait, std::uint64_t* out) const {
  for (const auto& f : fetches_) {
    // Reads for this inference (between inferences: the next one's, `next` cleared by finish()).
    if (f.block != b || f.next) continue;
    return unlanded(f, wait, out);
  }
  *out = w_.plan.block_bytes[b];  // not submitted yet
  return true;
}

// The cursor stopped at block b for `why` (a literal): traced once per change of either.
void BlockCursor::held(const char* why, int b) {
  if (!tracing() || (why == held_why_ && b == held_block_)) return;
  held_why_ = why;
  held_block_ = b;
  trace_instant(tgroup_, TraceLane::kCursor, why, b);
}
// The checks a read of layers [first, last] must make under the verify policy.
std::vector<BlockReader::Check> BlockCursor::checks_for(int first, int last) const {
  std::vector<BlockReader::Check> c;
  if (cfg_.verify == ExecutorOptions::Verify::kNever) return c;
  for (int k = first; k <= last; ++k) {
    const ImageLayer& L = info_.layers[k];
    if (L.size == 0 || (cfg_.verify == ExecutorOptions::Verify::kFirst && verified_[k])) continue;
    c.push_back({L.offset, L.size, L.checksum, "layer " + std::to_string(k) + " (" + L.name + ")"});
  }
  return c;
}
void BlockCursor::mark_verified(int first, int last) {
  for (int k = first; k <= last; ++k) verified_[k] = true;
}
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
void BlockCursor::advance() {
  rd_first = -1;
  if (++rd_block == static_cast<int>(w_.plan.blocks.size())) {
    rd_block = 0;
    if (rd_next) rd_beyond = true;
    rd_next = true;
  }
}
// Submits every read the ring (and the cursor's limits) allow now. GPU: waits for the kernels
// `wait` says to free space.
void BlockCursor::pump(const Position& pos, KernelWait wait) {
  const int k = pos.next_layer < 0 ? 0 : pos.next_layer;
  try {
    pump_reads(pos, wait);
  } catch (...) {
    lender_.sync(k);
    throw;
  }
  lender_.sync(k);  // the zone's floor follows the blocks held
}
bool BlockCursor::starved() const {
  if (fetches_.empty()) return !at_ahead_limit_;
  const Fetch& f = fetches_.front();
  return f.streamed() && std::find(f.pieces.begin(), f.pieces.end(), BlockReader::Ticket{0}) != f.pieces.end();
}
void BlockCursor::pump_reads(const Position& pos, KernelWait wait) {
  at_ahead_limit_ = false;
  if (pos.stopped || w_.plan.blocks.empty()) return;
  // A streamed block's pieces whose bytes are free now (GPU: older blocks whose kernels are done
  // are gone first, all of them with kAll); blocks that overlap nothing held may still go after
  // it (Note [Streaming into the ring]).
  if (w_.ring) backend_.reclaim(*w_.ring, wait == KernelWait::kAll);
  bool streaming = false;
  for (Fetch& f : fetches_) {
    if (f.streamed() && !stream_pieces(f)) streaming = true;
  }
  if (streaming && !cfg_.read_past_streamed) return held("held: a block streams", rd_block);
  const int n = static_cast<int>(w_.plan.blocks.size());
  for (int guard = 0; guard < 2 * n + 2; ++guard) {
    if (rd_beyond || (rd_next && (!cfg_.cross_inference || rd_block >= pos.cur))) {
      at_ahead_limit_ = true;
      return held("held: an inference ahead", rd_block);
    }
    Fetch f = cursor_fetch();
    const int b = f.block;
    if (w_.plan.resident[b]) {
      if (w_.kept_state[b] != Weights::Kept::kNone) {
        advance();
        continue;
      }
      const int bf = w_.plan.blocks[b].first;
      f.resident = true;
      f.at = f.bytes > 0 ? w_.kept->base() + w_.kept_at[b] + (offset(f.first) - offset(bf)) : zero_page();
      if (f.first == bf) w_.kept_state[b] = Weights::Kept::kLoading;
    } else if (f.bytes > 0) {
      const Step step = place_in_ring(f, pos, wait, streaming);
      if (step == Step::kStop) return;
      if (step == Step::kNext) continue;
    }
    submit(f);
  }
}
// The fetch of the block at the cursor (from rd_first where trimmed), not placed yet.
Fetch BlockCursor::cursor_fetch() const {
  const int b = rd_block;
  const auto [bf, bl] = w_.plan.blocks[b];
  const int first = rd_first >= 0 ? rd_first : bf;
  Fetch f;
  f.block = b;
  f.first = first;
  f.last = bl;
  f.bytes = span(first, bl);
  f.next = rd_next;
  f.order = fetch_order_ + 1;
  return f;
}
// A block with bytes, not resident: its place in the ring, waiting (as `wait` says) for the
// kernels of executed blocks to free it; where there is none, streamed into it. kGoOn: placed,
// its reads to submit; kNext: streamed and queued, the cursor on; kStop: the cursor stops.
BlockCursor::Step BlockCursor::place_in_ring(Fetch& f, const Position& pos, KernelWait wait, bool& streaming) {
  const auto [bf, bl] = w_.plan.blocks[f.block];
  // The block kept in part (Note [Keeping part of a block]): read from its first layer
  // (never trimmed), its rest at the ring's first byte; whole (into the kept bytes too)
  // until that has been done once, or when its checksums are to be verified.
  const bool keeps = f.block == w_.plan.retain_block;
  std::uint64_t kept = 0;
  if (keeps) {
    f.first = bf;
    f.bytes = span(bf, bl);
    kept = w_.plan.retained_bytes;
    f.skip = w_.retained_valid && checks_for(bf, bl).empty() ? kept : 0;
  }
  backend_.reclaim(*w_.ring, false);
  // Where it does not fit, the oldest executed blocks whose kernels still run go first, as far
  // as `wait` allows (the block kept in part needs the ring's first bytes, which one of them may
  // hold while there is room elsewhere).
  const std::size_t may_run = wait == KernelWait::kOlder ? 1 : 0;  // the newest block's kernels
  char* at = nullptr;
  while ((at = static_cast<char*>(keeps ? w_.ring->push_first(f.bytes - kept)
                                        : w_.ring->push(f.bytes, ring_limit(pos, f)))) == nullptr &&
         wait != KernelWait::kNone && backend_.pending() > may_run) {
    backend_.reclaim(*w_.ring, true, true);
  }
  if (at == nullptr) return stream_into_ring(f, pos, keeps, kept, streaming);
  f.at = at - kept;
  if (streaming) ++stats_.read_past_streamed;
  return Step::kGoOn;
}
// No room in the ring for the whole of `f` (`kept` bytes of it in the kept part when `keeps`):
// streamed (Note [Streaming into the ring]), its pieces read as older blocks free their bytes.
// Not with checksums to verify (they need the layer whole in one read). kNext: queued, the
// cursor on (blocks that overlap nothing held may follow it); kStop: the cursor stops.
BlockCursor::Step BlockCursor::stream_into_ring(Fetch& f, const Position& pos, bool keeps, std::uint64_t kept,
                                                bool& streaming) {
  const int b = f.block;
  if (!cfg_.stream || f.bytes - kept <= kPiece || !checks_for(f.first, f.last).empty() || f.skip != kept) {
    held(!keeps && w_.ring->lend() > 0 && w_.ring->fits(f.bytes, w_.ring->capacity() + w_.ring->lend())
             ? "held: activations' zone"
             : "held: no room",
         b);
    return Step::kStop;
  }
  char* at = static_cast<char*>(keeps ? w_.ring->push_first_streamed(f.bytes - kept)
                                      : w_.ring->push_streamed(f.bytes, ring_limit(pos, f)));
  if (at == nullptr) {
    held(w_.ring->streaming()                                                        ? "held: a block streams"
         : !keeps && w_.ring->lend() > 0 && w_.ring->fits(f.bytes, w_.ring->capacity() + w_.ring->lend())
             ? "held: activations' zone"
             : "held: no room to stream",
         b);
    return Step::kStop;
  }
  f.at = at - kept;
  f.pieces.assign((f.bytes - f.skip + kPiece - 1) / kPiece, 0);
  f.stream = true;
  ++stats_.streamed;
  trace_submitted(f);
  fetch_order_ = f.order;
  fetches_.push_back(std::move(f));
  streaming = !stream_pieces(fetches_.back());
  note_in_use();
  advance();
  if (streaming && !cfg_.read_past_streamed) return Step::kStop;
  return Step::kNext;
}
// Submits the reads of a placed fetch (whole, or in pieces: Note [Layer by layer]), queues it
// and moves the cursor on.
void BlockCursor::submit(Fetch& f) {
  if (f.bytes > 0 && layer_by_layer(f)) {
    // In pieces, so that its first layers run while the rest lands (Note [Layer by layer]).
    f.pieces.assign((f.bytes - f.skip + kPiece - 1) / kPiece, 0);
    for (size_t i = 0; i < f.pieces.size(); ++i) {
      const std::uint64_t at = f.skip + i * kPiece, len = std::min(kPiece, f.bytes - at);
      f.pieces[i] = reader_.submit(offset(f.first) + at, len, f.at + at, {}, f.order);
    }
  } else if (f.bytes > 0) {
    f.ticket = reader_.submit(offset(f.first) + f.skip, f.bytes - f.skip, f.at + f.skip,
                              f.skip ? std::vector<BlockReader::Check>{} : checks_for(f.first, f.last), f.order);
  } else {
    f.at = zero_page();  // weightless layers: views of nothing, somewhere valid
  }
  trace_submitted(f);
  fetch_order_ = f.order;
  fetches_.push_back(f);
  note_in_use();
  advance();
}
// A fetch was queued: traced as "read block b" (its reads are named by f.order).
void BlockCursor::trace_submitted(const Fetch& f) {
  if (!tracing()) return;
  held_why_ = nullptr;
  trace_instant(tgroup_, TraceLane::kCursor, f.streamed() ? "stream block" : "read block", f.block, "order",
                static_cast<std::int64_t>(f.order));
}
// Submits the pieces of a streamed fetch whose ring bytes no older block holds now; whether
// every piece is submitted.
bool BlockCursor::stream_pieces(Fetch& f) {
  bool all = true;
  for (size_t i = 0; i < f.pieces.size(); ++i) {
    if (f.pieces[i] != 0) continue;
    const std::uint64_t at = f.skip + i * kPiece, len = std::min(kPiece, f.bytes - at);
    if (!w_.ring->range_free(f.at + at, len)) {
      all = false;
      continue;
    }
    f.pieces[i] = reader_.submit(offset(f.first) + at, len, f.at + at, {}, f.order);
  }
  return all;
}
// Cancels a fetch's reads (pieces not submitted yet: never will be).
void BlockCursor::cancel_reads(const Fetch& f) {
  if (f.ticket) reader_.cancel(f.ticket);
  for (auto t : f.pieces) {
    if (t) reader_.cancel(t);
  }
}
// Waits for a fetch's reads: the first error, else ok. Every piece is waited for.
Status BlockCursor::wait_reads(const Fetch& f) {
  Status st;
  if (f.ticket) st = reader_.wait(f.ticket);
  for (auto t : f.pieces) {
    if (!t) continue;
    Status s = reader_.wait(t);
    if (st.ok() && !s.ok()) st = s;
  }
  return st;
}
// Bytes of a fetch not landed yet (pieces not submitted: all of theirs); false when `wait` is
// false and the reader's lock is busy.
bool BlockCursor::unlanded(const Fetch& f, bool wait, std::uint64_t* out) const {
  std::uint64_t n = 0;
  auto one = [&](BlockReader::Ticket t, std::uint64_t bytes) {
    if (!t) {
      n += bytes;
      return true;
    }
    if (wait) {
      n += reader_.unlanded_bytes(t);
      return true;
    }
    std::uint64_t u = 0;
    if (!reader_.try_unlanded_bytes(t, &u)) return false;
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
void BlockCursor::drain() {
  cancel_executing();
  for (auto& f : fetches_) cancel_reads(f);
  for (auto& f : fetches_) {
    (void)wait_reads(f);
    if (f.resident && f.first == w_.plan.blocks[f.block].first) w_.kept_state[f.block] = Weights::Kept::kNone;
  }
  fetches_.clear();
  if (w_.ring) backend_.reclaim(*w_.ring, true);
  if (w_.ring) w_.ring->clear();
  rd_block = 0;
  rd_first = -1;
  rd_next = false;
  rd_beyond = false;
  at_ahead_limit_ = false;
}
// Note [Layer by layer]
// ~~~~~~~~~~~~~~~~~~~~~
// A block's layers run in the order their bytes lie in it, and the memory bound a plan is
// judged by (partitioner's memory_bound_ms) is layer-granular: a layer may start once its own
// weights are in, and its bytes may be reused once it has run. The executor used to be
// block-granular on both ends: a block ran only when all of it had landed (the disk's last
// megabytes of a 20 MB block stalled its first layer), and its ring bytes were free only after
// its last layer (with a ring of one large block the next block's pieces waited for that). It
// now reads a block that fits in pieces of kPiece bytes too, waits before each layer only for
// the pieces that hold it (and the layers before it in the block, whose weights it may share),
// and after each layer gives the ring back the bytes before the lowest layer the rest of the
// block still reads (BlockRing::release_front_until; on a GPU once those layers' kernels are
// done), so a block streaming over it reads on while it computes. Not with checksums to verify (a layer's
// checksum needs it in one read: the first inference under --verify first reads whole), not
// for the block kept in part. Pieces of the executing block not yet waited for are cancelled
// and waited for wherever reads are (drain, shed, an error).
//
// On the GPU (Note [Swapping onto the GPU] in device_backend.cpp) each piece is handed over to
// the device as it is waited for, and a layer's kernels are queued once its pieces are in, so
// the GPU computes a block's first layers while its last megabytes land instead of after them.
// The bytes the rest of the block no longer reads go back there too, once the kernels queued so
// far are done (Note [Ring space behind the kernels] in kernel_queue.cpp). The two-block ring
// runs layers as their pieces land too, and gives nothing back early (its other end is the next
// block's). The planner's simulation plays each the same way (simulate_ms by_layer).
bool BlockCursor::layer_by_layer(const Fetch& f) const {
  return cfg_.layer_by_layer && w_.ring && !f.resident && f.block != w_.plan.retain_block &&
         f.bytes - f.skip > kPiece && checks_for(f.first, f.last).empty();
}
// Whether a fetch's layers run as its pieces land (streamed ones too).
bool BlockCursor::runs_by_layer(const Fetch& f) const {
  return !f.pieces.empty() && cfg_.layer_by_layer && f.block != w_.plan.retain_block;
}
Status BlockCursor::timed_wait(const Fetch& f) {
  const auto t0 = std::chrono::steady_clock::now();
  Status st = wait_reads(f);
  waited(f.block, f.first, t0);
  return st;
}
// The executing thread waited for block b's bytes (those of layer k on) since t0: counted, told
// to the backend (Note [The CUDA backend's host twin]) and traced where it blocked.
void BlockCursor::waited(int b, int k, std::chrono::steady_clock::time_point t0) {
  const auto t1 = std::chrono::steady_clock::now();
  stats_.read_wait_seconds += std::chrono::duration<double>(t1 - t0).count();
  if (t1 - t0 < kTraceWaitMin) return;
  backend_.waited_for_reads();
  trace_span(tgroup_, TraceLane::kWait, "wait for block", b, t0, t1, "layer", k);
}
// Waits for the pieces of `f` (read in pieces) that hold layers f.first..k; waited_ counts
// them. The first error, else ok.
Status BlockCursor::wait_pieces(const Fetch& f, int k) {
  const std::uint64_t end = offset(k) + info_.layers[k].size - offset(f.first);
  const std::size_t need = end <= f.skip ? 0 : std::min<std::size_t>(f.pieces.size(), (end - f.skip + kPiece - 1) / kPiece);
  if (waited_ >= need) return Status();
  const auto t0 = std::chrono::steady_clock::now();
  Status st;
  const std::size_t from = waited_;
  for (; waited_ < need; ++waited_) {
    Status s = reader_.wait(f.pieces[waited_]);
    if (st.ok() && !s.ok()) st = s;
  }
  if (st.ok()) {  // the pieces that landed now, to the device (Note [Layer by layer])
    const std::uint64_t at = f.skip + from * kPiece, to = std::min(f.bytes, f.skip + need * kPiece);
    backend_.hand_over(w_.ring->kind(), f.at + at, to - at);
  }
  waited(f.block, k, t0);
  return st;
}
// Cancels and waits for the pieces of `f` not waited for yet (f.pieces[waited_..]).
void BlockCursor::cancel_pieces_left(const Fetch& f) {
  for (std::size_t i = waited_; i < f.pieces.size(); ++i) reader_.cancel(f.pieces[i]);
  for (; waited_ < f.pieces.size(); ++waited_) (void)reader_.wait(f.pieces[waited_]);
}
// The same for the executing block.
void BlockCursor::cancel_executing() {
  if (has_cur_) cancel_pieces_left(cur_);
}

// Waits for the front fetch, which must be block `b` of this inference.
const Fetch& BlockCursor::take(int b, const Position& pos) {
  has_cur_ = false;
  // GPU: its room may be held by executed blocks whose kernels still run, the newest among them
  // (pump(kOlder) leaves that one running). Nothing else can free it, and this thread needs b
  // now: wait for as many as it takes. Where b does not fit beside the newest (the first block
  // of the next inference after the last, after a re-plan, a ring of one block), this is where
  // the ring waits; found with the CUDA backend's host twin (Note [The CUDA backend's host
  // twin]: the Runtime's deadline test failed "not read ahead in order").
  if (fetches_.empty()) pump(pos, KernelWait::kAll);
  if (fetches_.empty() || fetches_.front().block != b || fetches_.front().next) {
    const std::string front = fetches_.empty() ? std::string("nothing")
                                               : "block " + std::to_string(fetches_.front().block) +
                                                     (fetches_.front().next ? " of the next inference" : "");
    throw Error(path_ + ": internal: block " + std::to_string(b) + " was not read ahead in order (read ahead: " +
                front + "; " + std::to_string(w_.ring ? w_.ring->blocks() : 0) + " blocks in the ring, " +
                std::to_string(backend_.pending()) + " of them executed)");
  }
  // A streamed block's last pieces may wait for older blocks only the GPU's kernels still hold
  // (the thread needs it now: as above).
  if (fetches_.front().streamed() && !stream_pieces(fetches_.front())) {
    backend_.reclaim(*w_.ring, true);
    if (!stream_pieces(fetches_.front())) {
      throw Error(path_ + ": internal: block " + std::to_string(b) + " streamed while older blocks hold its bytes");
    }
  }
  Fetch f = fetches_.front();
  fetches_.pop_front();
  waited_ = 0;
  const bool by_layer = f.reads() && runs_by_layer(f);
  if (f.reads()) {
    // In pieces: only its first layer's bytes now, the rest layer by layer (step()).
    Status st = by_layer ? wait_pieces(f, f.first) : timed_wait(f);
    if (!by_layer) waited_ = f.pieces.size();
    if (!st.ok()) {
      cancel_pieces_left(f);  // the pieces after a failed one may still be in flight
      if (f.resident && w_.kept_state[b] == Weights::Kept::kLoading) w_.kept_state[b] = Weights::Kept::kNone;
      if (!f.resident) ring_pop_now();
      throw Error(st.message() + " (block " + std::to_string(b) + " of " + std::to_string(w_.plan.blocks.size()) + ")");
    }
    mark_verified(f.first, f.last);
    stats_.used_bytes += f.bytes - f.skip;
    if (b == w_.plan.retain_block && !f.resident) w_.retained_valid = true;
  }
  // Read whole: to the device now; in pieces: each as it is waited for (wait_pieces).
  if (f.bytes > 0 && !by_layer) {
    backend_.hand_over(f.resident ? w_.kept->kind() : w_.ring->kind(), f.at, f.bytes);
  }
  cur_ = std::move(f);
  has_cur_ = true;
  return cur_;
}
// The oldest ring entry goes now (the block failed or was never run).
void BlockCursor::ring_pop_now() {
  backend_.reclaim(*w_.ring, true);
  w_.ring->pop();
}

}  // namespace swapnet
