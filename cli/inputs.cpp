// The CLI's torch-facing helpers that inputs.h declares, but for the naive path (naive.cpp): the
// run's example inputs, the whole model in memory (direct mode, --check's reference), the page
// cache dropped and the peak RSS read.
#include <ATen/ATen.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "inputs.h"
#include "swapnet/allocator.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep)) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::vector<c10::IValue> inputs_for(const Common& c, const ImageInfo& info, std::vector<std::string>* shapes) {
  *shapes = c.input_shapes.empty() ? split(info.input_shapes, ' ') : c.input_shapes;
  if (shapes->empty()) throw Error("the image records no example input: give --input-shape");
  return swapnet::make_inputs(*shapes, c.seed);
}

void drop_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void inputs_to_cuda(std::vector<c10::IValue>* inputs) {
  for (auto& v : *inputs) {
    if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().to(at::Device(at::kCUDA, 0));
  }
}

InMemory::InMemory(const std::string& path, const ImageInfo& info, bool cuda) : sk(Skeleton::from_image(info, path)) {
  std::unique_ptr<BlockReader> r;
  BlockReader::open(path, ReaderOptions{}, &r).throw_if_error();
  data = alloc_aligned(info.data_size);
  if (data == nullptr) throw Error(path + ": cannot allocate " + format_bytes(info.data_size));
  Status s = r->read(info.data_offset, info.data_size, data);
  if (!s.ok()) {
    free_aligned(data);
    throw Error(s.message());
  }
  sk.bind_layers(0, static_cast<int>(info.layers.size()) - 1, data, info.data_offset);
  if (cuda) {
    for (int i = 0; i < static_cast<int>(sk.slots().size()); ++i) {
      if (sk.slot(i).defined()) sk.bind_slot(i, sk.slot(i).to(at::Device(at::kCUDA, 0)));
    }
    free_aligned(data);
    data = nullptr;
  }
}
InMemory::~InMemory() { free_aligned(data); }

std::uint64_t vm_hwm_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace cli
}  // namespace swapnet
