// The naive path of `run --mode naive` and `generate --mode naive`, the ablation baseline: per
// block, a buffered read into a fresh buffer (its pages dropped from the page cache after), a
// copy into freshly allocated tensors, bind, run, free; no overlap of I/O and compute. Its plan
// holds each block twice (Note [An honest naive path]).
#include <ATen/ATen.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "inputs.h"
#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

// Note [An honest naive path]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The naive path holds each block twice while it binds it: the buffer it read into and the
// tensors it copied into. Planned as the paper's two-block pipeline in the same budget, a large
// block beside a small one (gpt_350m at 1/4: a 361 MB block in 406 MB) made it hold 731 MB, and
// it was compared with swapnet in memory the budget does not have. Its blocks are therefore
// planned in half of what the budget leaves after activations and pinned weights, and the plan
// is checked: buffer + copy of the largest block + activations + pinned weights <= the budget.
// Its minimum is that sum for the finest partition (twice the largest layer + the rest); below
// it naive does not run, and says so.

std::uint64_t largest_block(const ExecutionPlan& plan) {
  std::uint64_t largest = 0;
  for (std::uint64_t b : plan.block_bytes) largest = std::max(largest, b);
  return largest;
}

std::uint64_t naive_peak_bytes(const ExecutionPlan& plan) {
  return 2 * largest_block(plan) + plan.activation_bytes + plan.pinned_bytes;
}

namespace {
ExecutorOptions naive_options(ExecutorOptions eo) {
  eo.residency = false;  // the paper's naive swap re-reads every block
  eo.resident.clear();
  eo.partition.clear();
  eo.blocks = 0;
  eo.read_ahead = ReadAhead::kRing;  // blocks limited by one arena, not by pairs
  return eo;
}
}  // namespace

std::uint64_t naive_min_budget(const ImageInfo& info, const ExecutorOptions& options) {
  ExecutorOptions eo = naive_options(options);
  eo.budget = min_budget(info, eo);
  return naive_peak_bytes(plan_execution(info, eo));
}

ExecutionPlan naive_plan(const ImageInfo& info, const ExecutorOptions& options, const std::string& path) {
  ExecutorOptions eo = naive_options(options);
  const std::uint64_t budget = options.budget;
  const std::uint64_t least = min_budget(info, eo);
  const std::uint64_t reserve = std::min(planning_reserve(info, eo), least);
  // From half of what the budget leaves after the reserve down to the finest plan (at `least`),
  // whose peak is naive's minimum: the first plan whose buffer + copy fit is naive's.
  std::uint64_t half = budget > reserve ? reserve + (budget - reserve) / 2 : least;
  for (;;) {
    eo.budget = std::max(half, least);
    ExecutionPlan p = plan_execution(info, eo);
    const std::uint64_t peak = naive_peak_bytes(p);
    if (peak <= budget) return p;
    if (eo.budget == least) {
      throw Error(path + ": --mode naive: budget " + std::to_string(budget) + " bytes (" + format_bytes(budget) +
                  ") is below naive's minimum " + std::to_string(peak) + " bytes (" + format_bytes(peak) +
                  ": twice the largest layer, its read buffer and its copy, + activations)");
    }
    half = eo.budget - std::min(eo.budget - least, peak - budget);
  }
}

// The naive path: per block, buffered read into a fresh buffer, copy into freshly allocated
// tensors (the "dummy model" being filled), bind, run, free. No overlap.
c10::IValue naive_forward(Skeleton& sk, const std::string& path, const ImageInfo& info, const ExecutionPlan& plan,
                          std::vector<c10::IValue> inputs, std::uint64_t* bytes_read) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  // No kernel read-ahead: the paper's naive path reads a block, then runs it. With read-ahead
  // (8 MiB on this VM's disk) the kernel went on reading the next blocks while naive computed,
  // pages still in flight survived the DONTNEED below, and naive read part of the model from
  // memory the budget does not have (yolov3 at 400 MB/s: a median below the I/O bound).
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  Skeleton::Run run = sk.begin(std::move(inputs));
  for (const auto& [first, last] : plan.blocks) {
    const std::uint64_t off = info.layers[first].offset;
    const std::uint64_t len = info.layers[last].offset + info.layers[last].size - off;
    std::vector<char> buf(len);
    std::uint64_t done = 0;
    const auto queued = std::chrono::steady_clock::now();
    while (done < len) {
      ssize_t n = ::pread(fd, buf.data() + done, len - done, static_cast<off_t>(off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        throw Error(path + ": naive read failed at offset " + std::to_string(off + done));
      }
      done += static_cast<std::uint64_t>(n);
    }
    emulated_read_wait(queued, len);  // Note [An emulated disk] (swapcore/src/emulated_disk.cpp)
    *bytes_read += len;
    (void)::posix_fadvise(fd, static_cast<off_t>(off), static_cast<off_t>(len), POSIX_FADV_DONTNEED);
    for (int k = first; k <= last; ++k) {
      for (int s : sk.layers()[k].slots) {
        const SlotInfo& sl = sk.slots()[s];
        at::Tensor dummy = at::empty_strided(sl.sizes, sl.strides, at::TensorOptions().dtype(sl.dtype));
        at::Tensor src = at::from_blob(buf.data() + (info.tensors[s].offset - off), sl.sizes, sl.strides,
                                       at::TensorOptions().dtype(sl.dtype));
        std::memcpy(dummy.data_ptr(), src.data_ptr(), info.tensors[s].nbytes);  // same strides: the span
        sk.bind_slot(s, dummy);
      }
    }
    sk.run_layers(run, last + 1);
    for (int k = first; k <= last; ++k) {
      for (int s : sk.layers()[k].slots) {
        const auto& users = sk.slots()[s].used_by;
        if (users.empty() || users.back() <= last) sk.unbind_slot(s);  // shared weights stay for later blocks
      }
    }
  }
  ::close(fd);
  return sk.finish(run);
}

}  // namespace cli
}  // namespace swapnet
