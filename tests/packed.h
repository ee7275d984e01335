// A model packed into a temporary swap image, as `swapnet pack` does (activation peak measured),
// for the executor tests (tests/executor_test.cpp, tests/gpu/gpu_test.cpp).
#pragma once

#include <torch/script.h>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "swapnet/assembly.h"
#include "test_util.h"

namespace swapnet {
namespace test_util {

// Packs a model (with its activation peak measured, as `swapnet pack` does) into a temp image.
inline std::string pack(const std::string& name, const std::vector<int64_t>& shape, torch::jit::Module* m,
                        const SkeletonOptions& options = pack_skeleton_options()) {
  torch::manual_seed(1);
  at::Tensor x = torch::randn(shape);
  Skeleton sk = load_for_pack(model(name), {x}, options, m);  // as swapnet pack
  sk.profile({x}, ProfileOptions{0, 1});
  PackOptions po;
  po.activation_bytes = measure_activation_bytes(sk, {x}, &po.layer_peak_bytes);
  po.input_profiles.push_back(InputProfile{po.activation_bytes, describe_inputs({x})});
  // In a directory removed at exit: a test run packs in each of its ~200 test processes, and
  // leaving 59 MB each behind filled /tmp within a day of runs.
  std::string path = process_temp_dir() + "/" + name + (options.split_above == kPackSplitAbove && options.split_part == kPackSplitPart
                             ? ""
                             : "-split" + std::to_string(options.split_above) + "-" + std::to_string(options.split_part)) + ".swapnet";
  sk.pack(path, po);
  return path;
}

// The module's own output for `x`: what swapped inference must equal bit for bit.
inline c10::IValue reference(torch::jit::Module& m, const at::Tensor& x) {
  c10::InferenceMode guard;
  return m.forward({x.clone()});
}

// A packed model: the module (for reference outputs), its image and the image's tables.
struct Packed {
  torch::jit::Module m;
  std::string img;
  ImageInfo info;
};
inline Packed packed(const std::string& name, const std::vector<int64_t>& shape,
                     const SkeletonOptions& options = pack_skeleton_options()) {
  Packed p;
  p.img = pack(name, shape, &p.m, options);
  Status s = read_image_info(p.img, &p.info);
  if (!s.ok()) throw Error(s.message());
  return p;
}

// A copy of a packed image with other layer times (what planning reads from an image packed on
// another machine, or in a busy second of this one).
inline std::string with_layer_times(const Packed& pk, const std::string& name, const std::function<double(int, double)>& f) {
  std::ifstream in(pk.img, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ImageInfo info = pk.info;
  for (size_t k = 0; k < info.layers.size(); ++k) info.layers[k].time_ms = f(static_cast<int>(k), info.layers[k].time_ms);
  const std::string path = process_temp_dir() + "/" + name + ".swapnet";
  write_image(path, info, [&](std::size_t t) { return static_cast<const void*>(bytes.data() + info.tensors[t].offset); })
      .throw_if_error();
  return path;
}

// The same image whose last layer says it takes 10 s (learning tests: Note [Learning the costs
// in service] in cost_learner.cpp).
inline std::string with_slow_last_layer(const Packed& pk, const std::string& name) {
  const int last = static_cast<int>(pk.info.layers.size()) - 1;
  return with_layer_times(pk, name, [&](int k, double t) { return k == last ? 1e4 : t; });
}

}  // namespace test_util
}  // namespace swapnet
