// Tests of swapnet/assembly.h: the layered skeleton on real and synthetic models.
// Models come from models/export.py in $SWAPNET_MODELS (scripts/test.sh writes them).
#include <gtest/gtest.h>

#include <torch/script.h>

#include <cstdlib>
#include <cstdio>
#include <unistd.h>
#include <set>
#include <string>

#include "swapnet/assembly.h"
#include "test_util.h"

namespace swapnet {
namespace {

using test_util::error_of;
using test_util::model;

// Loads a model or fails the test with the reason (a missing model is a broken setup, not a skip).
Skeleton load(const std::string& name, torch::jit::Module* m = nullptr) { return Skeleton::load(model(name), m); }

class SmallModels : public ::testing::TestWithParam<std::pair<std::string, std::vector<int64_t>>> {};

TEST_P(SmallModels, LayeredRunIsBitIdenticalAndBytesAddUp) {
  const auto& [name, shape] = GetParam();
  torch::jit::Module m;
  Skeleton sk = load(name, &m);
  torch::manual_seed(3);
  at::Tensor x = torch::randn(shape);
  c10::IValue expected;
  {
    c10::InferenceMode guard;
    expected = m.forward({x.clone()});
  }
  c10::IValue actual = sk.forward({x.clone()});
  Comparison c = compare_outputs(expected, actual);
  EXPECT_TRUE(c.equal) << c.difference << " max_abs_diff=" << c.max_abs_diff;

  std::int64_t module_bytes = 0, module_tensors = 0;
  std::set<const void*> seen;
  for (const auto& p : m.named_parameters()) {
    if (seen.insert(p.value.unsafeGetTensorImpl()).second) { module_bytes += p.value.nbytes(); ++module_tensors; }
  }
  for (const auto& b : m.named_buffers()) {
    if (seen.insert(b.value.unsafeGetTensorImpl()).second) { module_bytes += b.value.nbytes(); ++module_tensors; }
  }
  std::int64_t layer_bytes = 0, layer_tensors = 0;
  for (const auto& L : sk.layers()) {
    layer_bytes += L.bytes;
    layer_tensors += L.tensors;
    EXPECT_LE(std::count_if(L.ops.begin(), L.ops.end(), [](const std::string&) { return true; }), 10000);
  }
  EXPECT_EQ(layer_bytes, module_bytes);
  EXPECT_EQ(layer_tensors, module_tensors);
  EXPECT_EQ(sk.total_bytes(), module_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Models, SmallModels,
    ::testing::Values(std::make_pair(std::string("synthetic"), std::vector<int64_t>{2, 3, 16, 16}),
                      std::make_pair(std::string("resnet18"), std::vector<int64_t>{1, 3, 64, 64}),
                      std::make_pair(std::string("resnet18_traced"), std::vector<int64_t>{1, 3, 64, 64}),
                      std::make_pair(std::string("mobilenet_v2"), std::vector<int64_t>{1, 3, 64, 64})),
    [](const auto& info) { return info.param.first; });

// Note [Splitting large layers]: with a small split_above, convolutions (resnet18's without bias,
// squeezenet's with) and linear layers (with bias) are computed in parts along their output channels, each part a
// layer of its own named after its rows; grouped (depthwise) convolutions stay whole. The
// outputs stay bit-identical to forward, every byte of the module is in exactly one slot, no
// part holds more than split_above (or 64 rows), and the parts of a layer follow each other.
class SplitModels : public ::testing::TestWithParam<std::pair<std::string, std::vector<int64_t>>> {};

TEST_P(SplitModels, PartsAlongOutputChannelsAreBitIdentical) {
  const auto& [name, shape] = GetParam();
  torch::jit::Module m;
  SkeletonOptions opt;
  opt.split_above = 96 << 10;
  Skeleton whole = load(name);
  Skeleton sk = Skeleton::load(model(name), &m, opt);
  ASSERT_GT(sk.split_layers(), 0) << name;
  EXPECT_EQ(sk.layers().size(), whole.layers().size() + sk.split_parts() - sk.split_layers());
  EXPECT_EQ(sk.total_bytes(), whole.total_bytes());
  // A weight (and its bias) becomes one slot per part.
  EXPECT_GE(sk.slots().size(), whole.slots().size() + static_cast<size_t>(sk.split_parts() - sk.split_layers()));
  std::int64_t bytes = 0;
  int parts = 0;
  for (const auto& s : sk.slots()) {
    bytes += s.bytes;
    if (s.name.back() != ']') continue;
    const std::int64_t row = s.sizes.size() > 1 ? s.bytes / s.sizes[0] : 0;
    if (row > 0) {
      ++parts;
      EXPECT_TRUE(s.bytes <= static_cast<std::int64_t>(opt.split_above) || s.sizes[0] <= 64) << s.name << " " << s.bytes;
    }
  }
  EXPECT_EQ(bytes, whole.total_bytes());
  EXPECT_EQ(parts, sk.split_parts());
  int named = 0;
  for (const auto& L : sk.layers()) named += !L.name.empty() && L.name.back() == ']';
  EXPECT_EQ(named, sk.split_parts());
  // load_for_pack keeps the parts that are bit-identical on this machine (oneDNN picks another
  // kernel for some shapes with 64 output channels, e.g. resnet18's layer4.0.conv1 at 64x64 on
  // one CPU) and the layers whose parts differ whole: its outputs equal forward's.
  torch::manual_seed(5);
  at::Tensor x = torch::randn(shape);
  c10::IValue expected;
  {
    c10::InferenceMode guard;
    expected = m.forward({x.clone()});
  }
  Skeleton packed = load_for_pack(model(name), {x}, opt);
  Comparison c = compare_outputs(expected, packed.forward({x.clone()}));
  EXPECT_TRUE(c.equal) << name << ": " << c.difference;
  EXPECT_GT(packed.split_layers(), 0) << name << ": most layers split in parts are bit-identical";
  for (const auto& w : packed.split_weights()) {
    EXPECT_NE(std::find(sk.split_weights().begin(), sk.split_weights().end(), w), sk.split_weights().end()) << w;
  }
  EXPECT_EQ(packed.total_bytes(), whole.total_bytes());
}

INSTANTIATE_TEST_SUITE_P(
    Models, SplitModels,
    ::testing::Values(std::make_pair(std::string("resnet18"), std::vector<int64_t>{1, 3, 64, 64}),
                      std::make_pair(std::string("mobilenet_v2"), std::vector<int64_t>{1, 3, 64, 64}),
                      std::make_pair(std::string("squeezenet1_1"), std::vector<int64_t>{1, 3, 64, 64})),
    [](const auto& info) { return info.param.first; });

// SkeletonOptions::split_part: the layers above split_above, and only those, in parts of at most
// split_part (or 64 rows); load_for_pack still gives forward's outputs (with parts of
// split_above where the smaller parts differ on this machine).
TEST(SplitModels, PartsSmallerThanTheThreshold) {
  torch::jit::Module m;
  SkeletonOptions coarse;
  coarse.split_above = 4 << 20;  // resnet18's layer4 convolutions (4.7 and 9.4 MB)
  SkeletonOptions fine = coarse;
  fine.split_part = 2 << 20;
  Skeleton c = Skeleton::load(model("resnet18"), nullptr, coarse);
  Skeleton f = Skeleton::load(model("resnet18"), &m, fine);
  EXPECT_EQ(f.split_weights(), c.split_weights());
  ASSERT_EQ(f.split_layers(), 4);
  EXPECT_GT(f.split_parts(), c.split_parts());
  for (const auto& s : f.slots()) {
    if (s.name.back() != ']' || s.sizes.size() < 2) continue;
    EXPECT_TRUE(s.bytes <= static_cast<std::int64_t>(fine.split_part) || s.sizes[0] <= 64) << s.name << " " << s.bytes;
  }
  SkeletonOptions larger = coarse;  // a part larger than the threshold is the threshold
  larger.split_part = 64 << 20;
  EXPECT_EQ(Skeleton::load(model("resnet18"), nullptr, larger).split_parts(), c.split_parts());
  torch::manual_seed(6);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  c10::IValue expected;
  {
    c10::InferenceMode guard;
    expected = m.forward({x.clone()});
  }
  for (std::uint64_t part : {std::uint64_t{2} << 20, std::uint64_t{1}}) {  // 1 byte: 64-row parts, some differ
    SkeletonOptions o = coarse;
    o.split_part = part;
    Skeleton packed = load_for_pack(model("resnet18"), {x}, o);
    Comparison cmp = compare_outputs(expected, packed.forward({x.clone()}));
    EXPECT_TRUE(cmp.equal) << part << ": " << cmp.difference;
    EXPECT_EQ(packed.total_bytes(), c.total_bytes());
  }
}

TEST(Skeleton, Resnet18HasConvSizedLayers) {
  Skeleton sk = load("resnet18");
  // 20 convolutions, 20 batch norms, 1 linear: one weighted node per layer.
  EXPECT_EQ(sk.layers().size(), 41u);
  int weighted = 0;
  for (const auto& L : sk.layers()) {
    weighted += !L.used_slots.empty();
    EXPECT_LE(L.used_slots.size(), 5u) << L.name;
  }
  EXPECT_EQ(weighted, 41);
  EXPECT_EQ(sk.layers().front().name, "conv1");
  EXPECT_EQ(sk.layers().back().name, "fc");
  // Only the input crosses into layer 0; inside a basic block the identity branch stays live
  // across the convolutions (two activations cross).
  EXPECT_EQ(sk.layers()[0].live_in.size(), 1u);
  size_t most = 0;
  for (const auto& L : sk.layers()) most = std::max(most, L.live_in.size());
  EXPECT_EQ(most, 2u);
}

TEST(Skeleton, SyntheticHandlesSharedSlotsBuffersAndControlFlow) {
  Skeleton sk = load("synthetic");
  int shared = -1;
  for (size_t i = 0; i < sk.slots().size(); ++i) {
    if (sk.slots()[i].name == "shared.weight") shared = static_cast<int>(i);
  }
  ASSERT_GE(shared, 0);
  EXPECT_EQ(sk.slots()[shared].used_by.size(), 2u) << "the loop layer and the later head both read it";
  // num_batches_tracked is read by no layer but is still owned by the batch-norm's layer.
  for (const auto& s : sk.slots()) {
    if (s.name == "bn.num_batches_tracked") {
      EXPECT_TRUE(s.used_by.empty());
      EXPECT_EQ(sk.layers()[s.layer].name, "bn");
    }
  }
  bool has_if = false, has_loop = false;
  for (const auto& L : sk.layers()) {
    for (const auto& op : L.ops) {
      has_if |= op == "prim::If";
      has_loop |= op == "prim::Loop";
    }
  }
  EXPECT_TRUE(has_if);
  EXPECT_TRUE(has_loop);
}

TEST(Skeleton, BindsByReferenceNotByCopy) {
  torch::jit::Module m;
  Skeleton sk = load("synthetic", &m);
  torch::manual_seed(5);
  at::Tensor x = torch::randn({2, 3, 16, 16});
  c10::IValue before = sk.forward({x.clone()});
  // Rebind every slot to a fresh buffer holding the same values: output unchanged, and the
  // slot is that very memory.
  std::vector<at::Tensor> copies;
  for (size_t i = 0; i < sk.slots().size(); ++i) {
    copies.push_back(sk.slot(static_cast<int>(i)).clone());
    sk.bind_slot(static_cast<int>(i), copies.back());
    EXPECT_EQ(sk.slot(static_cast<int>(i)).data_ptr(), copies.back().data_ptr());
  }
  EXPECT_TRUE(compare_outputs(before, sk.forward({x.clone()})).equal);
  // Writing to the bound memory changes what the layers compute: they read it, not a copy.
  int stem = -1;
  for (size_t i = 0; i < sk.slots().size(); ++i) {
    if (sk.slots()[i].name == "stem.weight") stem = static_cast<int>(i);
  }
  ASSERT_GE(stem, 0);
  copies[stem].zero_();
  EXPECT_FALSE(compare_outputs(before, sk.forward({x.clone()})).equal);
}

TEST(Skeleton, UnboundAndMismatchedSlotsAreClearErrors) {
  Skeleton sk = load("resnet18");
  EXPECT_NE(error_of([&] { sk.bind_slot(0, torch::zeros({3})); }).find("conv1.weight': expected Float[64,3,7,7], got Float[3]"),
            std::string::npos);
  sk.unbind_slot(0);
  std::string e = error_of([&] { sk.forward({torch::randn({1, 3, 32, 32})}); });
  EXPECT_NE(e.find("layer 0 (conv1) reads slot 0 'conv1.weight', which is not bound"), std::string::npos) << e;
}

TEST(Skeleton, RunsStepByStep) {
  Skeleton sk = load("resnet18");
  at::Tensor x = torch::randn({1, 3, 64, 64});
  c10::IValue all = sk.forward({x.clone()});
  Skeleton::Run run = sk.begin({x.clone()});
  const int half = static_cast<int>(sk.layers().size()) / 2;
  sk.run_layers(run, half);
  EXPECT_EQ(run.next_layer(), half);
  EXPECT_GT(run.live_bytes(), 0);
  EXPECT_THROW(sk.finish(run), Error);
  sk.run_layers(run, static_cast<int>(sk.layers().size()));
  EXPECT_TRUE(compare_outputs(all, sk.finish(run)).equal);
  EXPECT_THROW(sk.run_layer(run), Error);
}

TEST(Skeleton, ProfileFillsFlopsTimesAndLiveBytes) {
  Skeleton sk = load("resnet18");
  sk.profile({torch::randn({1, 3, 224, 224})}, ProfileOptions{0, 1});
  double flops = 0;
  for (const auto& L : sk.layers()) {
    flops += L.flops;
    EXPECT_GT(L.time_ms, 0) << L.name;
  }
  // resnet18 at 224x224 is 1.82 GMACs = 3.6 GFLOPs, plus elementwise work.
  EXPECT_GT(flops, 3.5e9);
  EXPECT_LT(flops, 3.8e9);
  // conv1: 64 x 112 x 112 outputs, each 3*7*7 MACs.
  EXPECT_DOUBLE_EQ(sk.layers()[0].flops, 2.0 * 64 * 112 * 112 * 3 * 7 * 7);
  EXPECT_EQ(sk.layers()[0].live_bytes, 64 * 112 * 112 * 4);
}

TEST(Skeleton, BadFilesAreRefusedByName) {
  EXPECT_NE(error_of([] { Skeleton::load(model("missing")); }).find("missing.pt: cannot open: No such file"),
            std::string::npos);
  EXPECT_NE(error_of([] { load("bad_notscript"); }).find("bad_notscript.pt: not a TorchScript module file"),
            std::string::npos);
  EXPECT_NE(error_of([] { load("bad_noforward"); }).find("bad_noforward.pt: the module has no forward method"),
            std::string::npos);
  EXPECT_NE(error_of([] { load("bad_stateful"); }).find("forward assigns attribute 'calls' (prim::SetAttr)"),
            std::string::npos);
  Skeleton sk = load("resnet18");
  EXPECT_NE(error_of([&] { sk.forward({torch::randn({1, 3, 64, 64}), torch::randn({1})}); })
                .find("forward takes 1 input(s), got 2"),
            std::string::npos);
  std::string e = error_of([&] { sk.forward({torch::randn({1, 5, 64, 64})}); });
  EXPECT_NE(e.find("layer 0 (conv1"), std::string::npos) << e;
  EXPECT_NE(e.find("to have 3 channels"), std::string::npos) << e;
}

// The image path: pack, rebuild the skeleton from the image's metadata alone, fetch the bytes
// with the block reader in several blocks, bind each block by reference, run.
TEST(SkeletonImage, PackFetchBindIsBitIdentical) {
  torch::jit::Module m;
  Skeleton sk = load("resnet18", &m);
  at::Tensor x = torch::randn({1, 3, 64, 64});
  sk.profile({x.clone()}, ProfileOptions{0, 1});
  char dir[] = "/tmp/swapnet-assembly-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/resnet18.swapnet";
  PackOptions po;
  po.input_shapes = "1,3,64,64";
  sk.pack(path, po);
  ImageInfo info;
  ASSERT_TRUE(read_image_info(path, &info).ok());
  Skeleton img = Skeleton::from_image(info, path);
  ASSERT_EQ(img.layers().size(), sk.layers().size());
  for (size_t k = 0; k < sk.layers().size(); ++k) {
    EXPECT_EQ(img.layers()[k].name, sk.layers()[k].name);
    EXPECT_EQ(img.layers()[k].slots, sk.layers()[k].slots);
    EXPECT_EQ(img.layers()[k].flops, sk.layers()[k].flops) << "profile facts travel in the image";
  }
  for (size_t s = 0; s < img.slots().size(); ++s) EXPECT_FALSE(img.slot(static_cast<int>(s)).defined());
  EXPECT_NE(error_of([&] { img.forward({x.clone()}); }).find("which is not bound"), std::string::npos);

  std::unique_ptr<BlockReader> reader;
  ASSERT_TRUE(BlockReader::open(path, ReaderOptions{}, &reader).ok());
  // Four blocks of consecutive layers, each fetched into its own buffer.
  const int n = static_cast<int>(info.layers.size());
  std::vector<void*> buffers;
  for (int first = 0; first < n; first += (n + 3) / 4) {
    int last = std::min(n, first + (n + 3) / 4) - 1;
    std::uint64_t off = info.layers[first].offset;
    std::uint64_t len = info.layers[last].offset + info.layers[last].size - off;
    void* buf = alloc_aligned(len);
    buffers.push_back(buf);
    ASSERT_TRUE(reader->read(off, len, buf).ok());
    img.bind_layers(first, last, buf, off);
    EXPECT_EQ(img.slot(img.layers()[first].slots.empty() ? 0 : img.layers()[first].slots[0]).data_ptr(),
              img.layers()[first].slots.empty() ? img.slot(0).data_ptr()
                                                : static_cast<void*>(static_cast<char*>(buf) +
                                                                     (info.tensors[img.layers()[first].slots[0]].offset - off)))
        << "bound in place, not copied";
  }
  c10::IValue expected;
  {
    c10::InferenceMode guard;
    expected = m.forward({x.clone()});
  }
  Comparison c = compare_outputs(expected, img.forward({x.clone()}));
  EXPECT_TRUE(c.equal) << c.difference;
  img.unbind_layers(0, n - 1);
  for (void* b : buffers) free_aligned(b);
  EXPECT_NE(error_of([&] { sk.bind_layers(0, 0, nullptr, 0); }).find("needs a skeleton made by from_image"),
            std::string::npos);
  std::remove(path.c_str());
  ::rmdir(dir);
}

TEST(Compare, FindsTheFirstDifference) {
  at::Tensor a = torch::ones({2, 2});
  at::Tensor b = a.clone();
  b[1][1] = 1.5;
  Comparison c = compare_outputs(c10::ivalue::Tuple::create({a, a}), c10::ivalue::Tuple::create({a, b}));
  EXPECT_FALSE(c.equal);
  EXPECT_EQ(c.difference, "output[1]: values differ");
  EXPECT_DOUBLE_EQ(c.max_abs_diff, 0.5);
  c = compare_outputs(a, torch::ones({2, 3}));
  EXPECT_FALSE(c.equal);
  EXPECT_EQ(c.difference, "output: shape [2,2] vs [2,3]");
  // -0.0 and 0.0 compare equal as numbers but are different bits.
  c = compare_outputs(torch::zeros({1}), -torch::zeros({1}));
  EXPECT_FALSE(c.equal);
  c10::impl::GenericDict d1(c10::StringType::get(), c10::TensorType::get());
  c10::impl::GenericDict d2(c10::StringType::get(), c10::TensorType::get());
  d1.insert("x", a);
  d2.insert("y", a);
  c = compare_outputs(d1, d2);
  EXPECT_EQ(c.difference, "output: key 'x' missing");
  EXPECT_TRUE(compare_outputs(c10::ivalue::Tuple::create({a, d1}), c10::ivalue::Tuple::create({a.clone(), d1})).equal);
}

TEST(ParseShape, ReadsAndRefuses) {
  EXPECT_EQ(parse_shape("1,3,224,224"), (std::vector<int64_t>{1, 3, 224, 224}));
  EXPECT_NE(error_of([] { parse_shape("1,,3"); }).find("'' is not a non-negative integer"), std::string::npos);
  EXPECT_EQ(parse_shape("8,1,0,64"), (std::vector<int64_t>{8, 1, 0, 64})) << "zero-size dimensions";
  EXPECT_NE(error_of([] { parse_shape("-1"); }).find("'-1' is not a non-negative integer"), std::string::npos);
}

// Input specs (Note [Input specs]): dtypes, shapes (zero-size, 0-dim), integer ranges, None, the
// float shorthand drawing what --input-shape always drew, one seed naming one input, errors.
// Input profiles (Note [Dynamic shapes] in input_meter.cpp): what covers what.
TEST(InputProfiles, CoverSmallerInputsOfTheSameKind) {
  std::vector<c10::IValue> big{at::zeros({1, 16}, at::kLong), c10::IValue(), at::zeros({8, 1, 8, 32, 64})};
  const std::vector<ImageInput> measured = describe_inputs(big);
  EXPECT_EQ(inputs_text(measured), "int64[1,16] none float32[8,1,8,32,64]");
  auto cov = [&](std::vector<c10::IValue> in) { return covers(measured, describe_inputs(in)); };
  EXPECT_TRUE(cov({at::zeros({1, 4}, at::kLong), c10::IValue(), at::zeros({8, 1, 8, 0, 64})}));  // an empty cache
  EXPECT_TRUE(cov(big));
  EXPECT_FALSE(cov({at::zeros({1, 17}, at::kLong), c10::IValue(), at::zeros({8, 1, 8, 0, 64})})) << "longer";
  EXPECT_FALSE(cov({at::zeros({1, 4}, at::kInt), c10::IValue(), at::zeros({8, 1, 8, 0, 64})})) << "dtype";
  EXPECT_FALSE(cov({at::zeros({1, 4}, at::kLong), at::zeros({1}), at::zeros({8, 1, 8, 0, 64})})) << "None vs tensor";
  EXPECT_FALSE(cov({at::zeros({4}, at::kLong), c10::IValue(), at::zeros({8, 1, 8, 0, 64})})) << "rank";
  EXPECT_FALSE(cov({at::zeros({1, 4}, at::kLong), c10::IValue()})) << "fewer arguments";
  // Lists by length and elements; other values by equality.
  c10::List<at::Tensor> two({at::zeros({2, 3}), at::zeros({4})});
  c10::List<at::Tensor> three({at::zeros({2, 3}), at::zeros({4}), at::zeros({4})});
  const std::vector<ImageInput> listed = describe_inputs({two, c10::IValue(int64_t{5})});
  EXPECT_TRUE(covers(listed, describe_inputs({c10::List<at::Tensor>({at::zeros({1, 3}), at::zeros({4})}), c10::IValue(int64_t{5})})));
  EXPECT_FALSE(covers(listed, describe_inputs({three, c10::IValue(int64_t{5})})));
  EXPECT_FALSE(covers(listed, describe_inputs({two, c10::IValue(int64_t{6})})));
  // Images packed before profiles: float shapes only.
  EXPECT_EQ(inputs_text(legacy_input_profile("1,3,8,8 2,0")), "float32[1,3,8,8] float32[2,0]");
  EXPECT_TRUE(legacy_input_profile("int64[1,4]:0..9").empty());
  EXPECT_TRUE(legacy_input_profile("1,3 None").empty());
}

TEST(InputSpecs, MakeWhatTheSpecsSay) {
  auto in = make_inputs({"int64[2,16]:5..9", "none", "bool[3]", "float16[2,0,4]", "int32[]", "uint8[4]:250..256",
                         "bfloat16[1,2]", "float64[2]"},
                        7);
  ASSERT_EQ(in.size(), 8u);
  const at::Tensor ids = in[0].toTensor();
  EXPECT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_EQ(ids.sizes(), (std::vector<int64_t>{2, 16}));
  EXPECT_GE(ids.min().item<int64_t>(), 5);
  EXPECT_LE(ids.max().item<int64_t>(), 8) << "HI is excluded";
  EXPECT_TRUE(in[1].isNone());
  EXPECT_EQ(in[2].toTensor().scalar_type(), at::kBool);
  EXPECT_EQ(in[3].toTensor().scalar_type(), at::kHalf);
  EXPECT_EQ(in[3].toTensor().numel(), 0);
  EXPECT_EQ(in[4].toTensor().dim(), 0);
  EXPECT_GE(in[5].toTensor().min().item<int>(), 250);
  EXPECT_EQ(in[6].toTensor().scalar_type(), at::kBFloat16);
  EXPECT_EQ(in[7].toTensor().scalar_type(), at::kDouble);
  // Same specs and seed: the same values; the shorthand is torch::randn after seeding.
  EXPECT_TRUE(make_inputs({"int64[2,16]:5..9"}, 7)[0].toTensor().equal(ids));
  EXPECT_FALSE(make_inputs({"int64[2,16]:0..1000"}, 8)[0].toTensor().equal(make_inputs({"int64[2,16]:0..1000"}, 7)[0].toTensor()));
  torch::manual_seed(3);
  const at::Tensor a = torch::randn({1, 3, 4});
  EXPECT_TRUE(make_inputs({"1,3,4"}, 3)[0].toTensor().equal(a));
  EXPECT_TRUE(make_inputs({"float32[1,3,4]"}, 3)[0].toTensor().equal(a));
  // clone_inputs: tensors copied, None kept.
  auto copy = clone_inputs(in);
  EXPECT_TRUE(copy[1].isNone());
  EXPECT_NE(copy[0].toTensor().data_ptr(), ids.data_ptr());
  EXPECT_TRUE(copy[0].toTensor().equal(ids));
  for (const auto& [spec, says] : std::vector<std::pair<std::string, std::string>>{
           {"int65[2]", "dtype 'int65' is not one of"},
           {"float32[2]:0..5", "a range is for integer and bool dtypes"},
           {"bool[2]:0..3", "a bool range lies within 0..2"},
           {"int64[2]:5..5", "is empty"},
           {"int64[2]:x..5", "'x' is not an integer"},
           {"int64[2]5..9", "is not a range :LO..HI"},
           {"int64[2", "no ']'"},
           {"@/nonexistent/file.pt", "cannot open"}}) {
    const std::string e = error_of([&] { make_inputs({spec}, 0); });
    EXPECT_NE(e.find("input '" + spec + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(says), std::string::npos) << spec << ": " << e;
  }
}

}  // namespace
}  // namespace swapnet
