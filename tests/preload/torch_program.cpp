// An unmodified libtorch program: built against libtorch only (never linked with swapnet), it
// loads a TorchScript model, runs it, runs a torch::nn module and a few ops, and prints a hash of
// every output byte on stdout (identical with and without the preload, or the preload broke
// something). When libswapnet_preload.so is preloaded it also says on stderr whether a weight
// made by torch::jit::load, an op's result and a torch::nn parameter came from it.
// With --to-cuda it also moves tensors to the GPU and prints on stdout what .to(kCUDA) gave:
// whether the CUDA tensor aliases the CPU tensor's bytes, whether those bytes outlive the CPU
// tensor while the alias exists (and are freed after), and whether a computation on the GPU
// gives the CPU's result. Without a CUDA libtorch, the normal path's error is reported.
//   torch_program MODEL.pt [--to-cuda]
#include <dlfcn.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace {

// The first sentence of an error (libtorch's list every backend after it).
std::string first(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  return m.substr(0, m.find_first_of(".\n"));
}

std::uint64_t fnv(const at::Tensor& t, std::uint64_t h = 1469598103934665603ull) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// .to(kCUDA) of a tensor made by an op (the preload serves it) and of one needing a dtype change.
void to_cuda() {
  using Owns = int (*)(const void*);
  auto owns = reinterpret_cast<Owns>(dlsym(RTLD_DEFAULT, "swapnet_preload_owns"));
  // Small integers: every product and sum is exact in float (and TF32), so the GPU's matrix
  // product equals the CPU's bit for bit whatever order it adds in.
  at::Tensor a = torch::arange(4096, torch::kFloat).remainder(16).reshape({64, 64});
  const void* ptr = a.data_ptr();
  const at::Tensor expect = torch::mm(a, a).sum(1);
  try {
    at::Tensor b = a.to(torch::Device(torch::kCUDA, 0));  // an index: CPU-only libtorch cannot pick one
    const int same = b.data_ptr() == ptr;
    a = at::Tensor();
    const int alive = owns ? owns(ptr) : -1;
    int equal = -1;  // the GPU computes only with a CUDA libtorch
    if (torch::cuda::is_available()) equal = torch::equal(torch::mm(b, b).sum(1).cpu(), expect);
    b = at::Tensor();
    const int freed = owns ? !owns(ptr) : -1;
    std::printf("to_cuda: aliased=%d cuda=1 alive_while_aliased=%d freed_after=%d equal=%d\n", same, alive, freed, equal);
  } catch (const c10::Error& e) {
    std::printf("to_cuda: normal path (%s)\n", first(e).c_str());
  }
  try {
    at::Tensor h = expect.to(torch::Device(torch::kCUDA, 0), torch::kHalf);
    std::printf("to_cuda_half: copied=%d\n", h.data_ptr() != expect.data_ptr());
  } catch (const c10::Error& e) {
    std::printf("to_cuda_half: normal path (%s)\n", first(e).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool cuda = argc == 3 && std::string(argv[2]) == "--to-cuda";
  if (argc != 2 && !cuda) {
    std::fprintf(stderr, "usage: torch_program MODEL.pt [--to-cuda]\n");
    return 2;
  }
  at::set_num_threads(1);
  torch::jit::Module m = torch::jit::load(argv[1]);
  m.eval();
  torch::manual_seed(0);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  c10::InferenceMode guard;
  at::Tensor y = m.forward({x}).toTensor();
  torch::nn::Linear lin(16, 8);
  at::Tensor z = torch::relu(lin->forward(torch::ones({4, 16}))).sum(0);
  at::Tensor w = torch::matmul(y.reshape({-1, 1}), y.reshape({1, -1}).slice(1, 0, 10));
  at::Tensor v = w.to(torch::kDouble).t().to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);  // aten::_to_copy
  std::printf("model %016llx nn %016llx ops %016llx to %016llx shape %lld\n", static_cast<unsigned long long>(fnv(y)),
              static_cast<unsigned long long>(fnv(z)), static_cast<unsigned long long>(fnv(w)),
              static_cast<unsigned long long>(fnv(v)), static_cast<long long>(y.numel()));
  if (cuda) to_cuda();
  using Owns = int (*)(const void*);
  if (auto owns = reinterpret_cast<Owns>(dlsym(RTLD_DEFAULT, "swapnet_preload_owns"))) {
    const at::Tensor jit_weight = (*m.parameters().begin());
    std::fprintf(stderr, "owned: jit=%d op=%d nn=%d\n", owns(jit_weight.data_ptr()), owns(y.data_ptr()),
                 owns(lin->weight.data_ptr()));
  }
  return 0;
}
