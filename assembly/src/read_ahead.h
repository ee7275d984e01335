// The read-ahead cursor (internal to the assembly module; Note [Read-ahead ring] and the notes
// in read_ahead.cpp). The BlockCursor submits reads of the plan's blocks in order into the ring (or a
// resident block's place in the resident arena) as far as the ring, the zone the activation
// reserve lends and the cursor's limits allow, and serves the executing thread's waits for them:
// a block whole, or layer by layer as its pieces land. It reads into the Weights the executor
// holds for the plan in force and never changes the plan.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "device_backend.h"
#include "planning.h"
#include "swapnet/assembly.h"
#include "weights.h"
#include "zone_lender.h"

namespace swapnet {

// Where weightless blocks' views point (they have no bytes, but need an address).
char* zero_page();

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
  bool resident = false;       // into the resident arena
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

class BlockCursor {
 public:
  static constexpr std::uint64_t kPiece = kStreamPieceBytes;  // as the planner's simulation
  struct Config {
    ExecutorOptions::Verify verify = ExecutorOptions::Verify::kFirst;
    bool stream = true;              // ExecutorOptions::stream
    bool read_past_streamed = true;  // ExecutorOptions::read_past_streamed
    bool layer_by_layer = true;      // ExecutorOptions::layer_by_layer
    bool cross_inference = true;     // reads on into the next inference (not BlockCursor::kPaper)
  };
  // Where the executing thread is: the block executing (or next to execute), the next layer of
  // the inference in progress (-1: none), and whether reads are held (released, or shed).
  struct Position {
    int cur = 0;
    int next_layer = -1;
    bool stopped = false;
  };
  struct Stats {
    std::uint64_t streamed = 0;            // blocks read streamed
    std::uint64_t read_past_streamed = 0;  // blocks pushed while a streamed one waited
    std::uint64_t used_bytes = 0;          // bytes the executing thread took
    double read_wait_seconds = 0;          // the executing thread waiting for bytes to land
  };

  BlockCursor(std::string path, const ImageInfo& info, Config cfg, Weights& w, BlockReader& reader,
            DeviceBackend& backend, ZoneLender& lender);

  void set_trace_group(std::uint32_t g) { tgroup_ = g; }
  void new_inference() { held_why_ = nullptr; }  // Note [Tracing]: its first stop is traced

  // GPU: which executed blocks' kernels pump may wait for, to free ring space: none, all but the
  // newest (which may be running now; the host goes on queueing meanwhile), or all (the thread
  // needs the next block's read under way now, and nothing else can free its room).
  enum class KernelWait { kNone, kOlder, kAll };
  // Submits every read the ring (and the cursor's limits) allow now, waiting for kernels as
  // `wait` says; the zone's floor follows.
  void pump(const Position& pos, KernelWait wait = KernelWait::kNone);
  // Whether the next read waits for room: nothing is read ahead though the cursor is not at its
  // limit (one inference ahead: the rest resident and loaded, say), or the oldest read ahead
  // streams with pieces not submitted yet (GPU: room only executed blocks' kernels may hold).
  bool starved() const;
  // Waits for the front fetch, which must be block `b` of this inference, and makes it the
  // executing one: whole, or (runs_by_layer) its first layer's pieces.
  const Fetch& take(int b, const Position& pos);
  // The executing fetch (nullptr: the block executing was not read, e.g. resident and loaded).
  const Fetch* executing() const { return has_cur_ ? &cur_ : nullptr; }
  void done_executing() { has_cur_ = false; }
  // Whether a fetch's layers run as its pieces land (streamed ones too).
  bool runs_by_layer(const Fetch& f) const;
  // Pieces of the executing fetch not waited for yet.
  bool pieces_left() const { return has_cur_ && waited_ < cur_.pieces.size(); }
  // Waits for the executing fetch's pieces that hold its layers up to k.
  Status wait_layer(int k) { return wait_pieces(cur_, k); }
  // Cancels and waits for the executing fetch's pieces not waited for yet.
  void cancel_executing();
  // Cancels every read submitted, waits for the pieces already issued; empties the ring (GPU:
  // once its kernels are done). Resident blocks read whole stay. The cursor at block 0.
  void drain();
  // shed(): the reads cancelled and waited for, the fetches forgotten (the ring is the caller's).
  void drop_fetches();
  // The cursor goes on from layer `first` of block `b` (-1: its first), in this inference or
  // the next (a plan adopted mid-inference).
  void seek(int b, int first, bool next);
  // finish(): reads ahead of this inference belong to the next one now.
  void inference_done();
  // Bytes of block b of this inference not landed yet (all of them where not submitted); false
  // when `wait` is false and the reader's lock is busy.
  bool unlanded_of(int b, bool wait, std::uint64_t* out) const;
  // The oldest ring entry goes now (the block failed or was never run).
  void ring_pop_now();
  std::uint64_t fetches_pushed() const { return fetch_order_; }
  // The weights in use now into their peak (and the lent bytes into the lender's), traced.
  void note_in_use();
  const Stats& stats() const { return stats_; }

 private:
  std::uint64_t offset(int layer) const { return info_.layers[layer].offset; }
  std::uint64_t span(int first, int last) const { return layers_span(info_, first, last); }
  std::uint64_t ring_limit(const Position& pos, const Fetch& f) const {
    return lender_.ring_limit(*w_.ring, pos.next_layer, f.last, f.next);
  }
  void held(const char* why, int b);
  std::vector<BlockReader::Check> checks_for(int first, int last) const;
  void mark_verified(int first, int last);
  void advance();
  void pump_reads(const Position& pos, KernelWait wait);
  // pump_reads' steps: what the cursor does after a block (kGoOn: submit its reads; kNext: the
  // next block; kStop: the cursor stops here).
  enum class Step { kGoOn, kStop, kNext };
  Fetch cursor_fetch() const;
  Step place_in_ring(Fetch& f, const Position& pos, KernelWait wait, bool& streaming);
  Step stream_into_ring(Fetch& f, const Position& pos, bool keeps, std::uint64_t kept, bool& streaming);
  void submit(Fetch& f);
  void trace_submitted(const Fetch& f);
  bool stream_pieces(Fetch& f);
  void cancel_reads(const Fetch& f);
  Status wait_reads(const Fetch& f);
  bool unlanded(const Fetch& f, bool wait, std::uint64_t* out) const;
  bool layer_by_layer(const Fetch& f) const;
  Status timed_wait(const Fetch& f);
  void waited(int b, int k, std::chrono::steady_clock::time_point t0);
  Status wait_pieces(const Fetch& f, int k);
  void cancel_pieces_left(const Fetch& f);

  std::string path_;
  const ImageInfo& info_;
  Config cfg_;
  Weights& w_;
  BlockReader& reader_;
  DeviceBackend& backend_;
  ZoneLender& lender_;
  std::vector<bool> verified_;  // per layer: its checksum has passed once since open
  std::deque<Fetch> fetches_;
  std::uint64_t fetch_order_ = 0;  // Fetch::order of the newest fetch (fetches pushed so far)
  int rd_block = 0;      // the cursor: next block to consider
  int rd_first = -1;     // its first layer when trimmed (-1: the block's own)
  bool rd_next = false;  // the cursor is in the next inference
  // The cursor has come round to the inference after the next (Note [One inference ahead]).
  bool rd_beyond = false;
  Fetch cur_;            // the executing block's fetch (when has_cur_)
  bool has_cur_ = false;
  // cur_.pieces[0, waited_) have landed and been waited for; the rest are waited for layer by
  // layer (Note [Layer by layer]).
  std::size_t waited_ = 0;
  Stats stats_;
  // Note [Tracing]: this executor's group, and why the cursor last stopped (traced on change).
  std::uint32_t tgroup_ = 0;
  const char* held_why_ = nullptr;
  bool at_ahead_limit_ = false;  // the last pump stopped one inference ahead (starved())
  int held_block_ = -1;
};

}  // namespace swapnet
