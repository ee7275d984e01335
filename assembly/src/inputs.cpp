// Example inputs from text specs (make_inputs in assembly.h): the CLI's --input / --input-shape,
// scenario files and the spec an image records.
//
// Note [Input specs]
// ~~~~~~~~~~~~~~~~~~
// One spec per forward argument. A bare shape ("1,3,224,224") is a float32 tensor drawn from a
// normal distribution, as --input-shape always meant (same seed, same values as before typed
// specs existed). "DTYPE[SHAPE]" names the dtype; integers are drawn uniformly from [LO, HI)
// (":LO..HI", default 0..10, e.g. token ids "int64[1,16]:0..8000"), bool from {0, 1} (":0..1"
// all false, ":1..2" all true). "none" is
// None for an optional argument; "@FILE" a tensor (or any value) saved with torch.save, or a
// NumPy .npy array. Zero-size dimensions are allowed (an empty KV cache: "float32[8,1,8,0,64]");
// "DTYPE[]" is a 0-dim tensor. Values are drawn in argument order from one generator seeded
// once, so a spec list and a seed name one input exactly.
#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "swapnet/assembly.h"
#include "text.h"

namespace swapnet {
namespace {

struct DType {
  const char* name;
  at::ScalarType type;
};
constexpr DType kDTypes[] = {
    {"float32", at::kFloat}, {"float", at::kFloat},     {"float64", at::kDouble}, {"double", at::kDouble},
    {"float16", at::kHalf},  {"half", at::kHalf},       {"bfloat16", at::kBFloat16}, {"int64", at::kLong},
    {"long", at::kLong},     {"int32", at::kInt},       {"int", at::kInt},        {"int16", at::kShort},
    {"int8", at::kChar},     {"uint8", at::kByte},      {"bool", at::kBool},
};

std::string dtype_names() {
  std::string all;
  for (const auto& d : kDTypes) all += std::string(all.empty() ? "" : "|") + d.name;
  return all;
}

std::vector<char> read_file(const std::string& spec, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("input '" + spec + "': cannot open '" + path + "': " + std::strerror(errno));
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A NumPy .npy array (format 1.x-3.x, C order, little-endian or single-byte dtypes).
at::Tensor load_npy(const std::string& spec, const std::string& path, const std::vector<char>& b) {
  auto bad = [&](const std::string& why) { return Error("input '" + spec + "': '" + path + "' is not a .npy array we read: " + why); };
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0) throw bad("no NumPy magic");
  const int major = static_cast<unsigned char>(b[6]);
  size_t hlen = 0, at = 0;
  if (major == 1) {
    hlen = static_cast<unsigned char>(b[8]) | (static_cast<size_t>(static_cast<unsigned char>(b[9])) << 8);
    at = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) throw bad("truncated header");
    for (int i = 0; i < 4; ++i) hlen |= static_cast<size_t>(static_cast<unsigned char>(b[8 + i])) << (8 * i);
    at = 12;
  } else {
    throw bad("format version " + std::to_string(major));
  }
  if (at + hlen > b.size()) throw bad("truncated header");
  const std::string h(b.data() + at, hlen);
  auto field = [&](const std::string& key) {
    const size_t k = h.find("'" + key + "'");
    if (k == std::string::npos) throw bad("no '" + key + "' in the header");
    size_t v = h.find(':', k);
    if (v == std::string::npos) throw bad("malformed header");
    ++v;
    while (v < h.size() && h[v] == ' ') ++v;
    return v;
  };
  size_t v = field("descr");
  const char q = h[v];
  const size_t e = h.find(q, v + 1);
  if ((q != '\'' && q != '"') || e == std::string::npos) throw bad("malformed descr");
  const std::string descr = h.substr(v + 1, e - v - 1);
  static const std::pair<const char*, at::ScalarType> kDescr[] = {
      {"<f4", at::kFloat}, {"<f8", at::kDouble}, {"<f2", at::kHalf}, {"<i8", at::kLong}, {"<i4", at::kInt},
      {"<i2", at::kShort}, {"|i1", at::kChar},   {"|u1", at::kByte}, {"|b1", at::kBool}};
  at::ScalarType type = at::kFloat;
  bool known = false;
  for (const auto& [d, t] : kDescr) {
    if (descr == d) type = t, known = true;
  }
  if (!known) throw bad("dtype '" + descr + "' (little-endian float16/32/64, int8/16/32/64, uint8, bool)");
  v = field("fortran_order");
  if (h.compare(v, 4, "True") == 0) throw bad("Fortran order (save it with np.ascontiguousarray)");
  v = field("shape");
  if (h[v] != '(') throw bad("malformed shape");
  const size_t close = h.find(')', v);
  if (close == std::string::npos) throw bad("malformed shape");
  std::vector<std::int64_t> shape;
  std::string dims = h.substr(v + 1, close - v - 1);
  size_t p = 0;
  while (p < dims.size()) {
    while (p < dims.size() && (dims[p] == ' ' || dims[p] == ',')) ++p;
    if (p >= dims.size()) break;
    size_t end = p;
    while (end < dims.size() && std::isdigit(static_cast<unsigned char>(dims[end]))) ++end;
    if (end == p) throw bad("malformed shape '" + dims + "'");
    shape.push_back(std::stoll(dims.substr(p, end - p)));
    p = end;
  }
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  const size_t need = static_cast<size_t>(t.numel()) * t.element_size();
  const size_t data = at + hlen;
  if (b.size() - data < need) {
    throw bad("holds " + std::to_string(b.size() - data) + " data bytes, its shape needs " + std::to_string(need));
  }
  if (need > 0) std::memcpy(t.data_ptr(), b.data() + data, need);
  return t;
}

std::int64_t parse_int(const std::string& spec, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) {
    throw Error("input '" + spec + "': '" + text + "' is not an integer (a range is written :LO..HI, e.g. :0..8000)");
  }
  return v;
}

c10::IValue make_input(const std::string& spec) {
  if (spec == "none") return c10::IValue();
  if (!spec.empty() && spec[0] == '@') {
    const std::string path = spec.substr(1);
    const std::vector<char> b = read_file(spec, path);
    if (b.size() >= 6 && std::memcmp(b.data(), "\x93NUMPY", 6) == 0) return load_npy(spec, path, b);
    try {
      return torch::jit::pickle_load(b);
    } catch (const std::exception& e) {
      throw Error("input '" + spec + "': '" + path + "' is neither a .npy array nor a file torch.save wrote (" +
                  detail::torch_message(e) + ")");
    }
  }
  const size_t open = spec.find('[');
  if (open == std::string::npos) return at::randn(parse_shape(spec));  // the float shorthand
  const size_t close = spec.find(']', open);
  if (close == std::string::npos) throw Error("input '" + spec + "': no ']' (expected e.g. int64[1,16])");
  const std::string name = spec.substr(0, open);
  at::ScalarType type = at::kFloat;
  bool known = false;
  for (const auto& d : kDTypes) {
    if (name == d.name) type = d.type, known = true;
  }
  if (!known) throw Error("input '" + spec + "': dtype '" + name + "' is not one of " + dtype_names());
  const std::string dims = spec.substr(open + 1, close - open - 1);
  std::vector<std::int64_t> shape;
  try {
    if (!dims.empty()) shape = parse_shape(dims);
  } catch (const Error& e) {
    throw Error("input '" + spec + "': " + e.what());
  }
  std::string rest = spec.substr(close + 1);
  std::int64_t lo = 0, hi = 10;
  const bool integral = at::isIntegralType(type, /*includeBool=*/false);
  if (!rest.empty()) {
    const size_t dots = rest.find("..");
    if (rest[0] != ':' || dots == std::string::npos) {
      throw Error("input '" + spec + "': '" + rest + "' after the shape is not a range :LO..HI");
    }
    if (!integral && type != at::kBool) {
      throw Error("input '" + spec + "': a range is for integer and bool dtypes (" + name +
                  " is drawn from a normal distribution)");
    }
    lo = parse_int(spec, rest.substr(1, dots - 1));
    hi = parse_int(spec, rest.substr(dots + 2));
    if (type == at::kBool && (lo < 0 || hi > 2)) {
      throw Error("input '" + spec + "': a bool range lies within 0..2 (0..1: all false, 1..2: all true)");
    }
    if (hi <= lo) {
      throw Error("input '" + spec + "': range " + std::to_string(lo) + ".." + std::to_string(hi) +
                  " is empty (HI is excluded and must exceed LO)");
    }
  }
  const auto opts = at::TensorOptions().dtype(type);
  if (type == at::kBool) {
    return at::randint(rest.empty() ? 0 : lo, rest.empty() ? 2 : hi, shape, at::TensorOptions().dtype(at::kLong)).to(at::kBool);
  }
  if (integral) return at::randint(lo, hi, shape, opts);
  return at::randn(shape, at::TensorOptions().dtype(at::kFloat)).to(type);
}

}  // namespace

std::vector<c10::IValue> make_inputs(const std::vector<std::string>& specs, std::uint64_t seed) {
  at::manual_seed(seed);
  std::vector<c10::IValue> in;
  for (const auto& s : specs) in.push_back(make_input(s));
  return in;
}

// ---- input profiles ------------------------------------------------------------------------

namespace {

void describe(const c10::IValue& v, std::vector<ImageInput>* out) {
  ImageInput e;
  if (v.isTensor() && v.toTensor().defined()) {
    const at::Tensor& t = v.toTensor();
    e.kind = ImageInput::kTensor;
    e.dtype = static_cast<std::uint8_t>(t.scalar_type());
    e.sizes = t.sizes().vec();
    out->push_back(std::move(e));
  } else if (v.isNone() || v.isTensor()) {
    e.kind = ImageInput::kNone;
    out->push_back(std::move(e));
  } else if (v.isList() || v.isTuple()) {
    const std::vector<c10::IValue> items = v.isList() ? v.toListRef().vec() : v.toTupleRef().elements().vec();
    e.kind = ImageInput::kSequence;
    e.sizes = {static_cast<std::int64_t>(items.size())};
    out->push_back(std::move(e));
    for (const auto& x : items) describe(x, out);
  } else if (v.isGenericDict()) {
    e.kind = ImageInput::kSequence;
    std::vector<c10::IValue> values;
    for (const auto& kv : v.toGenericDict()) {
      std::ostringstream k;
      k << kv.key();
      e.text += (e.text.empty() ? "" : ",") + k.str();
      values.push_back(kv.value());
    }
    e.sizes = {static_cast<std::int64_t>(values.size())};
    out->push_back(std::move(e));
    for (const auto& x : values) describe(x, out);
  } else {
    std::ostringstream os;
    os << v;
    e.kind = ImageInput::kValue;
    e.text = os.str();
    out->push_back(std::move(e));
  }
}

std::string dtype_name(std::uint8_t code) {
  for (const auto& d : kDTypes) {
    if (static_cast<std::uint8_t>(d.type) == code) return d.name;
  }
  return "dtype" + std::to_string(code);
}

}  // namespace

std::vector<ImageInput> describe_inputs(const std::vector<c10::IValue>& inputs) {
  std::vector<ImageInput> out;
  for (const auto& v : inputs) describe(v, &out);
  return out;
}

bool covers(const std::vector<ImageInput>& measured, const std::vector<ImageInput>& inputs) {
  if (measured.size() != inputs.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ImageInput& m = measured[i];
    const ImageInput& x = inputs[i];
    if (m.kind != x.kind || m.text != x.text || m.sizes.size() != x.sizes.size()) return false;
    if (m.kind == ImageInput::kTensor && m.dtype != x.dtype) return false;
    for (size_t d = 0; d < x.sizes.size(); ++d) {
      if (m.kind == ImageInput::kSequence ? x.sizes[d] != m.sizes[d] : x.sizes[d] > m.sizes[d]) return false;
    }
  }
  return true;
}

std::string inputs_text(const std::vector<ImageInput>& inputs) {
  std::string out;
  for (const auto& v : inputs) {
    if (!out.empty()) out += ' ';
    switch (v.kind) {
      case ImageInput::kTensor: {
        out += dtype_name(v.dtype) + "[";
        for (size_t d = 0; d < v.sizes.size(); ++d) out += (d ? "," : "") + std::to_string(v.sizes[d]);
        out += "]";
        break;
      }
      case ImageInput::kNone: out += "none"; break;
      case ImageInput::kSequence: out += "seq" + std::to_string(v.sizes.empty() ? 0 : v.sizes[0]) + ":"; break;
      default: out += v.text;
    }
  }
  return out;
}

std::vector<ImageInput> legacy_input_profile(const std::string& input_shapes) {
  std::vector<ImageInput> out;
  std::istringstream words(input_shapes);
  std::string w;
  while (words >> w) {
    if (w.find_first_not_of("0123456789,") != std::string::npos) return {};
    ImageInput e;
    e.dtype = static_cast<std::uint8_t>(at::kFloat);
    try {
      e.sizes = parse_shape(w);
    } catch (const Error&) {
      return {};
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<c10::IValue> clone_inputs(const std::vector<c10::IValue>& in) {
  std::vector<c10::IValue> out;
  for (const auto& v : in) out.push_back(v.isTensor() ? c10::IValue(v.toTensor().clone()) : v.deepcopy());
  return out;
}

}  // namespace swapnet
