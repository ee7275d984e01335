// CLI commands that work on models and images: inspect, verify, pack, check, info.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "check_cmd.h"
#include "commands.h"
#include "inputs.h"
#include "swapnet/allocator.h"
#include "swapnet/assembly.h"
#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {
namespace {

using json = nlohmann::json;

std::vector<c10::IValue> make_inputs(const Common& c) {
  if (c.input_shapes.empty()) {
    throw Error("an input is required: --input-shape 1,3,224,224 (float) or --input SPEC, e.g. --input int64[1,16]:0..8000");
  }
  return swapnet::make_inputs(c.input_shapes, c.seed);
}

std::string join_shapes(const std::vector<std::string>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? " " : "") + s[i];
  return out;
}


// One row of the model info table, from a skeleton or from an image's layer table.
struct Row {
  int index;
  std::string name;
  std::int64_t bytes, tensors;
  double flops, time_ms;
  std::int64_t live_bytes;
  std::vector<std::string> ops, live_in;
  std::int64_t offset = -1, size = -1;  // images only: the layer's aligned byte range
  std::int64_t peak_bytes = -1;         // images of format 3 on: activation peak while it ran
};

int print_table(const std::string& path, const std::vector<Row>& rows, json j, const Common& c,
                const std::string& headline) {
  std::int64_t total_bytes = 0, total_tensors = 0;
  double total_flops = 0, total_ms = 0;
  int largest = 0;
  for (const auto& r : rows) {
    total_bytes += r.bytes;
    total_tensors += r.tensors;
    total_flops += r.flops;
    total_ms += r.time_ms;
    if (r.bytes > rows[largest].bytes) largest = r.index;
  }
  if (c.json) {
    j["model"] = path;
    j["num_layers"] = rows.size();
    j["total_bytes"] = total_bytes;
    j["total_tensors"] = total_tensors;
    j["total_flops"] = total_flops;
    j["total_time_ms"] = total_ms;
    if (!rows.empty()) {
      j["largest_layer"] = {{"index", largest}, {"name", rows[largest].name}, {"bytes", rows[largest].bytes}};
    }
    json arr = json::array();
    for (const auto& r : rows) {
      json l = {{"index", r.index}, {"name", r.name}, {"bytes", r.bytes}, {"tensors", r.tensors},
                {"flops", r.flops}, {"time_ms", r.time_ms}, {"live_bytes", r.live_bytes}, {"ops", r.ops}};
      if (!r.live_in.empty()) l["live_in"] = r.live_in;
      if (r.offset >= 0) {
        l["offset"] = r.offset;
        l["size"] = r.size;
      }
      if (r.peak_bytes >= 0) l["peak_bytes"] = r.peak_bytes;
      arr.push_back(std::move(l));
    }
    j["layers"] = std::move(arr);
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  std::printf("%s\n", headline.c_str());
  std::printf("%5s  %-40s %12s %7s %12s %9s %12s\n", "index", "name", "bytes", "tensors", "MFLOPs", "time_ms",
              "live_bytes");
  for (const auto& r : rows) {
    std::string name = r.name.size() > 40 ? "..." + r.name.substr(r.name.size() - 37) : r.name;
    std::printf("%5d  %-40s %12lld %7lld %12.2f %9.3f %12lld\n", r.index, name.c_str(), static_cast<long long>(r.bytes),
                static_cast<long long>(r.tensors), r.flops / 1e6, r.time_ms, static_cast<long long>(r.live_bytes));
  }
  std::printf("total  %-40s %12lld %7lld %12.2f %9.3f\n", "", static_cast<long long>(total_bytes),
              static_cast<long long>(total_tensors), total_flops / 1e6, total_ms);
  if (!rows.empty()) {
    std::printf("largest layer: %d (%s), %s\n", largest, rows[largest].name.c_str(),
                format_bytes(rows[largest].bytes).c_str());
  }
  return 0;
}

std::vector<std::string> split_ops(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    out.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

int inspect_image(const std::string& path, const Common& c) {
  ImageInfo info;
  read_image_info(path, &info).throw_if_error();
  std::vector<Row> rows;
  for (size_t k = 0; k < info.layers.size(); ++k) {
    const ImageLayer& L = info.layers[k];
    std::int64_t bytes = 0;
    for (std::uint32_t t = L.first_tensor; t < L.first_tensor + L.num_tensors; ++t) {
      std::int64_t numel = 1;
      for (auto d : info.tensors[t].sizes) numel *= d;
      bytes += numel * info.tensors[t].element_size;
    }
    rows.push_back(Row{static_cast<int>(k), L.name, bytes, L.num_tensors, L.flops, L.time_ms,
                       static_cast<std::int64_t>(L.live_bytes), split_ops(L.ops), {},
                       static_cast<std::int64_t>(L.offset), static_cast<std::int64_t>(L.size),
                       info.version >= 3 ? static_cast<std::int64_t>(L.peak_bytes) : -1});
  }
  int params = 0, buffers = 0;
  for (const auto& t : info.tensors) {
    params += t.kind == 0;
    buffers += t.kind == 1;
  }
  json j;
  j["image"] = true;
  j["format_version"] = info.version;
  j["source"] = info.source;
  j["input_shapes"] = info.input_shapes;
  j["file_bytes"] = info.file_size;
  j["data_bytes"] = info.data_size;
  j["skeleton_bytes"] = info.skeleton.size();
  j["activation_bytes"] = info.activation_bytes;
  json profiles = json::array();  // inputs activations were measured for (Note [Dynamic shapes])
  for (const auto& p : info.input_profiles) {
    profiles.push_back({{"inputs", inputs_text(p.inputs)}, {"activation_bytes", p.activation_bytes}});
  }
  j["input_profiles"] = profiles;
  j["parameters"] = params;
  j["buffers"] = buffers;
  std::string head = path + ": swap image v" + std::to_string(info.version) + " of " + info.source + ", " +
                     std::to_string(info.layers.size()) + " layers, " + format_bytes(info.file_size) +
                     " (skeleton " + format_bytes(info.skeleton.size()) + "), profiled at input " + info.input_shapes;
  return print_table(path, rows, j, c, head);
}

}  // namespace

void apply_common(const Common& c) {
  set_log_level(parse_log_level(c.log_level));
  int threads = c.threads > 0 ? c.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
}

bool is_image(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  return f.read(magic, 8) && std::memcmp(magic, "SWAPNET\0", 8) == 0;
}

SkeletonOptions skeleton_options(const Common& c) {
  SkeletonOptions o = pack_skeleton_options();
  o.check_parts_on_gpu = true;  // where a GPU is usable (Note [Splitting on the GPU])
  if (!c.split_above.empty()) o.split_above = parse_size(c.split_above);
  if (o.split_above > (std::uint64_t{1} << 40)) {
    throw Error("--split-above " + c.split_above + ": at most 1 TiB (0: never split)");
  }
  if (!c.split_part.empty()) o.split_part = parse_size(c.split_part);
  if (!c.split_part.empty() && o.split_part > o.split_above) {
    throw Error("--split-part " + c.split_part + ": at most --split-above (" +
                (o.split_above == 0 ? std::string("0: nothing is split") : format_bytes(o.split_above)) + "); 0: as --split-above");
  }
  return o;
}

int inspect(const std::string& path, const Common& c, int iters) {
  apply_common(c);
  if (is_image(path)) return inspect_image(path, c);
  auto t0 = Clock::now();
  Skeleton sk = Skeleton::load(path, nullptr, skeleton_options(c));
  double build_ms = ms_since(t0);
  auto inputs = make_inputs(c);
  t0 = Clock::now();
  ProfileOptions opt;
  opt.iters = iters;
  try {
    sk.profile(inputs, opt);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (input shape " + join_shapes(c.input_shapes) + ")");
  }
  double profile_ms = ms_since(t0);
  std::vector<Row> rows;
  for (const auto& L : sk.layers()) {
    rows.push_back(Row{L.index, L.name, L.bytes, L.tensors, L.flops, L.time_ms, L.live_bytes, L.ops, L.live_in});
  }
  int shared = 0;
  for (const auto& s : sk.slots()) shared += s.used_by.size() > 1;
  json j;
  j["input_shapes"] = c.input_shapes;
  j["threads"] = at::get_num_threads();
  j["module_bytes"] = sk.total_bytes();
  j["parameters"] = sk.num_parameters();
  j["buffers"] = sk.num_buffers();
  j["shared_slots"] = shared;
  j["split_layers"] = sk.split_layers();  // computed in parts (Note [Splitting large layers])
  j["split_parts"] = sk.split_parts();
  j["split_tensors"] = sk.split_tensors();
  j["build_ms"] = build_ms;
  j["profile_ms"] = profile_ms;
  char head[512];
  std::snprintf(head, sizeof head, "%s: %zu layers, %s in %zu tensors (%d parameters, %d buffers), input %s, %d threads; "
                "skeleton built in %.1f ms, profiled in %.1f ms", path.c_str(), sk.layers().size(),
                format_bytes(sk.total_bytes()).c_str(), sk.slots().size(), sk.num_parameters(), sk.num_buffers(),
                join_shapes(c.input_shapes).c_str(), at::get_num_threads(), build_ms, profile_ms);
  return print_table(path, rows, j, c, head);
}

namespace {

// verify --image: the skeleton from `image`, its weights bound to the image's bytes, read once,
// whole, checksums verified. Returns those bytes (the caller frees them with free_aligned).
void* bind_image(const std::string& image, Skeleton* sk) {
  ImageInfo info;
  read_image_info(image, &info).throw_if_error();
  *sk = Skeleton::from_image(info, image);
  std::unique_ptr<BlockReader> reader;
  BlockReader::open(image, ReaderOptions{}, &reader).throw_if_error();
  void* data = alloc_aligned(info.data_size);
  if (data == nullptr) throw Error(image + ": cannot allocate " + format_bytes(info.data_size));
  std::vector<BlockReader::Check> checks;
  for (size_t k = 0; k < info.layers.size(); ++k) {
    checks.push_back({info.layers[k].offset, info.layers[k].size, info.layers[k].checksum,
                      "layer " + std::to_string(k) + " (" + info.layers[k].name + ")"});
  }
  Status s = reader->read(info.data_offset, info.data_size, data, std::move(checks));
  if (!s.ok()) {
    free_aligned(data);
    throw Error(s.message());
  }
  if (!info.layers.empty()) sk->bind_layers(0, static_cast<int>(info.layers.size()) - 1, data, info.data_offset);
  return data;
}

// `runs` layered forwards of `sk`; their times go to `ms`.
std::vector<c10::IValue> layered_runs(Skeleton& sk, const std::vector<c10::IValue>& inputs, const Common& c, int runs,
                                      std::vector<double>* ms) {
  std::vector<c10::IValue> layered;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    try {
      layered.push_back(sk.forward(clone_inputs(inputs)));
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (input shape " + join_shapes(c.input_shapes) + ")");
    }
    ms->push_back(ms_since(t0));
  }
  return layered;
}

// Every layered output against every reference run (cold and optimised by the executor): the
// worst comparison. The reference runs' times go to `ms`.
Comparison compare_with_forward(torch::jit::Module& module, const std::string& path, const Common& c,
                                const std::vector<c10::IValue>& inputs, const std::vector<c10::IValue>& layered,
                                int runs, std::vector<double>* ms) {
  Comparison worst;
  worst.equal = true;
  for (int r = 0; r < runs; ++r) {
    c10::IValue ref;
    const auto t0 = Clock::now();
    try {
      c10::InferenceMode guard;
      ref = module.forward(clone_inputs(inputs));
    } catch (const c10::Error& e) {
      throw Error(path + ": forward failed on input shape " + join_shapes(c.input_shapes) + ": " +
                  e.what_without_backtrace());
    }
    ms->push_back(ms_since(t0));
    for (const auto& out : layered) {
      Comparison cmp = compare_outputs(ref, out);
      if (!cmp.equal && worst.equal) worst.difference = cmp.difference;
      worst.equal = worst.equal && cmp.equal;
      worst.max_abs_diff = std::max(worst.max_abs_diff, cmp.max_abs_diff);
    }
  }
  return worst;
}

void report_verify(const std::string& path, const std::string& image, const Common& c, int runs, size_t layers,
                   const Comparison& worst, double build_ms, const std::vector<double>& forward_ms,
                   const std::vector<double>& layered_ms) {
  if (c.json) {
    json j;
    j["model"] = path;
    if (!image.empty()) j["image"] = image;
    j["equal"] = worst.equal;
    j["max_abs_diff"] = std::isinf(worst.max_abs_diff) ? json(nullptr) : json(worst.max_abs_diff);
    j["layers"] = layers;
    j["runs"] = runs;
    if (!worst.equal) j["difference"] = worst.difference;
    j["build_ms"] = build_ms;
    j["forward_ms_median"] = median(forward_ms);
    j["layered_ms_median"] = median(layered_ms);
    j["threads"] = at::get_num_threads();
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s%s: %s over %zu layers (%d runs each), max_abs_diff %g%s%s\n", path.c_str(),
                image.empty() ? "" : (" via " + image).c_str(),
                worst.equal ? "bit-identical to forward" : "DIFFERS from forward", layers, runs,
                worst.max_abs_diff, worst.equal ? "" : "; first difference: ", worst.difference.c_str());
    std::printf("forward %.1f ms, layered %.1f ms (medians), skeleton built in %.1f ms\n", median(forward_ms),
                median(layered_ms), build_ms);
  }
}

}  // namespace

int verify(const std::string& path, const Common& c, int runs, const std::string& image) {
  apply_common(c);
  torch::jit::Module module;
  auto t0 = Clock::now();
  Skeleton sk = Skeleton::load(path, &module, skeleton_options(c));
  double build_ms = ms_since(t0);
  // With an image: the skeleton comes from the image and its weights from the image's bytes
  // (read once, whole, with the block reader), so the whole pack -> fetch -> bind path is checked.
  void* data = nullptr;
  if (!image.empty()) data = bind_image(image, &sk);
  struct FreeData {
    void* p;
    ~FreeData() { free_aligned(p); }
  } free_data{data};
  auto inputs = make_inputs(c);
  std::vector<double> layered_ms, forward_ms;
  const std::vector<c10::IValue> layered = layered_runs(sk, inputs, c, runs, &layered_ms);
  const Comparison worst = compare_with_forward(module, path, c, inputs, layered, runs, &forward_ms);
  report_verify(path, image, c, runs, sk.layers().size(), worst, build_ms, forward_ms, layered_ms);
  return worst.equal ? 0 : 1;
}

int signature(const std::string& model) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(model);
  } catch (const std::exception& e) {
    throw Error(model + ": not a TorchScript module file (torch::jit::load: " + std::string(e.what()).substr(0, std::string(e.what()).find('\n')) + ")");
  }
  auto method = m.find_method("forward");
  if (!method) throw Error(model + ": the module has no forward");
  const c10::FunctionSchema& s = method->function().getSchema();
  std::vector<c10::Argument> args(s.arguments().begin() + 1, s.arguments().end());  // without self
  json inputs = json::array();
  for (const auto& a : args) inputs.push_back({{"name", a.name()}, {"type", a.type()->annotation_str()}});
  const c10::FunctionSchema without_self(s.name(), s.overload_name(), args, s.returns());
  std::cout << json{{"model", model}, {"schema", toString(without_self)}, {"inputs", inputs}}.dump() << "\n";
  return 0;
}

int pack(const std::string& model, const std::string& out, const Common& c, const std::vector<std::string>& profiles) {
  apply_common(c);
  auto t0 = Clock::now();
  // The image records the specs space-separated (ImageInfo::input_shapes).
  for (const auto& s : c.input_shapes) {
    if (s.find_first_of(" \t\n") != std::string::npos) {
      throw Error("input '" + s + "': pack records the input specs separated by spaces, so a spec may not contain one "
                  "(a file path with a space: link or rename the file)");
    }
  }
  probe_image_path(out).throw_if_error();  // before the model's load and profile, not after them
  auto inputs = make_inputs(c);
  Skeleton sk = load_for_pack(model, inputs, skeleton_options(c));
  try {
    sk.profile(inputs, ProfileOptions{1, 3});
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (input shape " + join_shapes(c.input_shapes) + ")");
  }
  PackOptions po;
  po.input_shapes = join_shapes(c.input_shapes);
  po.activation_bytes = measure_activation_bytes(sk, inputs, &po.layer_peak_bytes);  // for budget planning
  po.input_profiles.push_back(InputProfile{po.activation_bytes, describe_inputs(inputs)});
  for (const auto& text : profiles) {
    std::vector<std::string> specs;
    std::istringstream words(text);
    for (std::string w; words >> w;) specs.push_back(w);
    std::vector<c10::IValue> more;
    std::uint64_t bytes = 0;
    try {
      more = swapnet::make_inputs(specs, c.seed);
      bytes = measure_activation_bytes(sk, more);
    } catch (const std::exception& e) {
      throw Error(model + ": --input-profile '" + text + "': " + e.what());
    }
    po.input_profiles.push_back(InputProfile{bytes, describe_inputs(more)});
    // The reserve planned at open holds every profile (Note [Dynamic shapes] in input_meter.cpp).
    po.activation_bytes = std::max(po.activation_bytes, bytes);
  }
  const bool tty = ::isatty(2) != 0 && !c.json;
  int last_pct = -1;
  if (tty) {
    po.progress = [&](std::uint64_t done, std::uint64_t total) {
      int pct = total ? static_cast<int>(100 * done / total) : 100;
      if (pct == last_pct) return;
      last_pct = pct;
      std::fprintf(stderr, "\rpacking %s: %3d%% (%s of %s)   ", out.c_str(), pct, format_bytes(done).c_str(),
                   format_bytes(total).c_str());
    };
  }
  sk.pack(out, po);
  if (tty) std::fprintf(stderr, "\n");
  double ms = ms_since(t0);
  ImageInfo info;
  read_image_info(out, &info).throw_if_error();
  if (c.json) {
    json j = {{"model", model}, {"image", out}, {"layers", info.layers.size()}, {"tensors", info.tensors.size()},
              {"file_bytes", info.file_size}, {"data_bytes", info.data_size},
              {"skeleton_bytes", info.skeleton.size()}, {"pack_ms", ms}};
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s -> %s: %zu layers, %zu tensors, %s (skeleton %s) in %.0f ms\n", model.c_str(), out.c_str(),
                info.layers.size(), info.tensors.size(), format_bytes(info.file_size).c_str(),
                format_bytes(info.skeleton.size()).c_str(), ms);
  }
  return 0;
}

int check(const std::string& image, const Common& c) {
  apply_common(c);
  return check_image_command(image, c.json);
}

int info(const Common& c) {
  apply_common(c);
  const DeviceInfo& d = cuda_device();
  if (c.json) {
    json j;
    j["built_with_cuda"] = d.built_with_cuda;
    j["cuda_usable"] = d.usable;
    j["cuda_devices"] = d.count;
    j["cuda_device"] = d.name;
    j["integrated"] = d.integrated;
    j["reason"] = d.reason;
    j["threads"] = at::get_num_threads();
    j["torch_parallel"] = at::get_parallel_info();
    std::cout << j.dump() << "\n";
  } else {
    std::printf("CUDA: %s\n", d.usable ? (d.name + (d.integrated ? " (integrated)" : " (discrete)")).c_str()
                                       : ("not usable: " + d.reason).c_str());
    std::printf("threads: %d\n%s", at::get_num_threads(), at::get_parallel_info().c_str());
  }
  return 0;
}

}  // namespace cli
}  // namespace swapnet
