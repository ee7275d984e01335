// `swapnet ctl`: a command line to a running swapnet serve's control socket. One implementation,
// built into both the `swapnet` launcher (which must answer without loading libtorch) and
// swapnet-cli. Plain POSIX: no torch headers.
#pragma once

namespace swapnet {
namespace cli {

// `PROGRAM ctl [--socket PATH] budget SIZE | status` (argv[1] is "ctl"): prints the serve's
// answer and returns 0, or 2 when the answer is an error, the arguments are wrong or no serve
// answers (said on stderr as "swapnet: error: ..."). -h/--help prints the usage and returns 0.
int ctl_main(int argc, char** argv);

}  // namespace cli
}  // namespace swapnet
