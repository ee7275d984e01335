// Internal to swapcore/: what the swap image's reader (image.cpp) and writer (image_write.cpp)
// share -- the header's fixed constants and the span rule both apply to tensors. The format is
// Note [Swap image format] in image.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace detail {

inline constexpr char kMagic[8] = {'S', 'W', 'A', 'P', 'N', 'E', 'T', '\0'};
// 2: activation_bytes in the metadata; 3: peak_bytes per layer; 4: input profiles. Versions 2
// and 3 are still read.
inline constexpr std::uint32_t kVersion = kImageZoneReserveVersion;
inline constexpr std::uint32_t kOldestVersion = 2;
inline constexpr std::uint64_t kHeaderBytes = 4096;
inline constexpr std::uint64_t kHeaderChecksumAt = kHeaderBytes - 8;
inline constexpr std::uint64_t kTensorAlign = 64;  // bytes

// Bytes a strided tensor spans, or false on overflow / negative values.
bool span_bytes(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& strides,
                std::uint64_t element_size, std::uint64_t* out);

// A status for the failed system call that set errno: "<what>: <strerror> (<ENAME>)".
Status sys_error(const std::string& what);

}  // namespace detail
}  // namespace swapnet
