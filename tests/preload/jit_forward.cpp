// An unmodified libtorch program (not linked with swapnet): loads a TorchScript model with
// torch::jit::load, runs forward ITERS times (default 2) on a seeded input and prints a hash of
// every output byte and whether all runs agree; its peak RSS (VmHWM) goes to stderr.
// transparent_test.sh runs it with and without LD_PRELOAD + SWAPNET_BUDGET. WHERE puts the model
// on the GPU as programs do: cuda-map loads it there (torch::jit::load(file, kCUDA)), cuda-to
// moves it there after loading (.to(kCUDA)); the input goes there too, the outputs are hashed
// after .cpu(), and the GPU memory in use at the end (cudaMemGetInfo: the context and what
// PyTorch's caching allocator holds, which keeps its peak) goes to stderr. A failure is one line
// on stderr, "error: ...", and exit status 1.
//   jit_forward MODEL.pt N,C,H,W [ITERS] [cpu|cuda-map|cuda-to]
#include <dlfcn.h>
#include <torch/script.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace {

unsigned long long fnv(const at::Tensor& t) {
  const at::Tensor c = t.cpu().contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  unsigned long long h = 1469598103934665603ULL;
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

unsigned long long hash_of(const c10::IValue& v) {
  if (v.isTensor()) return fnv(v.toTensor());
  unsigned long long h = 0;
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) h = h * 31 + hash_of(e);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) h = h * 31 + hash_of(e);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) h = h * 31 + hash_of(kv.value());
  }
  return h;
}

long vm_hwm_kb() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// Device memory in use (total - free), MiB, through the CUDA runtime the process has loaded;
// -1 where there is none.
long gpu_used_mb() {
  using MemGetInfo = int (*)(size_t*, size_t*);
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}) {
    void* h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) continue;
    auto f = reinterpret_cast<MemGetInfo>(dlsym(h, "cudaMemGetInfo"));
    size_t free = 0, total = 0;
    if (f != nullptr && f(&free, &total) == 0) return static_cast<long>((total - free) >> 20);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: jit_forward MODEL.pt N,C,H,W [ITERS] [cpu|cuda-map|cuda-to]\n");
    return 2;
  }
  const std::string where = argc == 5 ? argv[4] : "cpu";
  if (where != "cpu" && where != "cuda-map" && where != "cuda-to") {
    std::fprintf(stderr, "jit_forward: '%s' is not cpu, cuda-map or cuda-to\n", where.c_str());
    return 2;
  }
  std::vector<int64_t> shape;
  std::stringstream ss(argv[2]);
  for (std::string d; std::getline(ss, d, ',');) shape.push_back(std::stoll(d));
  try {
    torch::manual_seed(0);
    torch::NoGradGuard no_grad;
    torch::jit::Module m = where == "cuda-map" ? torch::jit::load(argv[1], torch::Device("cuda")) : torch::jit::load(argv[1]);
    if (where == "cuda-to") m.to(torch::Device("cuda"));
    m.eval();
    at::Tensor x = torch::randn(shape);
    if (where != "cpu") x = x.to(torch::Device("cuda"));
    const int iters = argc >= 4 ? std::stoi(argv[3]) : 2;
    const unsigned long long first = hash_of(m.forward({x}));
    bool same = true;
    for (int i = 1; i < iters; ++i) same = same && hash_of(m.forward({x})) == first;
    std::printf("output %016llx same=%d\n", first, same ? 1 : 0);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "error: %s\n", what.substr(0, what.find('\n')).c_str());
    return 1;
  }
  std::fprintf(stderr, "vm_hwm_kb %ld\n", vm_hwm_kb());
  if (where != "cpu") std::fprintf(stderr, "gpu_used_mb %ld\n", gpu_used_mb());
  return 0;
}
