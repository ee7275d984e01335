// An unmodified libtorch program (not linked with swapnet): loads a TorchScript model with
// torch::jit::load, runs forward ITERS times (default 2) on a seeded input and prints a hash of
// every output byte and whether all runs agree; its peak RSS (VmHWM) goes to stderr.
// transparent_test.sh runs it with and without LD_PRELOAD + SWAPNET_BUDGET.
//   jit_forward MODEL.pt N,C,H,W [ITERS]
#include <torch/script.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace {

unsigned long long fnv(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: jit_forward MODEL.pt N,C,H,W [ITERS]\n");
    return 2;
  }
  std::vector<int64_t> shape;
  std::stringstream ss(argv[2]);
  for (std::string d; std::getline(ss, d, ',');) shape.push_back(std::stoll(d));
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  torch::jit::Module m = torch::jit::load(argv[1]);
  m.eval();
  const at::Tensor x = torch::randn(shape);
  const int iters = argc == 4 ? std::stoi(argv[3]) : 2;
  const unsigned long long first = hash_of(m.forward({x}));
  bool same = true;
  for (int i = 1; i < iters; ++i) same = same && hash_of(m.forward({x})) == first;
  std::printf("output %016llx same=%d\n", first, same ? 1 : 0);
  std::fprintf(stderr, "vm_hwm_kb %ld\n", vm_hwm_kb());
  return 0;
}
