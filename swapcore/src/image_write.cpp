// Writing a swap image (Note [Swap image format] in image.cpp): tables laid out first, data
// written layer by layer into a temporary file and hashed as it goes, then the tables and header,
// and the file renamed into place only once it is whole and synced.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "image_format.h"
#include "swapnet/swapcore.h"

namespace swapnet {
using namespace detail;  // image_format.h: the constants the reader shares
namespace {

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

// The directory an image at `path` is written in.
std::string image_dir(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
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

// The tables' own consistency: layers list the tensors in order, all of them, and every tensor's
// strides give it a span (its nbytes).
Status check_tables(const std::string& path, ImageInfo* info) {
  std::uint32_t t = 0;
  for (std::uint32_t i = 0; i < info->layers.size(); ++i) {
    ImageLayer& L = info->layers[i];
    if (L.first_tensor != t) return Status::error(EINVAL, path + ": layer " + std::to_string(i) + " tensors out of order");
    t += L.num_tensors;
  }
  if (t != info->tensors.size()) return Status::error(EINVAL, path + ": layers list " + std::to_string(t) + " of " +
                                                                std::to_string(info->tensors.size()) + " tensors");
  for (auto& ts : info->tensors) {
    if (!span_bytes(ts.sizes, ts.strides, ts.element_size, &ts.nbytes)) {
      return Status::error(EINVAL, path + ": tensor " + ts.name + " has negative or overflowing strides");
    }
  }
  return Status();
}

// Offsets and sizes of the data: the tables' size is final before their offsets are known (fixed
// width), so the data starts after them; each layer on an aligned boundary, each tensor on one of
// kTensorAlign inside it.
void lay_out(ImageInfo* info) {
  const std::uint64_t meta_size = meta_bytes(*info).size();
  info->data_offset = align_up(kHeaderBytes + meta_size, kImageAlign);
  std::uint64_t off = info->data_offset;
  for (auto& L : info->layers) {
    L.offset = off;
    std::uint64_t pos = 0;
    for (std::uint32_t k = L.first_tensor; k < L.first_tensor + L.num_tensors; ++k) {
      pos = align_up(pos, kTensorAlign);
      info->tensors[k].offset = off + pos;
      pos += info->tensors[k].nbytes;
    }
    L.data_bytes = pos;
    L.size = align_up(pos, kImageAlign);
    off += L.size;
  }
  info->file_size = off;
  info->data_size = off - info->data_offset;
}

// Writes the data section into `fd`, layer by layer, hashing as it goes.
struct DataWriter {
  int fd;
  const std::string& path;
  const std::function<const void*(std::size_t tensor)>& tensor_bytes;
  const ImageWriteOptions& options;
  XXH3_state_t* hs = nullptr;
  std::vector<char> zeros = std::vector<char>(kImageAlign, 0);
  std::uint64_t done = 0;  // tensor bytes written, for progress

  // One layer's bytes at its offset: its tensors with zeros between them and to its end, hashed
  // into its checksum.
  Status write_layer(const ImageInfo& info, ImageLayer* layer) {
    ImageLayer& L = *layer;
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
      if (!pad_to(ts.offset)) return sys_error(path + ": write");
      const void* bytes = ts.nbytes ? tensor_bytes(k) : nullptr;
      if (ts.nbytes && bytes == nullptr) return Status::error(EINVAL, path + ": no data for tensor " + ts.name);
      if (ts.nbytes && !write_all(fd, bytes, static_cast<std::size_t>(ts.nbytes), pos)) {
        return sys_error(path + ": write");
      }
      XXH3_64bits_update(hs, bytes, static_cast<std::size_t>(ts.nbytes));
      pos += ts.nbytes;
      done += ts.nbytes;
      if (options.progress) options.progress(done, info.data_size);
    }
    if (!pad_to(L.offset + L.size)) return sys_error(path + ": write");
    L.checksum = XXH3_64bits_digest(hs);
    return Status();
  }
};

// The data section, setting each layer's checksum.
Status write_data(int fd, const std::string& path, ImageInfo* info,
                  const std::function<const void*(std::size_t tensor)>& tensor_bytes,
                  const ImageWriteOptions& options) {
  DataWriter w{fd, path, tensor_bytes, options};
  w.hs = XXH3_createState();
  Status s;
  for (std::uint32_t i = 0; i < info->layers.size() && s.ok(); ++i) s = w.write_layer(*info, &info->layers[i]);
  XXH3_freeState(w.hs);
  return s;
}

// Header, metadata and the padding up to the data, written last (they hold the checksums); then
// the file made whole and durable.
Status write_tables(int fd, const std::string& path, const ImageInfo& info) {
  std::string meta = meta_bytes(info);
  std::string head = header_bytes(info, meta.size(), XXH3_64bits(meta.data(), meta.size()));
  std::string pad(static_cast<std::size_t>(info.data_offset - kHeaderBytes - meta.size()), '\0');
  if (!write_all(fd, head.data(), head.size(), 0) || !write_all(fd, meta.data(), meta.size(), kHeaderBytes) ||
      !write_all(fd, pad.data(), pad.size(), kHeaderBytes + meta.size())) {
    return sys_error(path + ": write");
  }
  if (::ftruncate(fd, static_cast<off_t>(info.file_size)) != 0) return sys_error(path + ": ftruncate");
  if (::fchmod(fd, 0644) != 0) return sys_error(path + ": fchmod");
  if (::fsync(fd) != 0) return sys_error(path + ": fsync");
  return Status();
}

// The finished temporary file renamed over `path`, and the rename made durable.
Status publish(const std::string& tmp, const std::string& path, const std::string& dir) {
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

// The temporary file an image at `path` is written into before its rename (one place, so that
// probe_image_path() says what write_image() would).
Status create_partial(const std::string& path, std::string* tmp, int* fd) {
  *tmp = path + ".partial-XXXXXX";
  *fd = ::mkostemp(&(*tmp)[0], O_CLOEXEC);
  if (*fd < 0) return sys_error(path + ": cannot create a temporary file in " + image_dir(path));
  return Status();
}

}  // namespace

Status probe_image_path(const std::string& path) {
  std::string tmp;
  int fd = -1;
  Status s = create_partial(path, &tmp, &fd);
  if (!s.ok()) return s;
  ::close(fd);
  ::unlink(tmp.c_str());
  return Status();
}

Status write_image(const std::string& path, ImageInfo info,
                   const std::function<const void*(std::size_t tensor)>& tensor_bytes,
                   const ImageWriteOptions& options) {
  Status s = check_tables(path, &info);
  if (!s.ok()) return s;
  lay_out(&info);

  const std::string dir = image_dir(path);
  remove_stale_partials(dir, path);
  std::string tmp;
  int fd = -1;
  s = create_partial(path, &tmp, &fd);
  if (!s.ok()) return s;
  (void)::flock(fd, LOCK_EX);  // held until closed: a later write knows this one is alive
  s = write_data(fd, path, &info, tensor_bytes, options);
  if (s.ok()) s = write_tables(fd, path, info);
  if (!s.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  // Packing wrote through the page cache; the image is read with O_DIRECT, so drop it.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return publish(tmp, path, dir);
}

}  // namespace swapnet
