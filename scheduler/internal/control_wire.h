// The control socket's wire, shared by the server (control.cpp, in libswapnet) and the client
// (control_client.cpp, also built into the `swapnet` launcher, which does not load libtorch:
// `swapnet ctl` answers in milliseconds). Internal: plain POSIX, no torch headers.
#pragma once

#include <sys/un.h>

#include <string>

#include "swapnet/swapcore.h"

namespace swapnet {

// As in scheduler.h (which needs libtorch's headers; this does not).
SWAPNET_API std::string control_request(const std::string& path, const std::string& line);
SWAPNET_API std::string default_control_path();

namespace wire {
sockaddr_un socket_address(const std::string& path);  // throws Error when the path is too long
std::string read_line(int fd);                        // up to '\n' or 4,096 bytes
void write_all(int fd, const std::string& s);         // a gone peer: no SIGPIPE, stops
}  // namespace wire

}  // namespace swapnet
