// Loads a model through the installed library and checks the layered run against forward.
#include <swapnet/assembly.h>

#include <torch/script.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer MODEL.pt\n");
    return 2;
  }
  try {
    torch::jit::Module module;
    swapnet::Skeleton sk = swapnet::Skeleton::load(argv[1], &module);
    torch::manual_seed(1);
    at::Tensor x = torch::randn({2, 3, 16, 16});
    c10::IValue expected = module.forward({x.clone()});
    c10::IValue actual = sk.forward({x.clone()});
    swapnet::Comparison c = swapnet::compare_outputs(expected, actual);
    std::printf("consumer: %zu layers, equal=%d\n", sk.layers().size(), c.equal ? 1 : 0);
    return c.equal ? 0 : 1;
  } catch (const swapnet::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 2;
  }
}
