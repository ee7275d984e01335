// Linked into every gtest binary: a crash (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) prints the
// stack on stderr before the default action, so a crash on a machine without a debugger (the
// GPU machines) names where it happened. backtrace() is preloaded here, outside the handler.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>

namespace {

void on_crash(int sig) {
  const char* name = strsignal(sig);
  (void)!write(2, "\n*** crash: ", 12);
  (void)!write(2, name, std::strlen(name));
  (void)!write(2, "; stack:\n", 9);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
const bool installed = false;  // the sanitizers report crashes themselves
#else
const bool installed = [] {
  void* warm[1];
  (void)backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) signal(sig, on_crash);
  return true;
}();
#endif

}  // namespace
