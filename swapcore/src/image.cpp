// The swap image: one file per model, from which any block is one aligned read. Its format and
// parser are here; the writer is image_write.cpp, the constants both use image_format.h.
//
// Note [Swap image format]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// All integers little-endian. Offsets are absolute file offsets.
//
//   [0, 4096)            header (fixed layout below, zero padded)
//   [4096, 4096+M)       metadata, M = meta_size bytes
//   [data_offset, EOF)   parameter data: layer 0, layer 1, ... each starting on a 4 KiB
//                        boundary and padded with zeros to the next one
//
// Header: magic "SWAPNET\0" (8) | u32 version = 5 | u32 header_bytes = 4096 | u64 alignment =
// 4096 | u64 file_size | u64 meta_offset = 4096 | u64 meta_size | u64 meta_checksum | u64
// data_offset | u64 data_size | u32 num_layers | u32 num_tensors | zeros ... | u64
// header_checksum at byte 4088 = XXH3-64 of bytes [0, 4088).
//
// Metadata: str source | str input_shapes | u32 num_inputs | u64 activation_bytes |
// num_layers x layer | num_tensors x
// tensor | blob skeleton, where str = u32 length + bytes, blob = u64 length + bytes,
//   layer  = str name | str ops | u64 offset | u64 size | u64 data_bytes | u32 first_tensor |
//            u32 num_tensors | u64 checksum | f64 flops | f64 time_ms | u64 live_bytes |
//            u64 peak_bytes (version 3 on; version 2 images are still read, peak_bytes 0)
//   tensor = str name | u8 kind | u8 dtype | u8 element_size | u8 ndim | ndim x i64 size |
//            ndim x i64 stride | u64 offset | u64 nbytes | u32 layer
// and, from version 4 on, after the skeleton: u32 num_profiles | num_profiles x profile, where
//   profile = u64 activation_bytes | u32 num_values | num_values x (u8 kind | u8 dtype | u8 ndim |
//             ndim x i64 size | str text)   (ImageInput, InputProfile)
// Version 5 has version 4's layout; its activation figures are measured as a zone places them
// (kImageZoneReserveVersion), version 4's as the bytes live at once.
//
// A tensor's bytes are the span its strides reach (not a contiguous copy), so a weight with
// unusual strides is rebound exactly as it was. Tensors start on 64-byte boundaries.
//
// Parsing trusts nothing: counts are bounded by the bytes that could hold them before anything
// is allocated, every offset and size is checked against the file and its layer, and layers
// must tile the data section in order. The parser is fuzzed (tests/fuzz_image.cpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "image_format.h"
#include "swapnet/swapcore.h"
#include "u64s.h"

namespace swapnet {
using namespace detail;  // image_format.h: the constants the writer shares
namespace {

constexpr std::uint64_t kMaxMetaBytes = 256ull << 20;  // tables + skeleton; real ones are < 1 MiB
constexpr unsigned kMaxDims = 16;
constexpr std::size_t kMinLayerEntry = 4 + 4 + 8 * 3 + 4 * 2 + 8 + 8 + 8 + 8;
constexpr std::size_t kMinTensorEntry = 4 + 4 + 8 + 8 + 4;

class Reader {
 public:
  Reader(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  bool u8(std::uint8_t* v) { return raw(v, 1); }
  bool u32(std::uint32_t* v) { return raw(v, 4); }
  bool u64(std::uint64_t* v) { return raw(v, 8); }
  bool i64(std::int64_t* v) { return raw(v, 8); }
  bool f64(double* v) { return raw(v, 8); }
  bool str(std::string* s) {
    std::uint32_t len = 0;
    if (!u32(&len) || len > n_ - pos_) return false;
    s->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return true;
  }
  bool blob(std::string* s) {
    std::uint64_t len = 0;
    if (!u64(&len) || len > n_ - pos_) return false;
    s->assign(reinterpret_cast<const char*>(p_ + pos_), static_cast<std::size_t>(len));
    pos_ += static_cast<std::size_t>(len);
    return true;
  }
  bool raw(void* v, std::size_t k) {
    if (k > n_ - pos_) return false;
    std::memcpy(v, p_ + pos_, k);
    pos_ += k;
    return true;
  }
  std::size_t remaining() const { return n_ - pos_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

// A parse error names the image: "<origin>: <what>".
struct Bad {
  const std::string& origin;
  Status operator()(const std::string& what) const { return Status::error(-1, origin + ": " + what); }
};

// The header's fields, as stored.
struct Header {
  std::uint32_t version = 0, hbytes = 0, num_layers = 0, num_tensors = 0;
  std::uint64_t align = 0, fsize = 0, meta_off = 0, meta_size = 0, meta_sum = 0, data_off = 0, data_size = 0;
};

// The header: its size, magic, fields, version and checksum, in that order.
Status read_header(const std::uint8_t* data, std::size_t size, std::uint64_t file_size, const Bad& bad, Header* h) {
  if (file_size < size) return bad("internal: " + u64s(size) + " bytes given for a file of " + u64s(file_size));
  if (size < kHeaderBytes) {
    return bad("truncated: " + u64s(size) + " bytes, smaller than the " + u64s(kHeaderBytes) + "-byte header");
  }
  if (std::memcmp(data, kMagic, 8) != 0) return bad("not a swapnet image (bad magic)");
  Reader hr(data + 8, kHeaderBytes - 8);
  hr.u32(&h->version);
  hr.u32(&h->hbytes);
  hr.u64(&h->align);
  hr.u64(&h->fsize);
  hr.u64(&h->meta_off);
  hr.u64(&h->meta_size);
  hr.u64(&h->meta_sum);
  hr.u64(&h->data_off);
  hr.u64(&h->data_size);
  hr.u32(&h->num_layers);
  hr.u32(&h->num_tensors);
  if (h->version < kOldestVersion || h->version > kVersion) {
    return bad("format version " + std::to_string(h->version) + " is not supported (this build reads versions " +
               std::to_string(kOldestVersion) + " to " + std::to_string(kVersion) + "; re-pack the model)");
  }
  std::uint64_t stored = 0;
  std::memcpy(&stored, data + kHeaderChecksumAt, 8);
  if (XXH3_64bits(data, kHeaderChecksumAt) != stored) return bad("header checksum mismatch (corrupt header)");
  return Status();
}

// The sections the header describes, against the file and the bytes given: header fields, file
// size, metadata size, data section, then the metadata's checksum and the counts it must hold.
Status check_sections(const std::uint8_t* data, std::size_t size, std::uint64_t file_size, const Header& h,
                      const Bad& bad) {
  const std::uint64_t fsize = h.fsize, meta_size = h.meta_size, data_off = h.data_off;
  if (h.hbytes != kHeaderBytes || h.align != kImageAlign || h.meta_off != kHeaderBytes) {
    return bad("header fields out of range (header_bytes " + std::to_string(h.hbytes) + ", alignment " +
               u64s(h.align) + ", meta_offset " + u64s(h.meta_off) + ")");
  }
  if (fsize != file_size) {
    return bad((file_size < fsize ? "truncated: file is " : "file is ") + u64s(file_size) +
               " bytes, header says " + u64s(fsize));
  }
  if (meta_size > kMaxMetaBytes || meta_size > fsize - kHeaderBytes) {
    return bad("metadata size " + u64s(meta_size) + " exceeds the file or the limit of " + u64s(kMaxMetaBytes));
  }
  if (data_off % kImageAlign != 0 || data_off < kHeaderBytes + meta_size || data_off > fsize ||
      h.data_size != fsize - data_off) {
    return bad("data section [" + u64s(data_off) + ", +" + u64s(h.data_size) + ") does not fit the file of " +
               u64s(fsize) + " bytes");
  }
  if (size < kHeaderBytes + meta_size) {
    return bad("truncated: metadata needs " + u64s(kHeaderBytes + meta_size) + " bytes, have " + u64s(size));
  }
  if (XXH3_64bits(data + kHeaderBytes, meta_size) != h.meta_sum) {
    return bad("metadata checksum mismatch (corrupt tables)");
  }
  if (h.num_layers > meta_size / kMinLayerEntry || h.num_tensors > meta_size / kMinTensorEntry) {
    return bad("counts out of range: " + std::to_string(h.num_layers) + " layers, " + std::to_string(h.num_tensors) +
               " tensors in " + u64s(meta_size) + " bytes of metadata");
  }
  return Status();
}

// The layer table: each layer the next aligned range of the data section and the next run of
// tensors, together tiling both.
Status read_layers(Reader& r, const Header& h, const Bad& bad, std::vector<ImageLayer>* layers) {
  const std::uint64_t fsize = h.fsize;
  const std::uint32_t num_layers = h.num_layers, num_tensors = h.num_tensors;
  layers->resize(num_layers);
  std::uint64_t expect_off = h.data_off;
  std::uint32_t expect_tensor = 0;
  for (std::uint32_t i = 0; i < num_layers; ++i) {
    ImageLayer& L = (*layers)[i];
    if (!r.str(&L.name) || !r.str(&L.ops) || !r.u64(&L.offset) || !r.u64(&L.size) || !r.u64(&L.data_bytes) ||
        !r.u32(&L.first_tensor) || !r.u32(&L.num_tensors) || !r.u64(&L.checksum) || !r.f64(&L.flops) ||
        !r.f64(&L.time_ms) || !r.u64(&L.live_bytes) || (h.version >= 3 && !r.u64(&L.peak_bytes))) {
      return bad("metadata truncated in layer " + std::to_string(i));
    }
    std::string where = "layer " + std::to_string(i) + " (" + L.name + ")";
    if (L.offset != expect_off || L.size % kImageAlign != 0 || L.size > fsize - L.offset ||
        L.data_bytes > L.size) {
      return bad(where + ": range [" + u64s(L.offset) + ", +" + u64s(L.size) + ") is not the next aligned range " +
                 "of the data section (expected offset " + u64s(expect_off) + ", file " + u64s(fsize) + " bytes)");
    }
    if (L.first_tensor != expect_tensor || L.num_tensors > num_tensors - L.first_tensor) {
      return bad(where + ": tensors [" + std::to_string(L.first_tensor) + ", +" + std::to_string(L.num_tensors) +
                 ") do not follow the previous layer's within " + std::to_string(num_tensors) + " tensors");
    }
    expect_off = L.offset + L.size;
    expect_tensor = L.first_tensor + L.num_tensors;
  }
  if (expect_off != fsize || expect_tensor != num_tensors) {
    return bad("layers end at offset " + u64s(expect_off) + " and tensor " + std::to_string(expect_tensor) +
               ", but the file has " + u64s(fsize) + " bytes and " + std::to_string(num_tensors) + " tensors");
  }
  return Status();
}

// Tensor i: its kind and element size, a span its sizes and strides reach, inside the data of the
// layer that lists it.
Status read_tensor(Reader& r, std::uint32_t i, const std::vector<ImageLayer>& layers, const Bad& bad,
                   ImageTensor* tensor) {
  const std::uint32_t num_layers = static_cast<std::uint32_t>(layers.size());
  ImageTensor& t = *tensor;
  std::uint8_t ndim = 0;
  if (!r.str(&t.name) || !r.u8(&t.kind) || !r.u8(&t.dtype) || !r.u8(&t.element_size) || !r.u8(&ndim)) {
    return bad("metadata truncated in tensor " + std::to_string(i));
  }
  std::string where = "tensor " + std::to_string(i) + " (" + t.name + ")";
  if (ndim > kMaxDims) return bad(where + ": " + std::to_string(ndim) + " dimensions, limit " + std::to_string(kMaxDims));
  if (t.kind > 2 || (t.element_size != 1 && t.element_size != 2 && t.element_size != 4 && t.element_size != 8 &&
                     t.element_size != 16)) {
    return bad(where + ": kind " + std::to_string(t.kind) + " / element size " + std::to_string(t.element_size) +
               " out of range");
  }
  t.sizes.resize(ndim);
  t.strides.resize(ndim);
  for (auto& s : t.sizes) {
    if (!r.i64(&s)) return bad("metadata truncated in " + where);
  }
  for (auto& s : t.strides) {
    if (!r.i64(&s)) return bad("metadata truncated in " + where);
  }
  if (!r.u64(&t.offset) || !r.u64(&t.nbytes) || !r.u32(&t.layer)) return bad("metadata truncated in " + where);
  std::uint64_t span = 0;
  if (!span_bytes(t.sizes, t.strides, t.element_size, &span) || span != t.nbytes) {
    return bad(where + ": " + u64s(t.nbytes) + " bytes do not match its sizes and strides");
  }
  if (t.layer >= num_layers || i < layers[t.layer].first_tensor ||
      i >= layers[t.layer].first_tensor + layers[t.layer].num_tensors) {
    return bad(where + ": owning layer " + std::to_string(t.layer) + " does not list it");
  }
  const ImageLayer& L = layers[t.layer];
  if (t.offset < L.offset || t.offset % kTensorAlign != 0 || t.nbytes > L.data_bytes ||
      t.offset - L.offset > L.data_bytes - t.nbytes) {
    return bad(where + ": bytes [" + u64s(t.offset) + ", +" + u64s(t.nbytes) + ") lie outside layer " +
               std::to_string(t.layer) + "'s data [" + u64s(L.offset) + ", +" + u64s(L.data_bytes) + ")");
  }
  return Status();
}

// The input profiles (version 4 on), each count bounded by the bytes left before it is allocated.
Status read_profiles(Reader& r, const Bad& bad, std::vector<InputProfile>* profiles) {
  std::uint32_t np = 0;
  // A profile takes at least 12 bytes, a value at least 7.
  if (!r.u32(&np) || np > r.remaining() / 12) return bad("metadata truncated in the input profiles");
  profiles->resize(np);
  for (std::uint32_t i = 0; i < np; ++i) {
    InputProfile& p = (*profiles)[i];
    std::uint32_t nv = 0;
    if (!r.u64(&p.activation_bytes) || !r.u32(&nv) || nv > r.remaining() / 7) {
      return bad("metadata truncated in input profile " + std::to_string(i));
    }
    p.inputs.resize(nv);
    for (auto& v : p.inputs) {
      std::uint8_t ndim = 0;
      if (!r.u8(&v.kind) || !r.u8(&v.dtype) || !r.u8(&ndim)) return bad("metadata truncated in input profile " + std::to_string(i));
      if (v.kind > ImageInput::kValue || ndim > kMaxDims) {
        return bad("input profile " + std::to_string(i) + ": value kind " + std::to_string(v.kind) + " or " +
                   std::to_string(ndim) + " dimensions out of range");
      }
      v.sizes.resize(ndim);
      for (auto& d : v.sizes) {
        if (!r.i64(&d)) return bad("metadata truncated in input profile " + std::to_string(i));
        if (d < 0) return bad("input profile " + std::to_string(i) + ": negative size " + std::to_string(d));
      }
      if (!r.str(&v.text)) return bad("metadata truncated in input profile " + std::to_string(i));
    }
  }
  return Status();
}

}  // namespace

namespace detail {

// Bytes a strided tensor spans, or false on overflow / negative values.
bool span_bytes(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& strides,
                std::uint64_t element_size, std::uint64_t* out) {
  std::uint64_t last = 0;  // index of the last element
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0 || strides[d] < 0) return false;
    if (sizes[d] == 0) {
      *out = 0;
      return true;
    }
    std::uint64_t step = 0;
    if (__builtin_mul_overflow(static_cast<std::uint64_t>(sizes[d] - 1), static_cast<std::uint64_t>(strides[d]),
                               &step) ||
        __builtin_add_overflow(last, step, &last)) {
      return false;
    }
  }
  std::uint64_t n = 0;
  if (__builtin_add_overflow(last, 1, &n) || __builtin_mul_overflow(n, element_size, out)) return false;
  return true;
}

Status sys_error(const std::string& what) {
  int e = errno;
  return Status::error(e, what + ": " + std::strerror(e) + " (" + errno_name(e) + ")");
}

}  // namespace detail

std::uint64_t checksum(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

Status parse_image(const std::uint8_t* data, std::size_t size, std::uint64_t file_size, const std::string& origin,
                   ImageInfo* out) {
  const Bad bad{origin};
  Header h;
  Status s = read_header(data, size, file_size, bad, &h);
  if (s.ok()) s = check_sections(data, size, file_size, h, bad);
  if (!s.ok()) return s;

  ImageInfo info;
  info.version = h.version;
  info.file_size = h.fsize;
  info.data_offset = h.data_off;
  info.data_size = h.data_size;
  Reader r(data + kHeaderBytes, static_cast<std::size_t>(h.meta_size));
  if (!r.str(&info.source) || !r.str(&info.input_shapes) || !r.u32(&info.num_inputs) ||
      !r.u64(&info.activation_bytes)) {
    return bad("metadata truncated in the preamble");
  }
  s = read_layers(r, h, bad, &info.layers);
  if (!s.ok()) return s;
  info.tensors.resize(h.num_tensors);
  for (std::uint32_t i = 0; i < h.num_tensors; ++i) {
    s = read_tensor(r, i, info.layers, bad, &info.tensors[i]);
    if (!s.ok()) return s;
  }
  if (!r.blob(&info.skeleton)) return bad("metadata truncated in the skeleton");
  if (info.version >= 4) {
    s = read_profiles(r, bad, &info.input_profiles);
    if (!s.ok()) return s;
  }
  if (r.remaining() != 0) return bad(u64s(r.remaining()) + " unexpected bytes after the metadata");
  *out = std::move(info);
  return Status();
}

Status read_image_info(const std::string& path, ImageInfo* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_error(path + ": cannot open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = sys_error(path + ": fstat");
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(EINVAL, path + ": not a regular file");
  }
  const std::uint64_t fsize = static_cast<std::uint64_t>(st.st_size);
  // Only the tables are read here, through the page cache: no readahead into the parameter
  // data, and the pages are dropped afterwards (the image is otherwise read with O_DIRECT).
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  // Header first; it bounds how much metadata to read.
  std::string buf(static_cast<std::size_t>(std::min<std::uint64_t>(fsize, kHeaderBytes)), '\0');
  auto read_at = [&](std::size_t off, std::size_t n) -> bool {
    std::size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd, &buf[off + done], n - done, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      done += static_cast<std::size_t>(r);
    }
    return true;
  };
  if (!read_at(0, buf.size())) {
    Status s = sys_error(path + ": reading the header");
    ::close(fd);
    return s;
  }
  if (buf.size() == kHeaderBytes && std::memcmp(buf.data(), kMagic, 8) == 0) {
    std::uint64_t meta_size = 0;
    std::memcpy(&meta_size, buf.data() + 8 + 4 + 4 + 8 + 8 + 8, 8);
    std::uint64_t want = std::min<std::uint64_t>({meta_size, kMaxMetaBytes, fsize - kHeaderBytes});
    buf.resize(static_cast<std::size_t>(kHeaderBytes + want));
    if (!read_at(kHeaderBytes, static_cast<std::size_t>(want))) {
      Status s = sys_error(path + ": reading the metadata");
      ::close(fd);
      return s;
    }
  }
  (void)::posix_fadvise(fd, 0, static_cast<off_t>(buf.size()), POSIX_FADV_DONTNEED);
  ::close(fd);
  return parse_image(reinterpret_cast<const std::uint8_t*>(buf.data()), buf.size(), fsize, path, out);
}

}  // namespace swapnet
