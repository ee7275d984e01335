// Helpers shared by the torch-facing tests: model paths and error messages.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace test_util {

// A model written by models/export.py into $SWAPNET_MODELS (scripts/test.sh sets it up).
inline std::string model(const std::string& name) {
  const char* dir = std::getenv("SWAPNET_MODELS");
  return std::string(dir ? dir : ".cache/models") + "/" + name + ".pt";
}

// The message of the swapnet::Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace test_util
}  // namespace swapnet
