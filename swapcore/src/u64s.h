// A number as text, for error messages (internal to swapcore; one definition, so that the
// module's sources also compile as one unit: tests/tsan_unit.sh).
#pragma once

#include <cstdint>
#include <string>

namespace swapnet {
namespace detail {

inline std::string u64s(std::uint64_t v) { return std::to_string(v); }

}  // namespace detail
}  // namespace swapnet
