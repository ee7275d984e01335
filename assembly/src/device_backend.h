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

#include "swapnet/assembly.h"

namespace swapnet {

class DeviceBackend {
 public:
  struct Caps {
    // Kernels run asynchronously: a swapped block's ring space goes once the kernels reading it
    // are done, and the cursor may wait for the oldest of them (reclaim). Nor can a running
    // block's bytes go back as its layers end (Note [Layer by layer]): only a backend whose
    // layers are done when the compute thread's call returns does that. (Every backend runs a
    // block's layers as their pieces land: on a GPU their kernels are queued then.)
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
  virtual void block_done(BlockRing& ring) = 0;
  // Pops the ring entries of executed blocks whose kernels are done (all of them, waiting, if
  // `wait`; only the oldest one, waiting, if `one`).
  virtual void reclaim(BlockRing& ring, bool wait, bool one = false) {}
  // Executed blocks whose ring space waits for their kernels.
  virtual std::size_t pending() const { return 0; }
  // Nothing queued reads any block: before the ring is resized, re-read or freed.
  virtual void idle(BlockRing* ring) {}
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
  DeviceBackend(Caps caps, c10::Device device) : caps_(caps), device_(device) {}

 private:
  Caps caps_;
  c10::Device device_;
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
