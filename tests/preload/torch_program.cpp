// An unmodified libtorch program: built against libtorch only (never linked with swapnet), it
// loads a TorchScript model, runs it, runs a torch::nn module and a few ops, and prints a hash of
// every output byte on stdout (identical with and without the preload, or the preload broke
// something). When libswapnet_preload.so is preloaded it also says on stderr whether a weight
// made by torch::jit::load, an op's result and a torch::nn parameter came from it.
//   torch_program MODEL.pt
#include <dlfcn.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>

namespace {

std::uint64_t fnv(const at::Tensor& t, std::uint64_t h = 1469598103934665603ull) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: torch_program MODEL.pt\n");
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
  std::printf("model %016llx nn %016llx ops %016llx shape %lld\n", static_cast<unsigned long long>(fnv(y)),
              static_cast<unsigned long long>(fnv(z)), static_cast<unsigned long long>(fnv(w)),
              static_cast<long long>(y.numel()));
  using Owns = int (*)(const void*);
  if (auto owns = reinterpret_cast<Owns>(dlsym(RTLD_DEFAULT, "swapnet_preload_owns"))) {
    const at::Tensor jit_weight = (*m.parameters().begin());
    std::fprintf(stderr, "owned: jit=%d op=%d nn=%d\n", owns(jit_weight.data_ptr()), owns(y.data_ptr()),
                 owns(lin->weight.data_ptr()));
  }
  return 0;
}
