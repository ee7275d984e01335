// Text for swapnet's own messages: c10 errors as one sentence, shapes as "[1,3,224,224]".
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace swapnet {
namespace detail {

// c10 messages carry backtraces and, from the TorchScript interpreter, a TorchScript traceback;
// the useful part is the last "RuntimeError: ..." line, or else the first line.
inline std::string torch_message(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  std::string m = c10e != nullptr ? c10e->what_without_backtrace() : e.what();
  const std::string tag = "RuntimeError: ";
  auto pos = m.rfind(tag);
  if (pos != std::string::npos) m = m.substr(pos + tag.size());
  auto nl = m.find('\n');
  if (nl != std::string::npos) m = m.substr(0, nl);
  while (!m.empty() && (m.back() == ' ' || m.back() == '.')) m.pop_back();
  return m;
}

inline std::string shape_text(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace detail
}  // namespace swapnet
