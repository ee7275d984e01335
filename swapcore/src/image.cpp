// The swap image: one file per model, from which any block is one aligned read.
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
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <limits>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace {

constexpr char kMagic[8] = {'S', 'W', 'A', 'P', 'N', 'E', 'T', '\0'};
// 2: activation_bytes in the metadata; 3: peak_bytes per layer; 4: input profiles. Versions 2
// and 3 are still read.
constexpr std::uint32_t kVersion = kImageZoneReserveVersion;
constexpr std::uint32_t kOldestVersion = 2;
constexpr std::uint64_t kHeaderBytes = 4096;
constexpr std::uint64_t kHeaderChecksumAt = kHeaderBytes - 8;
constexpr std::uint64_t kMaxMetaBytes = 256ull << 20;  // tables + skeleton; real ones are < 1 MiB
constexpr std::uint64_t kTensorAlign = 64;              // bytes
constexpr unsigned kMaxDims = 16;
constexpr std::size_t kMinLayerEntry = 4 + 4 + 8 * 3 + 4 * 2 + 8 + 8 + 8 + 8;
constexpr std::size_t kMinTensorEntry = 4 + 4 + 8 + 8 + 4;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

class Writer {
 public:
  void u8(std::uint8_t v) { b.push_back(static_cast<char>(v)); }
  void u32(std::uint32_t v) { raw(&v, 4); }
  void u64(std::uint64_t v) { raw(&v, 8); }
  void i64(std::int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));
    b.append(s);
  }
  void blob(const std::string& s) {
    u64(s.size());
    b.append(s);
  }
  void raw(const void* p, std::size_t n) { b.append(static_cast<const char*>(p), n); }
  std::string b;
};

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

std::string u64s(std::uint64_t v) { return std::to_string(v); }

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

std::string header_bytes(const ImageInfo& info, std::uint64_t meta_size, std::uint64_t meta_checksum) {
  Writer w;
  w.raw(kMagic, 8);
  w.u32(kVersion);
  w.u32(static_cast<std::uint32_t>(kHeaderBytes));
  w.u64(kImageAlign);
  w.u64(info.file_size);
  w.u64(kHeaderBytes);
  w.u64(meta_size);
  w.u64(meta_checksum);
  w.u64(info.data_offset);
  w.u64(info.data_size);
  w.u32(static_cast<std::uint32_t>(info.layers.size()));
  w.u32(static_cast<std::uint32_t>(info.tensors.size()));
  w.b.resize(kHeaderChecksumAt, '\0');
  w.u64(XXH3_64bits(w.b.data(), kHeaderChecksumAt));
  return w.b;
}

std::string meta_bytes(const ImageInfo& info) {
  Writer w;
  w.str(info.source);
  w.str(info.input_shapes);
  w.u32(info.num_inputs);
  w.u64(info.activation_bytes);
  for (const auto& L : info.layers) {
    w.str(L.name);
    w.str(L.ops);
    w.u64(L.offset);
    w.u64(L.size);
    w.u64(L.data_bytes);
    w.u32(L.first_tensor);
    w.u32(L.num_tensors);
    w.u64(L.checksum);
    w.f64(L.flops);
    w.f64(L.time_ms);
    w.u64(L.live_bytes);
    w.u64(L.peak_bytes);
  }
  for (const auto& t : info.tensors) {
    w.str(t.name);
    w.u8(t.kind);
    w.u8(t.dtype);
    w.u8(t.element_size);
    w.u8(static_cast<std::uint8_t>(t.sizes.size()));
    for (auto s : t.sizes) w.i64(s);
    for (auto s : t.strides) w.i64(s);
    w.u64(t.offset);
    w.u64(t.nbytes);
    w.u32(t.layer);
  }
  w.blob(info.skeleton);
  w.u32(static_cast<std::uint32_t>(info.input_profiles.size()));
  for (const auto& p : info.input_profiles) {
    w.u64(p.activation_bytes);
    w.u32(static_cast<std::uint32_t>(p.inputs.size()));
    for (const auto& v : p.inputs) {
      w.u8(v.kind);
      w.u8(v.dtype);
      w.u8(static_cast<std::uint8_t>(v.sizes.size()));
      for (auto d : v.sizes) w.i64(d);
      w.str(v.text);
    }
  }
  return w.b;
}

// Temporary files of earlier writes to `path` that never finished (the writer killed before its
// rename: hundreds of MB left on a device's small disk). A writer holds an exclusive flock on
// its temporary file while it lives; one nobody holds, not modified for a minute (a writer
// between creating and locking its file is never that old), is removed.
void remove_stale_partials(const std::string& dir, const std::string& path) {
  const std::string base = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  const std::string prefix = base + ".partial-";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const time_t now = ::time(nullptr);
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string full = dir + "/" + name;
    const int f = ::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (f < 0) continue;
    struct stat st {};
    if (::fstat(f, &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime > 60 && ::flock(f, LOCK_EX | LOCK_NB) == 0) {
      if (::unlink(full.c_str()) == 0) {
        log(LogLevel::kInfo, full + ": removed, the temporary file of a write of " + path + " that did not finish (" +
                                 std::to_string(st.st_size) + " bytes)");
      }
    }
    ::close(f);
  }
  ::closedir(d);
}

Status sys_error(const std::string& what) {
  int e = errno;
  return Status::error(e, what + ": " + std::strerror(e) + " (" + errno_name(e) + ")");
}

bool write_all(int fd, const void* p, std::size_t n, std::uint64_t off) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, c, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<std::size_t>(w);
    off += static_cast<std::uint64_t>(w);
  }
  return true;
}

}  // namespace

std::uint64_t checksum(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

Status parse_image(const std::uint8_t* data, std::size_t size, std::uint64_t file_size, const std::string& origin,
                   ImageInfo* out) {
  auto bad = [&](const std::string& what) { return Status::error(-1, origin + ": " + what); };
  if (file_size < size) return bad("internal: " + u64s(size) + " bytes given for a file of " + u64s(file_size));
  if (size < kHeaderBytes) {
    return bad("truncated: " + u64s(size) + " bytes, smaller than the " + u64s(kHeaderBytes) + "-byte header");
  }
  if (std::memcmp(data, kMagic, 8) != 0) return bad("not a swapnet image (bad magic)");
  Reader h(data + 8, kHeaderBytes - 8);
  std::uint32_t version = 0, hbytes = 0, num_layers = 0, num_tensors = 0;
  std::uint64_t align = 0, fsize = 0, meta_off = 0, meta_size = 0, meta_sum = 0, data_off = 0, data_size = 0;
  h.u32(&version);
  h.u32(&hbytes);
  h.u64(&align);
  h.u64(&fsize);
  h.u64(&meta_off);
  h.u64(&meta_size);
  h.u64(&meta_sum);
  h.u64(&data_off);
  h.u64(&data_size);
  h.u32(&num_layers);
  h.u32(&num_tensors);
  if (version < kOldestVersion || version > kVersion) {
    return bad("format version " + std::to_string(version) + " is not supported (this build reads versions " +
               std::to_string(kOldestVersion) + " to " + std::to_string(kVersion) + "; re-pack the model)");
  }
  std::uint64_t stored = 0;
  std::memcpy(&stored, data + kHeaderChecksumAt, 8);
  if (XXH3_64bits(data, kHeaderChecksumAt) != stored) return bad("header checksum mismatch (corrupt header)");
  if (hbytes != kHeaderBytes || align != kImageAlign || meta_off != kHeaderBytes) {
    return bad("header fields out of range (header_bytes " + std::to_string(hbytes) + ", alignment " + u64s(align) +
               ", meta_offset " + u64s(meta_off) + ")");
  }
  if (fsize != file_size) {
    return bad((file_size < fsize ? "truncated: file is " : "file is ") + u64s(file_size) +
               " bytes, header says " + u64s(fsize));
  }
  if (meta_size > kMaxMetaBytes || meta_size > fsize - kHeaderBytes) {
    return bad("metadata size " + u64s(meta_size) + " exceeds the file or the limit of " + u64s(kMaxMetaBytes));
  }
  if (data_off % kImageAlign != 0 || data_off < kHeaderBytes + meta_size || data_off > fsize ||
      data_size != fsize - data_off) {
    return bad("data section [" + u64s(data_off) + ", +" + u64s(data_size) + ") does not fit the file of " +
               u64s(fsize) + " bytes");
  }
  if (size < kHeaderBytes + meta_size) {
    return bad("truncated: metadata needs " + u64s(kHeaderBytes + meta_size) + " bytes, have " + u64s(size));
  }
  const std::uint8_t* meta = data + kHeaderBytes;
  if (XXH3_64bits(meta, meta_size) != meta_sum) return bad("metadata checksum mismatch (corrupt tables)");
  if (num_layers > meta_size / kMinLayerEntry || num_tensors > meta_size / kMinTensorEntry) {
    return bad("counts out of range: " + std::to_string(num_layers) + " layers, " + std::to_string(num_tensors) +
               " tensors in " + u64s(meta_size) + " bytes of metadata");
  }

  ImageInfo info;
  info.version = version;
  info.file_size = fsize;
  info.data_offset = data_off;
  info.data_size = data_size;
  Reader r(meta, static_cast<std::size_t>(meta_size));
  if (!r.str(&info.source) || !r.str(&info.input_shapes) || !r.u32(&info.num_inputs) ||
      !r.u64(&info.activation_bytes)) {
    return bad("metadata truncated in the preamble");
  }
  info.layers.resize(num_layers);
  std::uint64_t expect_off = data_off;
  std::uint32_t expect_tensor = 0;
  for (std::uint32_t i = 0; i < num_layers; ++i) {
    ImageLayer& L = info.layers[i];
    if (!r.str(&L.name) || !r.str(&L.ops) || !r.u64(&L.offset) || !r.u64(&L.size) || !r.u64(&L.data_bytes) ||
        !r.u32(&L.first_tensor) || !r.u32(&L.num_tensors) || !r.u64(&L.checksum) || !r.f64(&L.flops) ||
        !r.f64(&L.time_ms) || !r.u64(&L.live_bytes) || (version >= 3 && !r.u64(&L.peak_bytes))) {
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
  info.tensors.resize(num_tensors);
  for (std::uint32_t i = 0; i < num_tensors; ++i) {
    ImageTensor& t = info.tensors[i];
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
    if (t.layer >= num_layers || i < info.layers[t.layer].first_tensor ||
        i >= info.layers[t.layer].first_tensor + info.layers[t.layer].num_tensors) {
      return bad(where + ": owning layer " + std::to_string(t.layer) + " does not list it");
    }
    const ImageLayer& L = info.layers[t.layer];
    if (t.offset < L.offset || t.offset % kTensorAlign != 0 || t.nbytes > L.data_bytes ||
        t.offset - L.offset > L.data_bytes - t.nbytes) {
      return bad(where + ": bytes [" + u64s(t.offset) + ", +" + u64s(t.nbytes) + ") lie outside layer " +
                 std::to_string(t.layer) + "'s data [" + u64s(L.offset) + ", +" + u64s(L.data_bytes) + ")");
    }
  }
  if (!r.blob(&info.skeleton)) return bad("metadata truncated in the skeleton");
  if (version >= 4) {
    std::uint32_t np = 0;
    // A profile takes at least 12 bytes, a value at least 7.
    if (!r.u32(&np) || np > r.remaining() / 12) return bad("metadata truncated in the input profiles");
    info.input_profiles.resize(np);
    for (std::uint32_t i = 0; i < np; ++i) {
      InputProfile& p = info.input_profiles[i];
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

Status write_image(const std::string& path, ImageInfo info,
                   const std::function<const void*(std::size_t tensor)>& tensor_bytes,
                   const ImageWriteOptions& options) {
  // Layout: tables first with placeholder offsets (fixed width, so the size is final).
  std::uint32_t t = 0;
  for (std::uint32_t i = 0; i < info.layers.size(); ++i) {
    ImageLayer& L = info.layers[i];
    if (L.first_tensor != t) return Status::error(EINVAL, path + ": layer " + std::to_string(i) + " tensors out of order");
    t += L.num_tensors;
  }
  if (t != info.tensors.size()) return Status::error(EINVAL, path + ": layers list " + std::to_string(t) + " of " +
                                                               std::to_string(info.tensors.size()) + " tensors");
  for (auto& ts : info.tensors) {
    if (!span_bytes(ts.sizes, ts.strides, ts.element_size, &ts.nbytes)) {
      return Status::error(EINVAL, path + ": tensor " + ts.name + " has negative or overflowing strides");
    }
  }
  const std::uint64_t meta_size = meta_bytes(info).size();
  info.data_offset = align_up(kHeaderBytes + meta_size, kImageAlign);
  std::uint64_t off = info.data_offset;
  for (auto& L : info.layers) {
    L.offset = off;
    std::uint64_t pos = 0;
    for (std::uint32_t k = L.first_tensor; k < L.first_tensor + L.num_tensors; ++k) {
      pos = align_up(pos, kTensorAlign);
      info.tensors[k].offset = off + pos;
      pos += info.tensors[k].nbytes;
    }
    L.data_bytes = pos;
    L.size = align_up(pos, kImageAlign);
    off += L.size;
  }
  info.file_size = off;
  info.data_size = off - info.data_offset;

  std::string dir = ".";
  auto slash = path.rfind('/');
  if (slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  remove_stale_partials(dir, path);
  std::string tmp = path + ".partial-XXXXXX";
  int fd = ::mkostemp(&tmp[0], O_CLOEXEC);
  if (fd < 0) return sys_error(path + ": cannot create a temporary file in " + dir);
  (void)::flock(fd, LOCK_EX);  // held until closed: a later write knows this one is alive
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  // Data, layer by layer, hashing as we go.
  std::vector<char> zeros(kImageAlign, 0);
  std::uint64_t done = 0;
  XXH3_state_t* hs = XXH3_createState();
  for (std::uint32_t i = 0; i < info.layers.size(); ++i) {
    ImageLayer& L = info.layers[i];
    XXH3_64bits_reset(hs);
    std::uint64_t pos = L.offset;
    auto pad_to = [&](std::uint64_t target) {
      while (pos < target) {
        std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(target - pos, zeros.size()));
        if (!write_all(fd, zeros.data(), n, pos)) return false;
        XXH3_64bits_update(hs, zeros.data(), n);
        pos += n;
      }
      return true;
    };
    for (std::uint32_t k = L.first_tensor; k < L.first_tensor + L.num_tensors; ++k) {
      const ImageTensor& ts = info.tensors[k];
      if (!pad_to(ts.offset)) return XXH3_freeState(hs), fail(sys_error(path + ": write"));
      const void* bytes = ts.nbytes ? tensor_bytes(k) : nullptr;
      if (ts.nbytes && bytes == nullptr) {
        XXH3_freeState(hs);
        return fail(Status::error(EINVAL, path + ": no data for tensor " + ts.name));
      }
      if (ts.nbytes && !write_all(fd, bytes, static_cast<std::size_t>(ts.nbytes), pos)) {
        XXH3_freeState(hs);
        return fail(sys_error(path + ": write"));
      }
      XXH3_64bits_update(hs, bytes, static_cast<std::size_t>(ts.nbytes));
      pos += ts.nbytes;
      done += ts.nbytes;
      if (options.progress) options.progress(done, info.data_size);
    }
    if (!pad_to(L.offset + L.size)) return XXH3_freeState(hs), fail(sys_error(path + ": write"));
    L.checksum = XXH3_64bits_digest(hs);
  }
  XXH3_freeState(hs);
  std::string meta = meta_bytes(info);
  std::string head = header_bytes(info, meta.size(), XXH3_64bits(meta.data(), meta.size()));
  std::string pad(static_cast<std::size_t>(info.data_offset - kHeaderBytes - meta.size()), '\0');
  if (!write_all(fd, head.data(), head.size(), 0) || !write_all(fd, meta.data(), meta.size(), kHeaderBytes) ||
      !write_all(fd, pad.data(), pad.size(), kHeaderBytes + meta.size())) {
    return fail(sys_error(path + ": write"));
  }
  if (::ftruncate(fd, static_cast<off_t>(info.file_size)) != 0) return fail(sys_error(path + ": ftruncate"));
  if (::fchmod(fd, 0644) != 0) return fail(sys_error(path + ": fchmod"));
  if (::fsync(fd) != 0) return fail(sys_error(path + ": fsync"));
  // Packing wrote through the page cache; the image is read with O_DIRECT, so drop it.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = sys_error(path + ": rename from " + tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);  // advisory: makes the rename durable
    ::close(dfd);
  }
  return Status();
}

}  // namespace swapnet
