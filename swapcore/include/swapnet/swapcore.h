// swapnet/swapcore.h — the bottom of swapnet: errors, the one logger, the swap image format and
// the block reader that moves image bytes from disk into memory at the disk's speed.
//
// swapcore knows nothing of torch. Every other module depends on it, never the reverse.
//
// Policies:
//  - Errors carry their context in the message ("FILE: what failed: value vs limit"). The
//    I/O paths return Status values (an I/O error is an expected outcome); the torch-facing
//    modules throw swapnet::Error.
//  - The library never writes to stdout. It logs through swapnet::log(), which is silent unless
//    the application raises the level (set_log_level) or SWAPNET_LOG is set
//    (off|error|warn|info|debug), read once at first use.
#pragma once

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(SWAPNET_BUILDING)
#define SWAPNET_API __attribute__((visibility("default")))
#else
#define SWAPNET_API
#endif

namespace swapnet {

// The one exception type of the torch-facing API. what() is a complete, user-facing sentence
// that names the file, the value and the limit involved.
class SWAPNET_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// ---- logging ------------------------------------------------------------------------------

enum class LogLevel : int { kOff = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

// Receives every message at or above the current level. The default sink writes
// "swapnet: <level>: <message>" to stderr.
using LogSink = std::function<void(LogLevel, std::string_view)>;

SWAPNET_API void set_log_level(LogLevel level);
SWAPNET_API LogLevel log_level();
SWAPNET_API void set_log_sink(LogSink sink);  // nullptr restores the default sink
SWAPNET_API void log(LogLevel level, std::string_view message);
// Logs `message` at `level` only the first time `key` is seen in this process (fallbacks and
// advisory failures are said once, not per call).
SWAPNET_API void log_once(LogLevel level, std::string_view key, std::string_view message);
// Parses "off|error|warn|info|debug" (case-sensitive); throws Error naming the accepted values.
SWAPNET_API LogLevel parse_log_level(std::string_view text);

// ---- sizes --------------------------------------------------------------------------------

// Parses a byte count: "1048576", "512KiB", "600MiB", "1.5GiB", "2GB" (KB/MB/GB are powers of
// 1000, KiB/MiB/GiB of 1024; "K"/"M"/"G" alone mean KiB/MiB/GiB). Throws Error naming the text.
SWAPNET_API std::uint64_t parse_size(std::string_view text);
// "178.6 MB (170.3 MiB)"-style human text for a byte count; exact bytes are in JSON output.
SWAPNET_API std::string format_bytes(std::uint64_t bytes);

// ---- status ---------------------------------------------------------------------------

// The result of an I/O operation: ok, or an errno and a complete message
// ("resnet101.swapnet: read 1048576 bytes at offset 73400320 failed: Input/output error (EIO)").
class SWAPNET_API Status {
 public:
  Status() = default;  // ok
  static Status error(int err, std::string message) { return Status(err == 0 ? -1 : err, std::move(message)); }
  bool ok() const { return code_ == 0; }
  int code() const { return code_; }  // an errno value, or -1 for a format error
  const std::string& message() const { return message_; }
  void throw_if_error() const {
    if (!ok()) throw Error(message_);
  }

 private:
  Status(int code, std::string m) : code_(code), message_(std::move(m)) {}
  int code_ = 0;
  std::string message_;
};

// "EIO", "EINVAL", ... for an errno value (strerror gives the sentence, this the symbol).
SWAPNET_API std::string errno_name(int err);

// ---- tracing ------------------------------------------------------------------------------
//
// A timeline of what the library does, to see where an inference's time goes (Note [Tracing]
// in swapcore/src/trace.cpp): each layer run, each wait for reads, each read request from the
// moment it is issued to the moment it lands, the disk's busy periods, why reads were held
// back, the bytes held, budget changes. Written as a Chrome trace (JSON), which
// ui.perfetto.dev and chrome://tracing open. Off unless started; then each event costs a
// mutex and a copy into a buffer allocated at start (no allocation while tracing, so the CPU
// meter's accounting of activations is unchanged). Events past the buffer are dropped and
// counted in the file. `swapnet run --trace FILE` and `swapnet serve --trace FILE` write one.
// Start it before Executor::open: an executor opened while tracing takes a group of its own
// (trace_group), one opened before records into group 0 with the application's events.

// Where an event is drawn: lanes are tracks of one group (an executor: its layers, waits,
// reads and memory), groups are processes in the viewer.
enum class TraceLane : std::uint8_t { kInference, kCompute, kWait, kCursor, kDisk, kReads, kControl };
using TraceClock = std::chrono::steady_clock;

// Starts recording (clearing what was recorded), with room for `max_events` events.
SWAPNET_API void trace_start(std::size_t max_events = std::size_t{1} << 20);
SWAPNET_API bool tracing() noexcept;
// Stops recording and writes the events to `path`; the error names the file and errno.
SWAPNET_API Status trace_write(const std::string& path);
// A group for an executor or a model ("resnet101.swapnet"), shown as a process; group 0 is the
// application's own. Names may be registered before or while tracing.
SWAPNET_API std::uint32_t trace_group(const std::string& name);
// A span from `begin` to `end`: `name` (a string literal, kept by pointer) followed by `num`
// unless it is negative ("layer" 12 -> "layer 12"), with one optional integer argument.
// Spans on kReads may overlap (they are drawn as async slices); on other lanes they nest.
SWAPNET_API void trace_span(std::uint32_t group, TraceLane lane, const char* name, std::int64_t num,
                            TraceClock::time_point begin, TraceClock::time_point end, const char* arg = nullptr,
                            std::int64_t value = 0) noexcept;
// An instant (a budget change, a read held back) on `lane`.
SWAPNET_API void trace_instant(std::uint32_t group, TraceLane lane, const char* name, std::int64_t num,
                               const char* arg = nullptr, std::int64_t value = 0) noexcept;
// A value over time (bytes held in the ring, by activations), drawn as a counter track.
SWAPNET_API void trace_counter(std::uint32_t group, const char* name, std::int64_t value) noexcept;

// ---- swap image ---------------------------------------------------------------------------
//
// One file per model (see Note [Swap image format] in swapcore/src/image.cpp):
//   header (4 KiB) | metadata: layer table, tensor table, skeleton bytes | parameter data
// The data of layer i starts on a 4 KiB boundary and layers follow in execution order, so any
// run of consecutive layers (a block) is one contiguous, aligned byte range. Each layer's bytes
// carry an XXH3-64 checksum; header and metadata carry their own.

constexpr std::uint64_t kImageAlign = 4096;  // bytes: O_DIRECT and NVMe page alignment

struct ImageTensor {
  std::string name;               // qualified name, e.g. "layer1.0.conv1.weight"
  std::uint8_t kind = 0;          // 0 parameter, 1 buffer, 2 attribute (assembly's SlotKind)
  std::uint8_t dtype = 0;         // the framework's scalar-type code (opaque to swapcore)
  std::uint8_t element_size = 0;  // bytes per element
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;  // in elements; data holds the strided span, not a copy
  std::uint64_t offset = 0;       // absolute file offset of the first element (64-byte aligned)
  std::uint64_t nbytes = 0;       // bytes of the span the strides reach
  std::uint32_t layer = 0;        // owning layer
};

struct ImageLayer {
  std::string name;
  std::string ops;                // node kinds, comma-separated
  std::uint64_t offset = 0;       // absolute file offset, a multiple of kImageAlign
  std::uint64_t size = 0;         // bytes, a multiple of kImageAlign (zero for weightless layers)
  std::uint64_t data_bytes = 0;   // tensor bytes inside (size minus padding)
  std::uint32_t first_tensor = 0; // its tensors are [first_tensor, first_tensor + num_tensors)
  std::uint32_t num_tensors = 0;
  std::uint64_t checksum = 0;     // XXH3-64 of the `size` bytes at `offset`
  double flops = 0;               // from pack's profiling run
  double time_ms = 0;
  std::uint64_t live_bytes = 0;   // activation bytes alive after this layer (crossing to the next)
  // Most activation bytes allocated at once while this layer ran, forward's inputs included (0:
  // not measured; images before format 3).
  std::uint64_t peak_bytes = 0;
};

// One value of an input profile: forward's arguments flattened in order (a list, tuple or dict
// argument is a kSequence entry followed by its elements).
struct ImageInput {
  enum Kind : std::uint8_t { kTensor = 0, kNone = 1, kSequence = 2, kValue = 3 };
  std::uint8_t kind = kTensor;
  std::uint8_t dtype = 0;            // kTensor: the framework's scalar-type code
  std::vector<std::int64_t> sizes;   // kTensor: its sizes; kSequence: {number of elements}
  std::string text;                  // kValue: the value as text (an int, a string, ...); kSequence: dict keys
};

// Inputs activations were measured for: the reserve holds any input no larger in every
// dimension (same dtypes, same structure, equal other values).
struct InputProfile {
  std::uint64_t activation_bytes = 0;  // peak bytes forward allocated at these inputs
  std::vector<ImageInput> inputs;
};

// Images from format 5 on record activations (activation_bytes, the layers' peak_bytes, the input
// profiles) as a zone places them: the most of the bytes live at once and of the extent their
// chunks reach (Note [Lending the activation reserve] in assembly/src/zone_lender.cpp). Older ones
// record the bytes live alone, which fragmentation can exceed; the executor lends them no zone.
inline constexpr std::uint32_t kImageZoneReserveVersion = 5;

struct ImageInfo {
  std::uint32_t version = 0;
  std::uint64_t file_size = 0;
  std::uint64_t data_offset = 0;  // first layer's offset
  std::uint64_t data_size = 0;    // through the end of the last layer
  std::uint32_t num_inputs = 0;   // forward's inputs (without self)
  std::uint64_t activation_bytes = 0;  // peak bytes forward allocated at the example input
  std::string input_shapes;       // the example input used when packing, e.g. "1,3,224,224"
  std::string source;             // the model file it was packed from
  std::vector<ImageLayer> layers;
  std::vector<ImageTensor> tensors;
  std::string skeleton;           // the framework's serialized weightless module
  // Inputs the activations were measured for (format 4 on; empty in older images): the example
  // input first (its bytes are activation_bytes).
  std::vector<InputProfile> input_profiles;
};

// Reads and validates header and metadata (never the parameter data). Every count, offset and
// size is checked against the file before anything is allocated; errors name the file and the
// field. `parse_image` does the same for bytes already in memory (the fuzzing entry point).
SWAPNET_API Status read_image_info(const std::string& path, ImageInfo* out);
SWAPNET_API Status parse_image(const std::uint8_t* data, std::size_t size, std::uint64_t file_size,
                               const std::string& origin, ImageInfo* out);

// Writes an image atomically (temporary file in the same directory, fsync, rename). The layer
// and tensor tables' offsets, sizes and checksums are computed here; `read_tensor` is asked for
// each tensor's span bytes in file order. `progress(done, total)` is called as data is written.
struct ImageWriteOptions {
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;  // optional
};
SWAPNET_API Status write_image(const std::string& path, ImageInfo info,
                               const std::function<const void*(std::size_t tensor)>& tensor_bytes,
                               const ImageWriteOptions& options = {});
// Whether write_image could create its temporary file beside `path` (made and removed at once),
// with write_image's error if not: a pack says so before its work, not after.
SWAPNET_API Status probe_image_path(const std::string& path);

// Verifies every layer checksum (reads the whole file with the block reader). On a mismatch the
// status names the first bad layer by index and name.
SWAPNET_API Status check_image(const std::string& path, const ImageInfo& info);

// ---- block reader -------------------------------------------------------------------------

enum class IoBackend { kIoUring, kPreadDirect, kBuffered };
SWAPNET_API const char* to_string(IoBackend b);

// One disk read by several block readers (the models of a Runtime), which take turns by
// urgency: a reader is held back while a more urgent one (a lower BlockReader::set_priority)
// has pieces to issue, and at most `pieces` requests are in flight from all of them together
// (0: no cap beyond each reader's queue depth). Equal priorities share the disk as the kernel
// serves them. Note [One disk, read by urgency] in shared_disk.cpp. Thread-safe; readers hold it by
// shared_ptr (ReaderOptions::disk).
class SWAPNET_API SharedDisk {
 public:
  explicit SharedDisk(unsigned pieces = 0);
  ~SharedDisk();
  SharedDisk(const SharedDisk&) = delete;
  SharedDisk& operator=(const SharedDisk&) = delete;
  unsigned pieces() const;  // 0: no cap
  struct Stats {
    std::uint64_t granted = 0;   // pieces handed to the kernel through it
    std::uint64_t deferred = 0;  // times a reader with pieces to issue was held back for a more urgent one
  };
  Stats stats() const;
  struct State;  // reader.cpp
  State& state() const { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

struct ReaderOptions {
  // Defaults chosen with bench/io_sweep.sh on resnet101 and vgg19 images (docs/io.md): 32 x
  // 256 KiB had the best fetch/raw ratio on this project's machines.
  std::size_t request_bytes = 256 << 10;  // bytes per read request (multiple of kImageAlign)
  unsigned queue_depth = 32;              // requests in flight (io_uring)
  bool allow_io_uring = true;           // false: skip straight to pread (tests, comparisons)
  bool allow_direct = true;             // false: buffered reads + POSIX_FADV_DONTNEED
  bool register_buffers = true;         // io_uring fixed buffers where memlock allows
  // Benchmarks: emulate a disk that reads this many bytes per second (0: none; default from
  // $SWAPNET_EMULATE_READ, e.g. "400MB/s" or bytes per second). Reads still go to the file; each
  // request's bytes are then served by one emulated disk per process, after those before it, at
  // this rate, and the read completes when served. Unlike a blkio throttle it gives no credit
  // for time it idled: a pipeline that leaves it idle loses that time, as on a real disk.
  double emulate_bytes_per_s = -1;  // -1: from the environment
  // With an emulated disk: credit it with up to this many seconds it idled, served at once when
  // reads come again, as bench/throttle.sh's blkio throttle does (a burst after idling; Note [A
  // sustained read rate] in reader.cpp). 0 (default): no credit, as a real disk.
  double emulate_idle_credit_s = 0;
  // Test hook at the I/O boundary: sees each request's (offset, length, result) and may rewrite
  // the result (a short count, -EIO, -EINTR, -EAGAIN) before swapcore handles it.
  std::function<long(std::uint64_t offset, std::size_t length, long result)> fault;
  // Shared with the other readers of the same disk, which then take turns by priority
  // (SharedDisk); null: this reader keeps up to queue_depth requests in flight on its own.
  std::shared_ptr<SharedDisk> disk;
  // The trace group its requests and busy periods are drawn in (trace_group; 0: the
  // application's). Only while tracing.
  std::uint32_t trace_group = 0;
};
// The rate $SWAPNET_EMULATE_READ asks readers to emulate (ReaderOptions::emulate_bytes_per_s), in
// bytes per second; 0 when unset.
SWAPNET_API double emulated_read_bytes_per_s();
// For reads made outside a BlockReader (benchmarks' baselines): waits until that emulated disk
// has served `bytes` asked for at `queued`; at once when none is emulated.
SWAPNET_API void emulated_read_wait(std::chrono::steady_clock::time_point queued, std::uint64_t bytes);


// Reads byte ranges of one file into caller-provided aligned buffers: O_DIRECT through io_uring,
// with fallbacks chosen by probing at open and said once in the log (io_uring refused -> pread
// with O_DIRECT; O_DIRECT refused -> buffered pread followed by POSIX_FADV_DONTNEED, so the page
// cache does not keep a copy). A background thread ("swapnet-io") drives the reads, so submit()
// returns at once and the caller computes while the bytes arrive. Thread-safe.
class SWAPNET_API BlockReader {
 public:
  using Ticket = std::uint64_t;
  static Status open(const std::string& path, const ReaderOptions& options, std::unique_ptr<BlockReader>* out);
  ~BlockReader();
  BlockReader(const BlockReader&) = delete;
  BlockReader& operator=(const BlockReader&) = delete;

  // Queues a read of [offset, offset + length) into `buffer`. offset, length and buffer must be
  // multiples of kImageAlign (the image guarantees this for blocks). `verify` lists checksums
  // to check as the data lands: (offset, size, xxh3) ranges inside the read, with names for the
  // message. Reads are served by `order` (lower first), then in the order submitted (Note
  // [Earliest block first] in reader.cpp). Returns a ticket for wait().
  struct Check {
    std::uint64_t offset;
    std::uint64_t size;
    std::uint64_t checksum;
    std::string what;  // e.g. "layer 7 (layer1.0.conv2)"
  };
  Ticket submit(std::uint64_t offset, std::size_t length, void* buffer, std::vector<Check> verify = {},
                std::uint64_t order = 0);
  Status wait(Ticket ticket);  // blocks until done; the status of that read
  // Bytes of the read not landed yet, without waiting (0 once all have landed, its checksums
  // perhaps still to check; 0 for a ticket unknown or already waited for).
  std::uint64_t unlanded_bytes(Ticket ticket) const;
  // The same without blocking: false (and *out unchanged) when the reader's lock is busy.
  bool try_unlanded_bytes(Ticket ticket, std::uint64_t* out) const;
  // Stops a read early: pieces not yet handed to the kernel are dropped; pieces in flight land
  // (the buffer stays in use until then). wait() must still be called: it returns once nothing
  // of the read is in flight, with ECANCELED (or the read's own status if it ended first).
  void cancel(Ticket ticket);
  Status read(std::uint64_t offset, std::size_t length, void* buffer, std::vector<Check> verify = {});

  // Registers buffers the caller will read into (e.g. an arena), for io_uring fixed-buffer
  // reads. Advisory: on failure (memlock limit) it warns once and reads go on unregistered.
  // Replaces earlier registrations; an empty list unpins what was registered (before freeing it).
  // Only while no read is in flight: returns false, changing nothing, otherwise.
  bool register_buffers(const std::vector<std::pair<void*, std::size_t>>& buffers);

  // Whether the file is still the one opened (Note [The image changing on disk] in block_reader.cpp):
  // an error (ESTALE) naming the path and what changed when it was written or truncated since;
  // OK (said once in the log) when it was only replaced or deleted at its path, whose bytes the
  // open descriptor still reads. Cheap (fstat + stat): the executor calls it every inference.
  Status check_file() const;

  // With ReaderOptions::disk: how urgent this reader's reads are (lower goes first; default 0,
  // where readers share the disk as equals). Any thread, any time; a reader held back re-asks
  // at once.
  void set_priority(double priority);
  double priority() const;

  IoBackend backend() const;
  const std::string& path() const;
  std::uint64_t file_size() const;
  std::uint64_t bytes_read() const;  // total completed
  // Seconds, since open, during which at least one of this reader's requests was with the kernel:
  // the disk was working for it. Over a stretch of inferences, busy time / elapsed time near 1
  // means the reads, not compute, set the pace (an I/O-bound pipeline with an idle-free disk).
  double busy_seconds() const;
  // The rate the disk sustains, as this reader saw it: bytes landed and seconds busy, both
  // without the first min(idle gap before it, 0.1 s) of each busy period, where a throttle that
  // credits idle time (blkio) serves a burst (Note [A sustained read rate] in reader.cpp). On a
  // disk without such credit, bytes / seconds is bytes_read() / busy_seconds() from fewer samples.
  struct Sustained {
    std::uint64_t bytes = 0;
    double seconds = 0;
  };
  Sustained sustained() const;

 private:
  struct Impl;
  explicit BlockReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Page-aligned host memory (std::free-able via free_aligned); nullptr on failure.
SWAPNET_API void* alloc_aligned(std::size_t bytes, std::size_t alignment = kImageAlign);
SWAPNET_API void free_aligned(void* p);

// XXH3-64 of a byte range (what the image's checksums are).
SWAPNET_API std::uint64_t checksum(const void* data, std::size_t bytes);

// How many bytes of `path` are in the page cache right now (mincore over a mapping).
SWAPNET_API Status page_cache_bytes(const std::string& path, std::uint64_t* out);

}  // namespace swapnet
