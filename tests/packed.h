// A model packed into a temporary swap image, as `swapnet pack` does (activation peak measured),
// for the executor tests (tests/executor_test.cpp, tests/gpu/gpu_test.cpp).
#pragma once

#include <sys/stat.h>
#include <torch/script.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
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
//
// Note [Packed once per process]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The unit tests run in groups, several per process (Note [Unit tests in groups] in
// tests/CMakeLists.txt), and most pack the same model at the same input: a model is packed once
// per process and options, into a directory of its own (another shape's pack of the same model
// must not overwrite it; the file keeps its name, which tests use as the model's), and each test
// gets its own copy of the module. A test that changes an image works on a copy of it.
inline Packed packed(const std::string& name, const std::vector<int64_t>& shape,
                     const SkeletonOptions& options = pack_skeleton_options()) {
  static std::mutex mu;
  static std::map<std::string, Packed> cache;
  std::string key = name + "|" + std::to_string(options.split_above) + "|" + std::to_string(options.split_part) + "|" +
                    std::to_string(options.check_parts_on_gpu);
  for (int64_t d : shape) key += "," + std::to_string(d);
  for (const auto& w : options.keep_whole) key += "|k" + w;
  for (const auto& w : options.coarse_parts) key += "|c" + w;
  std::lock_guard<std::mutex> lk(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    Packed p;
    const std::string made = pack(name, shape, &p.m, options);
    const std::string dir = process_temp_dir() + "/packed" + std::to_string(cache.size());
    if (::mkdir(dir.c_str(), 0700) != 0) throw Error(dir + ": cannot create: " + std::strerror(errno));
    p.img = dir + made.substr(made.rfind('/'));
    if (std::rename(made.c_str(), p.img.c_str()) != 0) throw Error(made + ": cannot move: " + std::strerror(errno));
    Status s = read_image_info(p.img, &p.info);
    if (!s.ok()) throw Error(s.message());
    it = cache.emplace(key, std::move(p)).first;
  }
  Packed p;
  p.m = it->second.m.clone();
  p.img = it->second.img;
  p.info = it->second.info;
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
