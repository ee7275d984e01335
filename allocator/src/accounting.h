// Internal to allocator/: the process-wide count behind memory_stats().
#pragma once

#include <cstdint>

namespace swapnet {

// Adds `delta` bytes (negative: released) to what swapnet's allocator has placed, raising the peak.
void account_memory(std::int64_t delta);

}  // namespace swapnet
