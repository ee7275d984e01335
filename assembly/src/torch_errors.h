// Turns c10::Error text into one readable sentence for swapnet's own error messages.
#pragma once

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

}  // namespace detail
}  // namespace swapnet
