// load_for_pack: a skeleton whose large layers are computed in parts only where those parts
// give what forward gives on this machine (Note [Splitting large layers] in skeleton_split.cpp),
// on the CPU and, where one is usable, on the GPU; the others in coarser parts, or whole.
#include <torch/csrc/jit/api/module.h>

#include <ATen/Context.h>
#include <c10/core/InferenceMode.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "swapnet/assembly.h"

namespace swapnet {

namespace {

// Compares skeletons of module `m` with the outputs of its forward on the example inputs.
//
// Note [Splitting on the GPU]: where a GPU is usable, the parts must also give there what
// forward gives there. cuDNN and cuBLAS choose kernels by the output channels too, and an
// image packed on a machine with a GPU runs on either. The skeleton of the same options, its
// slots copied to the GPU, against the module moved there (as direct GPU inference does).
class PartsCheck {
 public:
  PartsCheck(torch::jit::Module& m, const std::string& path, const std::vector<c10::IValue>& inputs,
             const SkeletonOptions& options)
      : m_(m), path_(path), inputs_(inputs) {
    {
      c10::InferenceMode guard;
      expected_ = m_.forward(clones());
    }
    gpu_ = options.check_parts_on_gpu && at::hasCUDA() && cuda_device().usable;
    if (gpu_) {
      try {
        c10::InferenceMode guard;
        torch::jit::Module mg = m_.clone();
        mg.to(dev_);
        expected_gpu_ = mg.forward(gpu_clones());
        log(LogLevel::kInfo, path_ + ": large layers in parts checked on the CPU and on the GPU (" + cuda_device().name + ")");
      } catch (const std::exception& e) {
        gpu_failed(e);
      }
    }
  }

  // Whether skeleton `s` (made with options `o`) gives other outputs than forward.
  bool differs(const Skeleton& s, const SkeletonOptions& o) {
    return !compare_outputs(expected_, s.forward(clones())).equal || (gpu_ && differs_on_gpu(o));
  }

 private:
  std::vector<c10::IValue> clones() const {
    std::vector<c10::IValue> v;
    for (const auto& x : inputs_) v.push_back(x.isTensor() ? c10::IValue(x.toTensor().clone()) : x);
    return v;
  }

  std::vector<c10::IValue> gpu_clones() const {
    std::vector<c10::IValue> v = clones();
    for (auto& x : v) {
      if (x.isTensor() && x.toTensor().defined()) x = x.toTensor().to(dev_);
    }
    return v;
  }

  void gpu_failed(const std::exception& e) {
    log(LogLevel::kWarn, path_ + ": large layers in parts checked on the CPU only: the GPU check failed (" +
                             std::string(e.what()).substr(0, 300) + ")");
    gpu_ = false;
  }

  bool differs_on_gpu(const SkeletonOptions& o) {
    try {
      Skeleton g = Skeleton::from_module(m_, path_, o);
      for (int i = 0; i < static_cast<int>(g.slots().size()); ++i) {
        if (g.slot(i).defined()) g.bind_slot(i, g.slot(i).to(dev_));
      }
      return !compare_outputs(expected_gpu_, g.forward(gpu_clones())).equal;
    } catch (const std::exception& e) {
      gpu_failed(e);
      return false;
    }
  }

  torch::jit::Module& m_;
  const std::string& path_;
  const std::vector<c10::IValue>& inputs_;
  const c10::Device dev_{c10::DeviceType::CUDA, 0};
  c10::IValue expected_, expected_gpu_;
  bool gpu_ = false;
};

// One at a time, the others whole: a layer whose parts of split_part differ is tried in parts
// of split_above (fewer output channels make oneDNN pick other kernels), and stays whole if
// those differ too. `whole_sk` (no layer split) is what is left if the choice differs still.
Skeleton keep_parts_that_agree(PartsCheck& check, torch::jit::Module& m, const std::string& path,
                               const SkeletonOptions& options, const Skeleton& sk, Skeleton whole_sk) {
  const std::vector<std::string> split = sk.split_weights();
  const bool finer = options.split_part != 0 && options.split_part < options.split_above;
  SkeletonOptions keep = options;
  std::string coarse, whole;
  auto add = [](std::string& list, const std::string& name) { list += (list.empty() ? "" : ", ") + name; };
  for (const auto& name : split) {
    SkeletonOptions one = options;
    for (const auto& other : split) {
      if (other != name) one.keep_whole.push_back(other);
    }
    if (!check.differs(Skeleton::from_module(m, path, one), one)) continue;
    bool coarse_ok = false;
    if (finer) {
      one.coarse_parts.push_back(name);
      Skeleton c = Skeleton::from_module(m, path, one);
      coarse_ok = c.split_layers() > 0 && !check.differs(c, one);
    }
    if (coarse_ok) {
      keep.coarse_parts.push_back(name);
      add(coarse, name);
    } else {
      keep.keep_whole.push_back(name);
      add(whole, name);
    }
  }
  Skeleton kept = Skeleton::from_module(m, path, keep);
  if (kept.split_layers() > 0 && check.differs(kept, keep)) {
    log(LogLevel::kWarn, path + ": layers computed in parts along their output channels differ from forward on this "
                                "machine; packed without splitting any");
    return whole_sk;
  }
  if (!coarse.empty()) {
    log(LogLevel::kWarn, path + ": large layers differ from forward on this machine in parts of " +
                             format_bytes(options.split_part) + ", and are computed in parts of " +
                             format_bytes(options.split_above) + ": " + coarse);
  }
  if (!whole.empty()) {
    log(LogLevel::kWarn, path + ": " + std::to_string(split.size() - static_cast<size_t>(kept.split_layers())) + " of " +
                             std::to_string(split.size()) + " large layers differ from forward on this machine when "
                             "computed in parts, and stay whole: " + whole);
  }
  return kept;
}

}  // namespace

Skeleton load_for_pack(const std::string& path, const std::vector<c10::IValue>& inputs, const SkeletonOptions& options,
                       torch::jit::Module* module) {
  torch::jit::Module m;
  Skeleton sk = Skeleton::load(path, &m, options);
  if (module != nullptr) *module = m;
  if (sk.split_layers() == 0) return sk;
  // Note [Splitting large layers]: the parts must give what forward gives, on this machine.
  PartsCheck check(m, path, inputs, options);
  if (!check.differs(sk, options)) return sk;
  SkeletonOptions none = options;
  none.split_above = 0;
  Skeleton whole_sk = Skeleton::from_module(m, path, none);
  // The layers differing from forward without any part (a forward that is not deterministic):
  // nothing to blame the parts for, and verify says what differs.
  if (check.differs(whole_sk, none)) return whole_sk;
  return keep_parts_that_agree(check, m, path, options, sk, std::move(whole_sk));
}

}  // namespace swapnet
