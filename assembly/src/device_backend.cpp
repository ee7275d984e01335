// Where layers run: the host and CUDA backends (device_backend.h).
#include "device_backend.h"

#include "layer_clock.h"
#include "torch_compat.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cerrno>
#include <cstdlib>
#include <utility>
#include <vector>

namespace swapnet {

// Note [Device backends]
// ~~~~~~~~~~~~~~~~~~~~~~
// The executor's pipeline is one: the cursor reads blocks ahead into the ring, a block is bound
// by reference where it landed, its layers run, its ring space goes. A device changes four
// things, and only these: the device its tensors are made on (views of the ring's bytes, the
// pinned slots, the inputs), the hand-over of a landed block to the device (managed memory is
// prefetched to the GPU), when a swapped block's ring space may go (a GPU's kernels run after
// the calling thread queued them: an event recorded behind them says when; the host's are done
// when the layer returns), and waiting for the device before the ring changes. What a backend
// cannot do follows from that and is stated in its Caps: the CUDA backend's layers do not run
// on the calling thread, so it times them with events where they run (Note [Timing layers on
// the GPU] in layer_clock.cpp; libtorch 2.x), gives a running block's bytes back as its
// layers' kernels are done rather than as their calls return (Note [Ring space behind the
// kernels] in kernel_queue.cpp), and cannot shed the bytes a running layer does not read (its
// kernels may still read them; it queues a layer's kernels once the layer's pieces landed, as
// the host runs it: Note [Layer by layer] in read_ahead.cpp); its activations live in PyTorch's caching
// allocator, which the CPU meter does not count, so new input shapes are refused and the
// activation reserve is not lent. Each of these is a capability a CUDA backend can gain
// without the pipeline changing: issue 47.
//
// Note [Swapping onto the GPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With ExecutorOptions::Device::kCUDA the arena is managed memory: the reader DMAs a block
// into it, and the same bytes are bound as CUDA tensors (no copy). On discrete GPUs
// (concurrentManagedAccess) the block is prefetched to the GPU once read; on integrated GPUs
// (Jetson: no concurrent managed access, so the host may not touch managed memory while any
// kernel runs, and the reader writes and checksums block i+1 while block i computes) the arena
// is pinned host memory registered with CUDA instead: the same DRAM, readable in place, and
// without that rule. Kernels run asynchronously, so a block's ring bytes may only be reused
// once the kernels reading them are done: after a block's layers are queued, an event is
// recorded behind them, and the block leaves the ring (oldest first) once its event has
// passed (reclaim); the bytes of its first layers go back earlier, behind their own kernels
// (Note [Ring space behind the kernels] in kernel_queue.cpp). Otherwise the ring is the host's
// (Note [Read-ahead ring]): as many blocks ahead as the budget holds, on into the next
// inference, a block that does not fit yet streamed into the bytes older blocks free, part of
// a large block kept; a block's layers are queued as their pieces land (Note [Layer by layer]
// in read_ahead.cpp). The reads go on once a block's bytes have landed, before its kernels are
// queued: the older blocks' kernels have mostly finished while the thread waited, and their
// room is the next reads'. Where the next block needs room only executed blocks hold, the
// thread waits for their kernels: for all but the newest after queueing a block, for all of
// them where that reads nothing or the next block is needed now (take()).
//
// The GPU's ring used to hold two blocks, one at each end (the paper's pipeline): one read in
// flight at a time, and the disk idle from a block's last byte until the thread had queued its
// kernels and submitted the next read. On the H100 that cost most where blocks were many and
// small (a RegNetY at 1.43x its I/O bound, issue 47). On the host twin under an emulated
// 200 MB/s disk, resnet101 at 90 MiB ran at 0.99x its I/O bound in the deep ring against
// 1.21x in two blocks (`--read-ahead two-ended` keeps that for comparison; docs/gpu.md).
// If the reader cannot DMA into managed memory (EFAULT/EOPNOTSUPP, found with a one-page read
// at open), the ring is host memory pinned with cudaHostRegister instead.
// Activations live in PyTorch's CUDA caching allocator; the budget reserves the activation
// bytes measured on the CPU at pack time (the same tensors; cuDNN workspaces are not counted).
DeviceBackend::DeviceBackend(Caps caps, c10::Device device, LayerClock::MakeMark marks)
    : caps_(caps), device_(device) {
  if (caps_.async) {
    if (!marks) throw Error("internal: a backend whose layers run asynchronously needs marks");
    queue_ = std::make_unique<KernelQueue>(std::move(marks));
  }
}

void DeviceBackend::block_done(BlockRing& ring) {
  if (queue_) {
    queue_->block_done();
  } else {
    ring.pop();
  }
}

bool DeviceBackend::release_front(BlockRing& ring, char* until) {
  if (!ring.deep()) return false;  // two-ended: the other end is the next block's anyway
  if (!queue_) {
    const std::uint64_t n = ring.release_front_until(until);
    released_early_ += n;
    return n > 0;
  }
  queue_->release(until);
  const KernelQueue::Freed f = queue_->reclaim(ring, false, false);
  released_early_ += f.early;
  return f.early > 0 || f.blocks > 0;
}

void DeviceBackend::reclaim(BlockRing& ring, bool wait, bool one) {
  if (queue_) released_early_ += queue_->reclaim(ring, wait, one).early;
}

namespace {

class HostBackend : public DeviceBackend {
 public:
  HostBackend() : HostBackend(Caps{}, nullptr) {}
  const char* name() const override { return "host"; }
  void configure(const std::string&, ExecutorOptions*) override {}
  void layer_ended(int layer, double host_ms) override { times_.emplace_back(layer, host_ms); }
  void take_layer_times(bool, const std::function<void(int, double)>& f) override {
    for (const auto& [layer, ms] : times_) f(layer, ms);
    times_.clear();  // keeps its capacity: no allocation per inference
  }
  void forget_layer_times() override { times_.clear(); }

 protected:
  HostBackend(Caps caps, LayerClock::MakeMark marks)
      : DeviceBackend(caps, c10::Device(c10::DeviceType::CPU), std::move(marks)) {}

 private:
  std::vector<std::pair<int, double>> times_;  // ended, not yet taken
};

DeviceBackend::Caps cuda_caps();

// Note [The CUDA backend's host twin]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The GPU's pipeline differs from the CPU's in its Caps (ring space handed back behind the
// "kernels", asynchronously; no lending or shedding), not in code: SWAPNET_DEVICE_TWIN=cuda runs
// an executor on the CPU with exactly those, so that what the GPU path's structure costs can be
// measured and changed where no GPU is. Its layers run on the CPU (its tensors, memory and times
// are the host's); its marks (Note [Ring space behind the kernels] in kernel_queue.cpp) stand
// for a GPU whose kernels trail the thread that queues them, and take little time beside the
// disk: a mark passes once a later one has been put (right after its block was queued, the
// block's kernels still run, so the pipeline's waits for them are exercised), or once the thread
// has waited for a read since it was put (the GPU did its queue meanwhile), or when waited for.
// Until 2026-11-29 only the first rule held, so a block's ring space was held until the next
// block's layers had run on the CPU: the twin showed the disk idle for that compute once per
// block (resnet101 at 1/3 on an emulated 50 MB/s disk: busy 80 % against the host's 96 %), which a
// GPU with little compute per block does not. Under an emulated slow disk (SWAPNET_EMULATE_READ)
// the CPU's compute is small beside the reads, as a GPU's is beside a fast disk, so the twin
// shows where the GPU path leaves the disk idle.
struct TwinDevice {
  std::uint64_t put = 0;  // marks put so far
  std::uint64_t ran = 0;  // marks put before the thread's last wait for a read
};

class TwinMark final : public Mark {
 public:
  explicit TwinMark(std::shared_ptr<TwinDevice> d) : d_(std::move(d)) {}
  void put() override {
    at_ = ++d_->put;
    waited_ = false;
  }
  bool passed() override { return waited_ || d_->put > at_ || d_->ran >= at_; }
  void wait() override { waited_ = true; }
  double ms_since(Mark&) override { return 0; }  // the twin times layers on the host

 private:
  std::shared_ptr<TwinDevice> d_;
  std::uint64_t at_ = 0;
  bool waited_ = false;
};

class CudaTwinBackend final : public HostBackend {
 public:
  CudaTwinBackend() : CudaTwinBackend(std::make_shared<TwinDevice>()) {}
  const char* name() const override { return "cuda-twin"; }
  void configure(const std::string& image, ExecutorOptions*) override {
    log_once(LogLevel::kWarn, "cuda_twin",
             image + ": SWAPNET_DEVICE_TWIN=cuda: the CUDA backend's pipeline on the CPU (Note [The CUDA backend's host twin])");
  }
  void waited_for_reads() override { device_->ran = device_->put; }
  static Caps twin_caps() {
    Caps c = cuda_caps();
    c.learns = true;      // the host's times
    c.host_pages = true;  // host memory
    return c;
  }

 private:
  explicit CudaTwinBackend(std::shared_ptr<TwinDevice> d)
      : HostBackend(twin_caps(), [d] { return std::make_unique<TwinMark>(d); }), device_(std::move(d)) {}
  std::shared_ptr<TwinDevice> device_;
};

// A CUDA event on the current stream: with timing for the layer clock (Note [Timing layers on
// the GPU]), without for the kernel queue (Note [Ring space behind the kernels]).
class CudaMark final : public Mark {
 public:
  // Timed where layers are timed (BACKEND_DEFAULT); PYTORCH_DEFAULT for ring space: an event
  // without timing is lighter.
  explicit CudaMark(c10::EventFlag flag = c10::EventFlag::BACKEND_DEFAULT) : event_(c10::DeviceType::CUDA, flag) {}
  void put() override { event_.record(current_stream()); }
  bool passed() override { return event_.query(); }
  double ms_since(Mark& start) override { return compat::event_ms(static_cast<CudaMark&>(start).event_, event_); }

  static c10::Stream current_stream() {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(c10::Device(c10::DeviceType::CUDA, 0));
  }

 private:
  c10::Event event_;
};

DeviceBackend::Caps cuda_caps() {
  DeviceBackend::Caps c;
  c.async = true;
  c.learns = compat::kEventsTime;  // Note [Timing layers on the GPU]
  c.sheds = false;
  c.meters_activations = false;
  c.host_pages = false;
  return c;
}

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend()
      : DeviceBackend(cuda_caps(), c10::Device(c10::DeviceType::CUDA, 0), [] {
          return std::make_unique<CudaMark>(c10::EventFlag::PYTORCH_DEFAULT);
        }) {}
  const char* name() const override { return "cuda"; }

  void configure(const std::string& image, ExecutorOptions* o) override {
    if (o->memory == MemoryKind::kHost) {
      throw Error(image + ": --device cuda needs memory the GPU can read in place (managed), not host memory");
    }
    if (!cuda_device().concurrent_managed_access && o->memory == MemoryKind::kManaged) {
      // Integrated GPUs (Jetson): the host may not touch managed memory while any kernel runs,
      // and the reader DMAs and checksums the next blocks while one computes. Pinned host memory
      // mapped for the GPU is the same DRAM there and has no such rule.
      log_once(LogLevel::kInfo, "cuda_integrated",
               "GPU without concurrent managed access (" + cuda_device().name +
                   "): blocks go to pinned host memory registered with CUDA, so reads can overlap kernels");
      o->memory = MemoryKind::kRegistered;
    }
    if (o->memory == MemoryKind::kManaged && gpu_handover_moves_pages() && o->read_ahead != ReadAhead::kPaper) {
      // The policies that move pages to the GPU (advise, prefetch, none) were measured with
      // blocks read whole into the two ends of the ring, and a read next to migrating pages
      // has lost its data (Note [Managed memory on a discrete GPU]): they keep that layout
      // rather than the deep ring's adjacent blocks and pieces handed over as they land.
      log_once(LogLevel::kWarn, "gpu_handover_two_ended",
               "SWAPNET_GPU_PREFETCH moves blocks' pages to the GPU: blocks are read whole, two at a time, at the "
               "two ends of the ring (unset it for the default, host, and the deep ring)");
      o->read_ahead = ReadAhead::kTwoEnded;
      o->layer_by_layer = false;
    }
    if (o->memory == MemoryKind::kManaged && gpu_handover_may_lose_reads() &&
        o->verify != ExecutorOptions::Verify::kAlways) {
      // Note [Managed memory on a discrete GPU] (cuda_shim.cpp): under "prefetch" and "none" a
      // block read next to pages that migrate lost its data on an H100. The first fetch's
      // checksums caught every loss seen, but nothing makes a later fetch safe: every fetch is
      // checked (a failed inference, never a wrong output), and the user is told why it is slower.
      log_once(LogLevel::kWarn, "gpu_handover_unsafe",
               "SWAPNET_GPU_PREFETCH (prefetch or none) lost blocks read into managed memory on an H100; on this GPU (" +
                   cuda_device().name +
                   ") every block's checksum is verified at every fetch, not only the first (unset it for the safe default, host)");
      o->verify = ExecutorOptions::Verify::kAlways;
    }
  }

  void check_reads(const std::string& image, BlockReader& reader, const ImageInfo& info, ExecutorOptions* o) override {
    // Some kernels refuse O_DIRECT reads into managed memory (get_user_pages: EFAULT or
    // EOPNOTSUPP). Find out with one page before the first inference, and use pinned host
    // memory registered with CUDA instead.
    const std::uint64_t probe = std::min<std::uint64_t>(kImageAlign, info.data_size);
    auto probe_ring = BlockRing::create(kImageAlign, o->memory);
    Status st = probe == 0 ? Status() : reader.read(info.layers.front().offset, probe, probe_ring->base());
    if (!st.ok() && probe_ring->kind() == MemoryKind::kManaged && (st.code() == EFAULT || st.code() == EOPNOTSUPP)) {
      log_once(LogLevel::kWarn, "cuda_registered",
               image + ": the block reader refused managed memory (" + st.message() +
                   "); blocks go to pinned host memory registered with CUDA (cudaHostRegister) instead");
      o->memory = MemoryKind::kRegistered;
      probe_ring = BlockRing::create(kImageAlign, o->memory);
      st = reader.read(info.layers.front().offset, probe, probe_ring->base());
    }
    if (!st.ok()) throw Error(st.message() + " (reading into " + to_string(probe_ring->kind()) + " memory for the GPU)");
  }

  std::unique_ptr<Arena> pinned_arena(std::uint64_t bytes, MemoryKind kind) const override {
    return Arena::create(bytes, kind);
  }
  void hand_over(MemoryKind kind, char* at, std::uint64_t bytes) const override {
    if (kind == MemoryKind::kManaged) gpu_prefetch(at, bytes);
  }
  void place_inputs(std::vector<c10::IValue>* inputs) const override {
    for (auto& v : *inputs) {
      if (v.isTensor() && v.toTensor().is_cpu()) v = v.toTensor().to(device());
    }
  }
  void layer_began(int layer) override { clock_.began(layer); }
  void layer_ended(int layer, double) override { clock_.ended(layer); }
  void take_layer_times(bool wait, const std::function<void(int, double)>& f) override { clock_.take(wait, f); }
  void forget_layer_times() override { clock_.forget(); }
  void idle(BlockRing* ring) override {
    DeviceBackend::idle(ring);
    c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->synchronizeStream(stream());
  }

 private:
  c10::Stream stream() const { return CudaMark::current_stream(); }
  LayerClock clock_{[] { return std::make_unique<CudaMark>(); }};
};

bool cuda_twin() {
  static const bool twin = [] {
    const char* v = std::getenv("SWAPNET_DEVICE_TWIN");
    if (v == nullptr || *v == '\0') return false;
    if (std::string(v) == "cuda") return true;
    log_once(LogLevel::kWarn, "device_twin", std::string("SWAPNET_DEVICE_TWIN='") + v + "' is not cuda: ignored");
    return false;
  }();
  return twin;
}

}  // namespace

namespace {

enum class BackendKind { kHost, kTwin, kCuda };
BackendKind backend_kind(const ExecutorOptions& o) {
  if (o.device == ExecutorOptions::Device::kCUDA) return BackendKind::kCuda;
  return cuda_twin() ? BackendKind::kTwin : BackendKind::kHost;
}

}  // namespace

std::unique_ptr<DeviceBackend> make_backend(const std::string& image, const ExecutorOptions& o) {
  switch (backend_kind(o)) {
    case BackendKind::kCuda:
      require_cuda(image);
      return std::make_unique<CudaBackend>();
    case BackendKind::kTwin:
      return std::make_unique<CudaTwinBackend>();
    case BackendKind::kHost:
      break;
  }
  return std::make_unique<HostBackend>();
}

DeviceBackend::Caps backend_caps(const ExecutorOptions& o) {
  switch (backend_kind(o)) {
    case BackendKind::kCuda:
      return cuda_caps();
    case BackendKind::kTwin:
      return CudaTwinBackend::twin_caps();
    case BackendKind::kHost:
      break;
  }
  return DeviceBackend::Caps{};
}

}  // namespace swapnet
