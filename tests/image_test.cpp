// Tests of swapcore's swap image (write, parse, check) and block reader, without torch:
// round trips, corruption of every section, hostile metadata, and faults injected at the I/O
// boundary (short reads, EIO, EINTR, EAGAIN, end of file) for every backend.
#include <gtest/gtest.h>
#include <ctime>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <csignal>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "swapnet/swapcore.h"
#include "test_util.h"

namespace swapnet {
namespace {

const std::string& temp_dir() { return test_util::process_temp_dir(); }

// An image of `layers` layers, each with two float tensors of random contents (one strided).
struct Fixture {
  ImageInfo info;
  std::vector<std::vector<float>> data;  // per tensor
};

Fixture make_fixture(int layers, unsigned seed = 1) {
  Fixture f;
  std::mt19937 rng(seed);
  f.info.source = "fixture.pt";
  f.info.input_shapes = "1,3,8,8";
  f.info.num_inputs = 1;
  f.info.skeleton = std::string("skeleton-bytes\0with-nul", 23);
  for (int l = 0; l < layers; ++l) {
    ImageLayer L;
    L.name = "block" + std::to_string(l) + ".conv";
    L.ops = "aten::_convolution,aten::relu";
    L.first_tensor = static_cast<std::uint32_t>(f.info.tensors.size());
    L.num_tensors = l == 1 ? 0 : 2;  // layer 1 has no weights
    L.flops = 1000.0 * l;
    L.time_ms = 0.5 * l;
    L.live_bytes = 4096u * l;
    L.peak_bytes = 8192u * l + 1;
    for (std::uint32_t t = 0; t < L.num_tensors; ++t) {
      ImageTensor it;
      it.name = L.name + (t ? ".bias" : ".weight");
      it.dtype = 6;  // float
      it.element_size = 4;
      if (t == 0) {
        int n = 1000 + 3000 * l;  // a few KiB, crossing 4 KiB pages
        it.sizes = {n / 10, 10};
        it.strides = {10, 1};
      } else {
        it.sizes = {7, 3};
        it.strides = {1, 7};  // transposed: strides are kept, not made contiguous
      }
      it.layer = static_cast<std::uint32_t>(l);
      std::int64_t elems = 1;
      for (size_t d = 0; d < it.sizes.size(); ++d) elems += (it.sizes[d] - 1) * it.strides[d];
      std::vector<float> v(static_cast<size_t>(elems));
      for (auto& x : v) x = std::uniform_real_distribution<float>(-1, 1)(rng);
      f.data.push_back(std::move(v));
      f.info.tensors.push_back(std::move(it));
    }
    f.info.layers.push_back(std::move(L));
  }
  return f;
}

std::string write_fixture(const Fixture& f, const std::string& name) {
  std::string path = temp_dir() + "/" + name;
  Status s = write_image(path, f.info, [&](std::size_t t) -> const void* { return f.data[t].data(); });
  EXPECT_TRUE(s.ok()) << s.message();
  return path;
}

using test_util::reseal;
using test_util::slurp;
using test_util::spit;

Status parse_bytes(const std::string& b, ImageInfo* out) {
  return parse_image(reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), b.size(), "img", out);
}

TEST(Image, RoundTripsTablesAndAlignment) {
  Fixture f = make_fixture(4);
  std::string path = write_fixture(f, "roundtrip.swapnet");
  ImageInfo got;
  Status s = read_image_info(path, &got);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(got.source, "fixture.pt");
  EXPECT_EQ(got.skeleton, f.info.skeleton);
  ASSERT_EQ(got.layers.size(), 4u);
  ASSERT_EQ(got.tensors.size(), 6u);
  EXPECT_EQ(got.layers[1].size, 0u);
  for (const auto& L : got.layers) {
    EXPECT_EQ(L.offset % kImageAlign, 0u) << L.name;
    EXPECT_EQ(L.size % kImageAlign, 0u) << L.name;
  }
  EXPECT_EQ(got.layers[3].time_ms, 1.5);
  EXPECT_EQ(got.layers[3].live_bytes, 3u * 4096);
  EXPECT_EQ(got.layers[3].peak_bytes, 3u * 8192 + 1);
  EXPECT_EQ(got.version, 5u);
  std::string bytes = slurp(path);
  EXPECT_EQ(got.file_size, bytes.size());
  for (size_t t = 0; t < got.tensors.size(); ++t) {
    const ImageTensor& it = got.tensors[t];
    EXPECT_EQ(it.offset % 64, 0u);
    ASSERT_EQ(it.nbytes, f.data[t].size() * 4);
    EXPECT_EQ(std::memcmp(&bytes[it.offset], f.data[t].data(), it.nbytes), 0) << it.name;
  }
  EXPECT_EQ(got.tensors[1].strides, (std::vector<std::int64_t>{1, 7}));
  s = check_image(path, got);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(Image, CheckNamesTheFirstCorruptLayer) {
  Fixture f = make_fixture(4);
  std::string path = write_fixture(f, "flip.swapnet");
  ImageInfo info;
  ASSERT_TRUE(read_image_info(path, &info).ok());
  std::string b = slurp(path);
  b[info.layers[2].offset + 100] ^= 0x01;
  spit(path, b);
  ASSERT_TRUE(read_image_info(path, &info).ok()) << "data corruption leaves the tables intact";
  Status s = check_image(path, info);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("checksum mismatch in layer 2 (block2.conv)"), std::string::npos) << s.message();
}

TEST(Image, RefusesDamagedHeadersAndTables) {
  Fixture f = make_fixture(3);
  const std::string good = slurp(write_fixture(f, "damage.swapnet"));
  ImageInfo out;
  auto expect = [&](std::string b, const std::string& what) {
    Status s = parse_bytes(b, &out);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  std::string b = good;
  b[0] = 'X';
  expect(b, "not a swapnet image (bad magic)");
  b = good;
  b[100] ^= 1;
  expect(b, "header checksum mismatch");
  b = good;
  b[4096 + 5] ^= 1;
  expect(b, "metadata checksum mismatch");
  b = good;
  std::uint32_t v2 = 1;  // an image from an older build
  std::memcpy(&b[8], &v2, 4);
  reseal(b);
  expect(b, "format version 1 is not supported (this build reads versions 2 to 5; re-pack the model)");
  expect(good.substr(0, good.size() - 4096), "truncated: file is");
  expect(good.substr(0, 100), "truncated: 100 bytes");
  // Absurd counts must be refused before anything is allocated.
  b = good;
  std::uint32_t huge = 0xFFFFFFFF;
  std::memcpy(&b[72], &huge, 4);
  reseal(b);
  expect(b, "counts out of range");
  // A metadata size beyond the file.
  b = good;
  std::uint64_t big = 1ull << 40;
  std::memcpy(&b[40], &big, 8);
  std::uint64_t hs = XXH3_64bits(b.data(), 4088);
  std::memcpy(&b[4088], &hs, 8);
  expect(b, "metadata size 1099511627776 exceeds the file");
  // Layer 0's offset pointing past the end of the file. Metadata layout: str source,
  // str input_shapes, u32 num_inputs, u64 activation_bytes, then layer 0: str name, str ops,
  // u64 offset.
  b = good;
  size_t pos = 4096 + 4 + f.info.source.size() + 4 + f.info.input_shapes.size() + 4 + 8 + 4 +
               f.info.layers[0].name.size() + 4 + f.info.layers[0].ops.size();
  std::uint64_t far = 1ull << 50;
  std::memcpy(&b[pos], &far, 8);
  reseal(b);
  expect(b, "layer 0 (block0.conv): range [1125899906842624");
  // Trailing garbage in the file.
  expect(good + std::string(4096, '\0'), "header says");
}

// Format 4 records the inputs activations were measured for (Note [Dynamic shapes]); a count
// the bytes cannot hold and an out-of-range value are refused.
TEST(Image, RoundTripsInputProfiles) {
  Fixture f = make_fixture(2);
  InputProfile a;
  a.activation_bytes = 12345;
  a.inputs.push_back(ImageInput{ImageInput::kTensor, 4, {1, 16}, ""});
  a.inputs.push_back(ImageInput{ImageInput::kNone, 0, {}, ""});
  a.inputs.push_back(ImageInput{ImageInput::kSequence, 0, {2}, ""});
  a.inputs.push_back(ImageInput{ImageInput::kTensor, 6, {8, 0, 64}, ""});
  a.inputs.push_back(ImageInput{ImageInput::kValue, 0, {}, "5"});
  InputProfile b;
  b.activation_bytes = 99;
  f.info.input_profiles = {a, b};
  ImageInfo got;
  std::string bytes = slurp(write_fixture(f, "profiles.swapnet"));
  Status s = parse_bytes(bytes, &got);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(got.input_profiles.size(), 2u);
  EXPECT_EQ(got.input_profiles[0].activation_bytes, 12345u);
  ASSERT_EQ(got.input_profiles[0].inputs.size(), 5u);
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    EXPECT_EQ(got.input_profiles[0].inputs[i].kind, a.inputs[i].kind) << i;
    EXPECT_EQ(got.input_profiles[0].inputs[i].dtype, a.inputs[i].dtype) << i;
    EXPECT_EQ(got.input_profiles[0].inputs[i].sizes, a.inputs[i].sizes) << i;
    EXPECT_EQ(got.input_profiles[0].inputs[i].text, a.inputs[i].text) << i;
  }
  EXPECT_TRUE(got.input_profiles[1].inputs.empty());
  // The first value's kind (right after the first profile's u64 bytes and u32 count, which
  // follow the u32 profile count at the end of the skeleton blob) made out of range.
  std::uint64_t meta_size = 0;
  std::memcpy(&meta_size, &bytes[40], 8);
  size_t profiles_bytes = 4;
  for (const auto& p : f.info.input_profiles) {
    profiles_bytes += 8 + 4;
    for (const auto& v : p.inputs) profiles_bytes += 3 + 8 * v.sizes.size() + 4 + v.text.size();
  }
  const size_t first_kind = 4096 + meta_size - profiles_bytes + 4 + 8 + 4;
  std::string bad = bytes;
  bad[first_kind] = 9;
  reseal(bad);
  s = parse_bytes(bad, &got);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("input profile 0: value kind 9"), std::string::npos) << s.message();
  // A profile count no metadata could hold.
  bad = bytes;
  std::uint32_t huge = 1u << 30;
  std::memcpy(&bad[4096 + meta_size - profiles_bytes], &huge, 4);
  reseal(bad);
  s = parse_bytes(bad, &got);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("input profiles"), std::string::npos) << s.message();
}

// Images packed before format 3 (no per-layer activation peak) are still read: the peaks are 0
// (not measured) and everything else is as written.
TEST(Image, ReadsFormatVersion2) {
  Fixture f = make_fixture(3);
  std::string b = slurp(write_fixture(f, "v2.swapnet"));
  ImageInfo v3;
  ASSERT_TRUE(parse_bytes(b, &v3).ok());
  // Turn it into version 2: drop the trailing u32 count of input profiles (none here; format 4)
  // and each layer's trailing u64 peak_bytes (format 3) from the metadata.
  std::uint64_t meta_size = 0;
  std::memcpy(&meta_size, &b[40], 8);
  b.erase(4096 + meta_size - 4, 4);
  b.insert(4096 + meta_size - 4, 4, '\0');
  meta_size -= 4;
  size_t pos = 4096 + 4 + f.info.source.size() + 4 + f.info.input_shapes.size() + 4 + 8;
  for (const auto& L : f.info.layers) {
    pos += 4 + L.name.size() + 4 + L.ops.size() + 8 * 3 + 4 * 2 + 8 * 4;  // through live_bytes
    b.erase(pos, 8);
    b.insert(4096 + meta_size - 8, 8, '\0');  // keep the data section where it was
    meta_size -= 8;
  }
  std::memcpy(&b[40], &meta_size, 8);
  std::uint32_t v2 = 2;
  std::memcpy(&b[8], &v2, 4);
  reseal(b);
  ImageInfo got;
  Status s = parse_bytes(b, &got);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(got.version, 2u);
  ASSERT_EQ(got.layers.size(), 3u);
  for (size_t l = 0; l < got.layers.size(); ++l) {
    EXPECT_EQ(got.layers[l].live_bytes, 4096u * l);
    EXPECT_EQ(got.layers[l].peak_bytes, 0u);
    EXPECT_EQ(got.layers[l].checksum, v3.layers[l].checksum);
    EXPECT_EQ(got.layers[l].offset, v3.layers[l].offset);
  }
  EXPECT_EQ(got.skeleton, f.info.skeleton);
  EXPECT_EQ(got.tensors.size(), f.info.tensors.size());
}

// A write killed before its rename leaves NAME.partial-XXXXXX behind (600 MB for gpt_350m killed
// mid-pack). The next write of NAME removes such files when no writer holds them and they are
// over a minute old; a live writer's (locked) and a fresh one stay, and so do other images'.
TEST(Image, WriteRemovesTheTemporaryFilesOfWritesThatDied) {
  const std::string dir = temp_dir() + "/stale";
  ::mkdir(dir.c_str(), 0755);
  const std::string img = dir + "/x.swapnet";
  auto make = [&](const std::string& name, bool old) {
    const std::string p = dir + "/" + name;
    spit(p, std::string(8192, 'z'));
    if (old) {
      struct timespec t[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
      EXPECT_EQ(::utimensat(AT_FDCWD, p.c_str(), t, 0), 0);
    }
    return p;
  };
  const std::string dead = make("x.swapnet.partial-AAAAAA", true);
  const std::string alive = make("x.swapnet.partial-BBBBBB", true);
  const std::string fresh = make("x.swapnet.partial-CCCCCC", false);
  const std::string other = make("y.swapnet.partial-DDDDDD", true);
  const int held = ::open(alive.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);  // as the writer holds its own
  Fixture f = make_fixture(2);
  write_fixture(f, "stale/x.swapnet");
  auto exists = [](const std::string& p) { return ::access(p.c_str(), F_OK) == 0; };
  EXPECT_FALSE(exists(dead)) << "a dead write's file is removed";
  EXPECT_TRUE(exists(alive)) << "a live writer's file stays";
  EXPECT_TRUE(exists(fresh)) << "a file under a minute old stays";
  EXPECT_TRUE(exists(other)) << "another image's file stays";
  ImageInfo got;
  EXPECT_TRUE(read_image_info(img, &got).ok());
  ::close(held);
}

// A full disk and a directory the writer may not write to (issue 18: faults during pack): the
// write fails naming the image and the errno, the image already there stays whole, and no
// temporary file is left. The disk fills up as RLIMIT_FSIZE lets a file grow only so far (the
// write then fails midway, EFBIG, as ENOSPC would); the directory is 0555 to a user who is not
// root (the test drops root in a child when it has it).
TEST(Image, WriteFailuresLeaveTheOldImageAndNoPartialFile) {
  const std::string dir = temp_dir() + "/faults";
  ::mkdir(dir.c_str(), 0755);
  const Fixture small = make_fixture(2), big = make_fixture(12, 5);
  const std::string img = write_fixture(small, "faults/x.swapnet");
  const std::string before = slurp(img);
  auto partials = [&] {
    int n = 0;
    for (const auto& e : test_util::list_dir(dir)) n += e.find(".partial-") != std::string::npos;
    return n;
  };
  auto write_big = [&] {
    return write_image(img, big.info, [&](std::size_t t) -> const void* { return big.data[t].data(); });
  };
  // In a child: the limit and the user it runs as stay there. Returns the status's message.
  auto in_child = [&](const std::function<void()>& setup) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      setup();
      const std::string m = write_big().message();
      (void)!::write(fds[1], m.data(), m.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string m;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) m.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child died: " << status;
    return m;
  };
  std::string m = in_child([] {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 64 << 10;
    ::setrlimit(RLIMIT_FSIZE, &lim);
  });
  EXPECT_NE(m.find(img + ": write: File too large (EFBIG)"), std::string::npos) << m;
  EXPECT_EQ(slurp(img), before) << "the old image stays whole";
  EXPECT_EQ(partials(), 0) << "no temporary file is left";

  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  m = in_child([] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
  });
  EXPECT_NE(m.find(img + ": cannot create a temporary file in " + dir + ": Permission denied (EACCES)"),
            std::string::npos) << m;
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(slurp(img), before);
  EXPECT_EQ(partials(), 0);
  // And the same write succeeds once it can.
  EXPECT_TRUE(write_big().ok());
}

// A pack asks before its work whether the image could be written (cli/cmd_model.cpp): the
// same error as write_image's, and nothing left behind either way.
TEST(Image, ProbeSaysWhatWriteWouldSay) {
  const std::string dir = temp_dir() + "/probe";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  EXPECT_TRUE(probe_image_path(dir + "/a.swapnet").ok());
  const std::string missing = dir + "/no/such/a.swapnet";
  Status s = probe_image_path(missing);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(missing + ": cannot create a temporary file in " + dir + "/no/such: No such file"),
            std::string::npos) << s.message();
  Status w = write_image(missing, make_fixture(2).info, [](std::size_t) -> const void* { return nullptr; });
  EXPECT_EQ(w.message(), s.message()) << "the probe and the write say the same";
  DIR* d = ::opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  int entries = 0;
  while (dirent* e = ::readdir(d)) entries += e->d_name[0] != '.';
  ::closedir(d);
  EXPECT_EQ(entries, 0) << "the probe leaves no file";
}

TEST(Image, WriteIsAtomic) {
  Fixture f = make_fixture(2);
  std::string path = write_fixture(f, "atomic.swapnet");
  std::string before = slurp(path);
  // A tensor whose bytes cannot be provided fails the write; the old image stays whole and no
  // temporary file is left behind.
  Status s = write_image(path, make_fixture(3).info, [](std::size_t) -> const void* { return nullptr; });
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(slurp(path), before);
  int partials = 0;
  std::string cmd = "ls " + temp_dir() + " | grep -c partial";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(std::fscanf(p, "%d", &partials), 1);
  ::pclose(p);
  EXPECT_EQ(partials, 0);
}

// ---- block reader -------------------------------------------------------------------------

class Reader : public ::testing::TestWithParam<int> {
 protected:
  ReaderOptions options() const {
    ReaderOptions o;
    o.request_bytes = 8192;  // small requests: many per read
    o.queue_depth = 4;
    o.allow_io_uring = GetParam() == 0;
    o.allow_direct = GetParam() != 2;
    return o;
  }
  IoBackend expected() const {
    return GetParam() == 0 ? IoBackend::kIoUring : GetParam() == 1 ? IoBackend::kPreadDirect : IoBackend::kBuffered;
  }
  void SetUp() override {
    fixture_ = make_fixture(6, 7);
    path_ = write_fixture(fixture_, "reader" + std::to_string(GetParam()) + ".swapnet");
    ASSERT_TRUE(read_image_info(path_, &info_).ok());
    bytes_ = slurp(path_);
  }
  struct Buf {
    explicit Buf(std::size_t n) : p(alloc_aligned(n)), size(n) { std::memset(p, 0xAB, n); }
    ~Buf() { free_aligned(p); }
    void* p;
    std::size_t size;
  };
  std::vector<BlockReader::Check> checks() const {
    std::vector<BlockReader::Check> c;
    for (size_t k = 0; k < info_.layers.size(); ++k) {
      const auto& L = info_.layers[k];
      if (L.size) c.push_back({L.offset, L.size, L.checksum, "layer " + std::to_string(k)});
    }
    return c;
  }
  Fixture fixture_;
  std::string path_;
  ImageInfo info_;
  std::string bytes_;
};

TEST_P(Reader, ReadsExactBytesWithChecksums) {
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, options(), &r).ok());
  EXPECT_EQ(r->backend(), expected());
  Buf buf(info_.data_size);
  Status s = r->read(info_.data_offset, info_.data_size, buf.p, checks());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(std::memcmp(buf.p, &bytes_[info_.data_offset], info_.data_size), 0);
  EXPECT_EQ(r->bytes_read(), info_.data_size);
}

// Note [An emulated disk]: reads take their bytes / the rate, one after another, and time the
// disk idled buys nothing (a blkio throttle's slice credit would let the second read through at
// once). The bytes are the file's.
TEST_P(Reader, AnEmulatedDiskServesAtItsRateWithNoCreditForIdleTime) {
  ReaderOptions o = options();
  o.emulate_bytes_per_s = static_cast<double>(info_.data_size) / 0.05;  // one read: 50 ms
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, o, &r).ok());
  Buf buf(info_.data_size);
  auto timed_read = [&] {
    std::memset(buf.p, 0, info_.data_size);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = r->read(info_.data_offset, info_.data_size, buf.p, checks());
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(std::memcmp(buf.p, &bytes_[info_.data_offset], info_.data_size), 0);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  EXPECT_GE(timed_read(), 0.049);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  EXPECT_GE(timed_read(), 0.049) << "idle time credited";
  // Two reads submitted together are served one after the other.
  Buf other(info_.data_size);
  const auto t0 = std::chrono::steady_clock::now();
  auto a = r->submit(info_.data_offset, info_.data_size, buf.p);
  auto b = r->submit(info_.data_offset, info_.data_size, other.p);
  ASSERT_TRUE(r->wait(a).ok());
  ASSERT_TRUE(r->wait(b).ok());
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.099);
}

// Note [A sustained read rate]: a disk that credits its idle time (emulate_idle_credit_s, as the
// blkio throttle's slice) serves a burst when reads come again, and bytes / busy time, taken
// over reads that each follow a pause, is well above its rate; sustained() leaves the burst out
// and sees the rate. Without credit (a real disk) both see the rate. io_uring, as the executor
// reads: the emulated disk serves a read's requests as one queue, so the pread backends' gaps
// between requests (long under TSan) are served as if queued, and neither rate is the disk's.
TEST(SustainedRate, LeavesOutTheBurstAfterIdling) {
  const std::string path = temp_dir() + "/sustained";
  const std::size_t size = 16u << 20;
  test_util::spit(path, std::string(size, '\x5a'));
  const double rate = 200e6;
  void* buf = alloc_aligned(size);
  ASSERT_NE(buf, nullptr);
  for (double credit : {0.1, 0.0}) {
    const std::string what = credit > 0 ? "with 0.1 s of idle credit" : "without credit";
    // Up to three tries, the last one checked: on this 2-core VM beside the other tests a reader
    // thread kept from its core leaves the emulated disk idle mid-read, and the credit it earns
    // comes back as a burst no pause marks (sustained 1.63 x once, bytes / busy time 2.0 x). A
    // sustained rate that kept the bursts fails all three.
    double plain = 0, sustained = 0;
#if defined(__SANITIZE_THREAD__)
    const int tries = 1;  // its rates are not checked there (below)
#else
    const int tries = 3;
#endif
    for (int attempt = 0; attempt < tries; ++attempt) {
      ReaderOptions o;
      o.request_bytes = 256u << 10;
      o.queue_depth = 4;
      o.emulate_bytes_per_s = rate;
      o.emulate_idle_credit_s = credit;
      std::unique_ptr<BlockReader> r;
      ASSERT_TRUE(BlockReader::open(path, o, &r).ok());
      ASSERT_EQ(r->backend(), IoBackend::kIoUring) << "this machine's io_uring";
      // Each read: 30 ms idle first (6 MB of credit), then 16.8 MB.
      for (int i = 0; i < 6; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        Status s = r->read(0, size, buf);
        ASSERT_TRUE(s.ok()) << s.message();
      }
      plain = static_cast<double>(r->bytes_read()) / r->busy_seconds();
      const BlockReader::Sustained st = r->sustained();
      ASSERT_GT(st.bytes, 0u) << what;
      ASSERT_GT(st.seconds, 0.0) << what;
      EXPECT_LT(st.bytes, r->bytes_read()) << what;
      sustained = static_cast<double>(st.bytes) / st.seconds;
      const bool holds = sustained > 0.5 * rate && sustained < 1.2 * rate &&
                         (credit > 0 ? plain > 1.15 * rate : plain < 1.12 * rate);
      if (holds || attempt + 1 == tries) break;
      std::cerr << what << ", try " << attempt + 1 << ": sustained " << sustained / 1e6 << " MB/s, bytes / busy time "
                << plain / 1e6 << " MB/s\n";
    }
#if defined(__SANITIZE_THREAD__)
    // Under TSan (tests/tsan_unit.sh) this test is for its threads: the reader's pacing and the
    // accounting of busy time. Its rates are not: beside preload.transparent on a fresh 2-core
    // CI machine the instrumented reads reached 0.70 x the paced rate, and the burst after idling
    // 0.56 x (the check below wants 1.15 x), twice in two runs. The uninstrumented unit run checks them.
    (void)plain;
    (void)sustained;
    continue;
#endif
    // 0.5: the paced reads lag their rate when the reader's thread waits for a core; a sustained
    // rate that lost the reads would be far below, one that kept the burst 2 x.
    EXPECT_GT(sustained, 0.5 * rate) << what;
    // 1.2: under TSan beside other tests the gaps and the burst stretch (1.127 x once, with
    // bytes / busy time at 2.01 x); the burst left in would be 2 x.
    EXPECT_LT(sustained, 1.2 * rate) << what << " (bytes / busy time: " << plain / 1e6 << " MB/s)";
    if (credit > 0) {
      EXPECT_GT(plain, 1.15 * rate) << "the burst is there to leave out";
    } else {
      EXPECT_LT(plain, 1.12 * rate) << what;
    }
  }
  free_aligned(buf);
  std::remove(path.c_str());
}

// Note [Earliest block first]: a read submitted later with a lower order is served before the
// rest of an earlier one (which waits only for its requests already in flight); with equal orders
// reads are served in the order submitted. An emulated disk makes the large read take ~200 ms.
TEST_P(Reader, ALowerOrderIsServedBeforeTheRestOfAnEarlierRead) {
  ReaderOptions o = options();
  // ~25 requests of ~25 ms each: the test thread may stall ~150 ms between the two submits.
  o.emulate_bytes_per_s = static_cast<double>(info_.data_size) / 0.6;
  Buf big(info_.data_size), small(o.request_bytes);  // outlive the reader's reads
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, o, &r).ok());
  ASSERT_GE(info_.data_size, 16 * o.request_bytes) << "the large read must outlast the queue depth";
  for (const std::uint64_t order : {1, 0}) {
    auto a = r->submit(info_.data_offset, info_.data_size, big.p, checks(), 1);
    auto b = r->submit(info_.data_offset, o.request_bytes, small.p, {}, order);
    ASSERT_TRUE(r->wait(b).ok());
    const std::uint64_t left = r->unlanded_bytes(a);
    if (order == 0) {
      EXPECT_GT(left, info_.data_size / 2) << "the later read of lower order waited for the earlier one";
    } else {
      // Equal orders: served in the order submitted (io_uring may complete the small read before
      // the large one's last requests in flight).
      EXPECT_LE(left, (o.queue_depth - 1) * o.request_bytes);
    }
    Status s = r->wait(a);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(std::memcmp(big.p, &bytes_[info_.data_offset], info_.data_size), 0);
    EXPECT_EQ(std::memcmp(small.p, &bytes_[info_.data_offset], o.request_bytes), 0);
  }
}

// busy_seconds() counts the time a read was with the kernel: within the time the reads took,
// and not the time the reader sat idle after them.
TEST_P(Reader, BusyTimeCountsOnlyTimeWithAReadInFlight) {
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, options(), &r).ok());
  EXPECT_EQ(r->busy_seconds(), 0.0);
  Buf buf(info_.data_size);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(r->read(info_.data_offset, info_.data_size, buf.p).ok());
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double busy = r->busy_seconds();
  EXPECT_GT(busy, 0.0);
  EXPECT_LE(busy, elapsed);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(r->busy_seconds(), busy) << "idle time counted as busy";
}

TEST_P(Reader, ManyReadsInFlightCompleteIndependently) {
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, options(), &r).ok());
  std::vector<std::unique_ptr<Buf>> bufs;
  std::vector<BlockReader::Ticket> tickets;
  for (const auto& L : info_.layers) {
    if (!L.size) continue;
    bufs.push_back(std::make_unique<Buf>(L.size));
    tickets.push_back(r->submit(L.offset, L.size, bufs.back()->p, {{L.offset, L.size, L.checksum, L.name}}));
  }
  for (size_t i = tickets.size(); i-- > 0;) {  // waited for in reverse order
    Status s = r->wait(tickets[i]);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  EXPECT_FALSE(r->wait(tickets[0]).ok()) << "a ticket is waited for once";
}

// cancel() drops what is not yet issued and returns once the pieces in flight have landed; the
// reads submitted after it still complete, and the reader stays usable.
TEST_P(Reader, CancelStopsAReadAndLeavesTheOthers) {
  std::unique_ptr<BlockReader> r;
  ReaderOptions o = options();
  std::atomic<int> slow{0};
  // Keep the first read going: its 24 pieces take >= 48 ms, the window in which this thread must
  // reach cancel() after submitting. 200 us each (5 ms) was lost once in a CI run at -j2, this
  // thread descheduled that long between submit() and cancel().
  o.fault = [&](std::uint64_t, std::size_t, long res) {
    slow++;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return res;
  };
  ASSERT_TRUE(BlockReader::open(path_, o, &r).ok());
  Buf all(info_.data_size), again(info_.data_size);
  BlockReader::Ticket a = r->submit(info_.data_offset, info_.data_size, all.p);
  BlockReader::Ticket b = r->submit(info_.data_offset, info_.data_size, again.p, checks());
  r->cancel(a);
  Status sa = r->wait(a);
  if (!sa.ok()) {
    EXPECT_EQ(sa.code(), ECANCELED) << sa.message();
    EXPECT_NE(sa.message().find("cancelled"), std::string::npos) << sa.message();
  }
  Status sb = r->wait(b);
  ASSERT_TRUE(sb.ok()) << sb.message();
  EXPECT_EQ(std::memcmp(again.p, &bytes_[info_.data_offset], info_.data_size), 0);
  r->cancel(b);  // a finished or unknown read: nothing happens
  EXPECT_LT(r->bytes_read(), 2 * info_.data_size) << "the cancelled read stopped early";
  EXPECT_TRUE(r->read(info_.data_offset, info_.data_size, all.p, checks()).ok());
}

TEST_P(Reader, WrongChecksumIsNamed) {
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, options(), &r).ok());
  const auto& L = info_.layers[3];
  Buf buf(L.size);
  Status s = r->read(L.offset, L.size, buf.p, {{L.offset, L.size, L.checksum ^ 1, "layer 3 (block3.conv)"}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("checksum mismatch in layer 3 (block3.conv)"), std::string::npos) << s.message();
}

TEST_P(Reader, RetriesEintrAndEagainAndContinuesShortReads) {
  ReaderOptions o = options();
  int calls = 0, faults = 0;
  o.fault = [&](std::uint64_t, std::size_t len, long res) -> long {
    ++calls;
    switch (calls % 4) {
      case 1: ++faults; return -EINTR;
      case 2: ++faults; return -EAGAIN;
      case 3:
        if (res == static_cast<long>(len) && len > 4096) {
          ++faults;
          return res - 4096;  // short by one page: the rest must be read again
        }
        return res;
      default: return res;
    }
  };
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, o, &r).ok());
  Buf buf(info_.data_size);
  Status s = r->read(info_.data_offset, info_.data_size, buf.p, checks());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GT(faults, 10);
  EXPECT_EQ(std::memcmp(buf.p, &bytes_[info_.data_offset], info_.data_size), 0);
}

TEST_P(Reader, IoErrorNamesPathOffsetLengthAndErrno) {
  ReaderOptions o = options();
  const std::uint64_t bad = info_.data_offset + 8192;
  o.fault = [&](std::uint64_t off, std::size_t, long res) -> long { return off == bad ? -EIO : res; };
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, o, &r).ok());
  Buf buf(info_.data_size);
  Status s = r->read(info_.data_offset, info_.data_size, buf.p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), EIO);
  EXPECT_NE(s.message().find(path_ + ": read 8192 bytes at offset " + std::to_string(bad) +
                             " failed: Input/output error (EIO)"),
            std::string::npos)
      << s.message();
  // The reader stays usable after an error.
  Buf one(4096);
  EXPECT_TRUE(r->read(info_.data_offset, 4096, one.p).ok());
}

TEST_P(Reader, EndOfFileAndBadRequestsAreErrors) {
  ReaderOptions o = options();
  o.fault = [](std::uint64_t, std::size_t, long res) -> long { return res > 0 ? 0 : res; };
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, o, &r).ok());
  Buf buf(8192);
  Status s = r->read(info_.data_offset, 8192, buf.p);
  EXPECT_NE(s.message().find("unexpected end of file"), std::string::npos) << s.message();
  std::unique_ptr<BlockReader> r2;
  ASSERT_TRUE(BlockReader::open(path_, options(), &r2).ok());
  s = r2->read(info_.data_offset + 1, 4096, buf.p);
  EXPECT_NE(s.message().find("must be multiples of 4096"), std::string::npos) << s.message();
  s = r2->read(info_.file_size, 4096, buf.p);
  EXPECT_NE(s.message().find("beyond the end of the file"), std::string::npos) << s.message();
}

TEST_P(Reader, LeavesNoCopyInThePageCache) {
  int fd = ::open(path_.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  std::uint64_t before = 0, after = 0;
  ASSERT_TRUE(page_cache_bytes(path_, &before).ok());
  std::unique_ptr<BlockReader> r;
  ASSERT_TRUE(BlockReader::open(path_, options(), &r).ok());
  Buf buf(info_.data_size);
  ASSERT_TRUE(r->read(info_.data_offset, info_.data_size, buf.p).ok());
  ASSERT_TRUE(page_cache_bytes(path_, &after).ok());
  EXPECT_LE(after, before + 4096) << "fetched " << info_.data_size << " bytes, cache grew by " << after - before;
}

// Two readers of one SharedDisk (Note [One disk, read by urgency]): once the more urgent one
// has pieces to issue, the other issues none until it has none, so at most the other's
// requests in flight (the disk's cap, or its queue depth) land between the urgent reader's
// first and last; the one held
// back then finishes too. Without the disk's order the two interleave throughout.
TEST_P(Reader, ASharedDiskServesTheMostUrgentReaderFirst) {
  for (unsigned cap : {2u, 0u}) {  // 0: no cap, as the Runtime uses it
  SCOPED_TRACE("cap " + std::to_string(cap));
  const long slots = cap > 0 ? cap : static_cast<long>(options().queue_depth);  // b's that may be in flight
  auto disk = std::make_shared<SharedDisk>(cap);
  std::mutex mu;
  std::string order;  // 'a' / 'b' per request landed
  auto opts = [&](char tag) {
    ReaderOptions o = options();
    o.disk = disk;
    o.fault = [&, tag](std::uint64_t, std::size_t, long res) {
      {
        std::lock_guard<std::mutex> lock(mu);
        order += tag;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(300));  // a slow disk
      return res;
    };
    return o;
  };
  std::unique_ptr<BlockReader> a, b;
  ASSERT_TRUE(BlockReader::open(path_, opts('a'), &a).ok());
  ASSERT_TRUE(BlockReader::open(path_, opts('b'), &b).ok());
  a->set_priority(0);
  b->set_priority(1);
  EXPECT_EQ(b->priority(), 1);
  constexpr int kReads = 6;
  std::vector<std::unique_ptr<Buf>> bufs;  // all before any read: none is allocated between a's submits
  for (int k = 0; k < 2 * kReads; ++k) bufs.push_back(std::make_unique<Buf>(info_.data_size));
  std::vector<BlockReader::Ticket> ta, tb;
  for (int k = 0; k < kReads; ++k) tb.push_back(b->submit(info_.data_offset, info_.data_size, bufs[k]->p));
  for (int spin = 0; spin < 5000; ++spin) {  // b alone reads first
    {
      std::lock_guard<std::mutex> lock(mu);
      if (order.size() >= 3) break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // a queues all its reads behind b (a less urgent priority) and only then becomes the most
  // urgent: otherwise a descheduled submitting thread could let a run out of pieces between two
  // submits, go idle, and let b read inside the window counted below.
  a->set_priority(2);
  for (int k = 0; k < kReads; ++k) {
    ta.push_back(a->submit(info_.data_offset, info_.data_size, bufs[kReads + k]->p, checks()));
  }
  a->set_priority(0);
  for (auto t : ta) {
    Status s = a->wait(t);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  for (auto t : tb) {
    Status s = b->wait(t);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  std::lock_guard<std::mutex> lock(mu);
  // Landing order, as the reader threads reap completions. A reader issues only after reaping,
  // and holds at most `slots` requests, so until a has landed all but `slots` of its requests it
  // still had a piece to issue and held b back (the disk grants under one mutex: once a asks as
  // the most urgent, b is granted nothing until a goes idle). The b's landing in that window are
  // those b had outstanding then: up to `slots` (1 with the pread backends), plus the rare retry
  // of an interrupted or short read, which lands twice; 2 x slots is margin for those. Counting
  // to a's last landing instead measured how late a's thread reaped on a loaded machine (31 seen
  // under TSan in a CI run). Without the priority b lands ~130-140 times in the window.
  std::vector<std::size_t> at_a;
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (order[i] == 'a') at_a.push_back(i);
  }
  ASSERT_GT(at_a.size(), static_cast<std::size_t>(slots)) << order;
  const std::size_t first = at_a.front(), held_until = at_a[at_a.size() - 1 - static_cast<std::size_t>(slots)];
  const auto b_held = std::count(order.begin() + static_cast<long>(first), order.begin() + static_cast<long>(held_until), 'b');
  EXPECT_LE(b_held, 2 * slots) << "landed: " << order;
  EXPECT_GT(std::count(order.begin(), order.end(), 'a'), 2 * kReads) << order;
  EXPECT_EQ(order.back(), 'b') << "b finishes after a: " << order;
  EXPECT_GT(disk->stats().deferred, 0u);
  EXPECT_EQ(disk->stats().granted, order.size()) << "every request went through the disk's slots";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Reader, ::testing::Values(0, 1, 2), [](const auto& i) {
  return std::string(i.param == 0 ? "io_uring" : i.param == 1 ? "pread_direct" : "buffered");
});

TEST(ReaderOptions, RefusesBadSettings) {
  std::unique_ptr<BlockReader> r;
  ReaderOptions o;
  o.request_bytes = 1000;
  EXPECT_NE(BlockReader::open("/dev/null", o, &r).message().find("request size 1000"), std::string::npos);
  EXPECT_NE(BlockReader::open("/nonexistent.swapnet", ReaderOptions{}, &r).message().find("No such file"),
            std::string::npos);
}

}  // namespace
}  // namespace swapnet
