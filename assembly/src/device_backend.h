// Where layers run (internal to the assembly module; Note [Device backends] in
// device_backend.cpp). The pipeline -- the ring, the cursor, binding by reference, re-planning --
// is written once, in the executor; what differs between the host and a CUDA device is here:
// the device tensors are made on, the hand-over of a landed block, when a swapped block's ring
// space may go (kernels run asynchronously on a GPU), and waiting for the device. What a backend
// cannot do is said in its Caps, in one place, not in branches through the pipeline.
#pragma once

#include <c10/core/Device.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernel_queue.h"
#include "layer_clock.h"
#include "swapnet/assembly.h"

namespace swapnet {

class DeviceBackend {
 public:
  struct Caps {
    // Kernels run asynchronously: a swapped block's ring space goes once the kernels reading it
    // are done, and the cursor may wait for the oldest of them (reclaim); a running block's
    // bytes go back as its layers' kernels are done (Note [Ring space behind the kernels] in
    // kernel_queue.cpp), not as the calling thread's call returns. (Every backend runs a block's
    // layers as their pieces land: on a GPU their kernels are queued then.)
    bool async = false;
    // Layer times can be measured where the layers run (Note [Learning the costs in service];
    // on a GPU, Note [Timing layers on the GPU] in layer_clock.cpp).
    bool learns = true;
    // shed() gives back all but the running layer's weights while it runs (Note [Shedding]).
    bool sheds = true;
    // Activations are allocated where the CPU meter counts them: inputs of new shapes can be
    // measured (Note [Dynamic shapes]) and the reserve lent to the ring (Note [Lending the
    // activation reserve]).
    bool meters_activations = true;
    // Weight memory is host pages whose residency mincore can count.
    bool host_pages = true;
  };

  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;
  const Caps& caps() const { return caps_; }
  c10::Device device() const { return device_; }

  // The memory kind the ring and arenas are made of, settled for this device and image: refuses
  // what cannot work, says what it changed (the options are resolved once, at open).
  virtual void configure(const std::string& image, ExecutorOptions* o) = 0;
  // After the reader is open: whether it can read into that memory (one page), changing the kind
  // where it cannot; throws with the reader's error where nothing works.
  virtual void check_reads(const std::string& image, BlockReader& reader, const ImageInfo& info,
                           ExecutorOptions* o) {}
  // Where the compute reads bytes at `p` of the ring / an arena.
  char* address(const BlockRing& r, char* p) const { return r.device_address(p); }
  char* address(const Arena& a, char* p) const { return a.device_base() + (p - a.base()); }
  // An arena for the pinned slots where the device reads them (nullptr: host memory will do).
  virtual std::unique_ptr<Arena> pinned_arena(std::uint64_t bytes, MemoryKind kind) const { return nullptr; }
  // Bytes at `at` in memory of `kind` landed (a block, or the pinned slots): handed to the device.
  virtual void hand_over(MemoryKind kind, char* at, std::uint64_t bytes) const {}
  // The inference's inputs, where its layers run.
  virtual void place_inputs(std::vector<c10::IValue>* inputs) const {}
  // A swapped block's layers are queued: its ring space goes when they are done (host: now).
  void block_done(BlockRing& ring);
  // The layers queued so far no longer read the bytes of the ring's oldest block (the one
  // executing) before `until` (Note [Layer by layer] in read_ahead.cpp): given back now on the
  // host, once the device has done those layers where they run asynchronously (Note [Ring space
  // behind the kernels]); nothing on a two-ended ring. Whether ring space was given back by this
  // call (async: also what earlier calls released and the device has done since), so that the
  // cursor reads on.
  bool release_front(BlockRing& ring, char* until);
  // Applies to the ring what executed work the device has done: pops the entries of executed
  // blocks and gives back the bytes running blocks' kernels no longer read (all of it, waiting,
  // if `wait`; waiting only for the oldest block's, if `one`). Nothing on the host.
  void reclaim(BlockRing& ring, bool wait, bool one = false);
  // Executed blocks whose ring space waits for their kernels.
  std::size_t pending() const { return queue_ ? queue_->blocks() : 0; }
  // Bytes of running blocks given back before the block ended, since the backend was made.
  std::uint64_t released_early() const { return released_early_; }
  // The calling thread waited (blocked) for a read: a device doing its queue meanwhile may be
  // done with more of it. Only the host twin's marks need telling (Note [The CUDA backend's
  // host twin]); a GPU's events know.
  virtual void waited_for_reads() {}
  // Nothing queued reads any block: before the ring is resized, re-read or freed.
  virtual void idle(BlockRing* ring) {
    if (ring != nullptr) reclaim(*ring, true);
  }
  // Layer times, where costs are learned (Caps::learns): the compute thread is about to queue a
  // layer's work / has queued it (`host_ms`: how long that call took, the layer's time where it
  // runs on that thread). take_layer_times hands the times known by now to `f`, oldest first,
  // and all of them, waiting for the device, where `wait`; forget_layer_times drops those not
  // taken (an aborted inference). Called by the compute thread only (layer_ended without the
  // executor's lock): they touch no state the backend's other calls do.
  virtual void layer_began(int layer) {}
  virtual void layer_ended(int layer, double host_ms) = 0;
  virtual void take_layer_times(bool wait, const std::function<void(int, double)>& f) = 0;
  virtual void forget_layer_times() = 0;

 protected:
  // `marks`: where Caps::async, the marks put behind the device's work (Note [Ring space behind
  // the kernels]).
  DeviceBackend(Caps caps, c10::Device device, LayerClock::MakeMark marks = nullptr);

 private:
  Caps caps_;
  c10::Device device_;
  std::unique_ptr<KernelQueue> queue_;  // where Caps::async
  std::uint64_t released_early_ = 0;
};

// The backend for the device `o` names: the host (layers run on the calling thread, on host
// memory; with SWAPNET_DEVICE_TWIN=cuda the CUDA backend's pipeline there, Note [The CUDA
// backend's host twin]) or the first CUDA device (throws Error naming `image` where there is
// none: require_cuda). Not configured yet.
std::unique_ptr<DeviceBackend> make_backend(const std::string& image, const ExecutorOptions& o);
// The Caps of the backend make_backend would give for `o`, known before there is one: plans are
// made from the options alone (lend_for in planning.cpp).
DeviceBackend::Caps backend_caps(const ExecutorOptions& o);

}  // namespace swapnet
