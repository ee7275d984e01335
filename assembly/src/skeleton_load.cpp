// Building a Skeleton from a TorchScript file or module: from_module runs the steps of Note
// [Layered skeleton] (skeleton_impl.h) in order; the accessors read what they built.
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <sys/stat.h>

#include "skeleton_impl.h"
#include "text.h"

namespace swapnet {

Skeleton::Skeleton(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Skeleton::Skeleton(Skeleton&&) noexcept = default;
Skeleton& Skeleton::operator=(Skeleton&&) noexcept = default;
Skeleton::~Skeleton() = default;

Skeleton Skeleton::load(const std::string& path, torch::jit::Module* module, const SkeletonOptions& options) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  torch::jit::Module m;
  try {
    m = torch::jit::load(path);
  } catch (const c10::Error& e) {
    throw Error(path + ": not a TorchScript module file (torch::jit::load: " + detail::torch_message(e) + ")");
  }
  Skeleton sk = from_module(m, path, options);
  if (module != nullptr) *module = m;
  return sk;
}

Skeleton Skeleton::from_module(const torch::jit::Module& module, const std::string& origin,
                               const SkeletonOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  impl->methods = module._ivalue()->compilation_unit();
  torch::jit::Module m = module;  // a handle to the same module
  if (m.is_training()) {
    log(LogLevel::kWarn, origin + ": module is in training mode; swapnet runs inference in eval mode");
    m.eval();
  }
  try {
    impl->collect_slots(m);
    impl->lift(m);
    impl->split_large(options);
    impl->cut();
    impl->renumber_slots();
    impl->assign_ids();
    impl->compile();
  } catch (const c10::Error& e) {
    throw Error(origin + ": cannot build the layered skeleton: " + detail::torch_message(e));
  }
  log(LogLevel::kInfo, origin + ": " + std::to_string(impl->layers.size()) + " layers, " +
                           std::to_string(impl->slots.size()) + " slots, " + format_bytes(impl->total_bytes));
  return Skeleton(std::move(impl));
}

const std::string& Skeleton::origin() const { return impl_->origin; }
int Skeleton::num_inputs() const { return impl_->num_inputs; }
const std::vector<SlotInfo>& Skeleton::slots() const { return impl_->slots; }
const std::vector<LayerInfo>& Skeleton::layers() const { return impl_->layers; }
std::int64_t Skeleton::total_bytes() const { return impl_->total_bytes; }
int Skeleton::num_parameters() const { return impl_->num_parameters; }
int Skeleton::num_buffers() const { return impl_->num_buffers; }
const std::vector<std::string>& Skeleton::split_weights() const { return impl_->split_weights; }
int Skeleton::split_layers() const { return static_cast<int>(impl_->split_weights.size()); }
int Skeleton::split_parts() const { return impl_->split_parts; }
int Skeleton::split_tensors() const { return impl_->split_added; }

}  // namespace swapnet
