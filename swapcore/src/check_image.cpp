// check_image: an image's layers verified against their checksums, read whole through a block
// reader in chunks, two in flight.
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string>

#include "swapnet/swapcore.h"
#include "u64s.h"

namespace swapnet {
namespace {

using detail::u64s;

}  // namespace

Status check_image(const std::string& path, const ImageInfo& info) {
  std::unique_ptr<BlockReader> reader;
  Status s = BlockReader::open(path, ReaderOptions{}, &reader);
  if (!s.ok()) return s;
  // Layers are hashed incrementally from fixed-size chunks, two chunks in flight.
  constexpr std::size_t kChunk = 8u << 20;  // bytes
  void* bufs[2] = {alloc_aligned(kChunk), alloc_aligned(kChunk)};
  if (!bufs[0] || !bufs[1]) {
    free_aligned(bufs[0]);
    free_aligned(bufs[1]);
    return Status::error(ENOMEM, path + ": cannot allocate check buffers");
  }
  XXH3_state_t* hs = XXH3_createState();
  std::uint64_t pos = info.data_offset;
  const std::uint64_t end = info.data_offset + info.data_size;
  auto chunk_len = [&](std::uint64_t at) { return static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, end - at)); };
  BlockReader::Ticket t[2] = {0, 0};
  int cur = 0;
  if (pos < end) t[cur] = reader->submit(pos, chunk_len(pos), bufs[cur]);
  std::size_t layer = 0;  // weightless layers (size 0) have nothing to check
  while (layer < info.layers.size() && info.layers[layer].size == 0) ++layer;
  XXH3_64bits_reset(hs);
  std::uint64_t layer_pos = 0;
  while (s.ok() && pos < end) {
    std::size_t n = chunk_len(pos);
    std::uint64_t next = pos + n;
    if (next < end) t[1 - cur] = reader->submit(next, chunk_len(next), bufs[1 - cur]);
    s = reader->wait(t[cur]);
    if (!s.ok()) {
      if (next < end) reader->wait(t[1 - cur]);
      break;
    }
    const char* p = static_cast<const char*>(bufs[cur]);
    std::size_t used = 0;
    while (used < n && layer < info.layers.size()) {
      const ImageLayer& L = info.layers[layer];
      std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(L.size - layer_pos, n - used));
      XXH3_64bits_update(hs, p + used, take);
      used += take;
      layer_pos += take;
      if (layer_pos == L.size) {
        if (XXH3_64bits_digest(hs) != L.checksum) {
          s = Status::error(-1, path + ": checksum mismatch in layer " + std::to_string(layer) + " (" + L.name +
                                    "), bytes [" + u64s(L.offset) + ", +" + u64s(L.size) + ")");
          break;
        }
        XXH3_64bits_reset(hs);
        layer_pos = 0;
        ++layer;
        while (layer < info.layers.size() && info.layers[layer].size == 0) ++layer;
      }
    }
    if (!s.ok() && next < end) reader->wait(t[1 - cur]);
    pos = next;
    cur = 1 - cur;
  }
  XXH3_freeState(hs);
  free_aligned(bufs[0]);
  free_aligned(bufs[1]);
  return s;
}

}  // namespace swapnet
