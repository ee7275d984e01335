// Internal to libswapnet_torch.so: transparent swapping's swap images and notices
// (transparent_image.cpp), for transparent.cpp.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

namespace swapnet {
namespace transparent {

// Through the one logger, once per key. Transparent swapping is asked for by the environment,
// so its notices are on (warn) unless SWAPNET_LOG says otherwise: "said once on stderr".
void notices_on();
void say(const std::string& key, const std::string& message);
std::string env(const char* name);  // "" when unset
std::string stem_of(const std::string& p);
bool is_file(const std::string& p, struct stat* st = nullptr);  // a regular file (and its stat)
// Runs the swapnet CLI with `args` in a child process without the preload; its stdout goes to
// *captured when given, else to stderr (the program's stdout is the program's). "" on success,
// else why.
std::string run_cli(std::vector<std::string> args, std::string* captured = nullptr);
// Where the image for `model` is or goes: an existing image (MODEL-stem.swapnet beside it, not
// older, or the content-keyed one beside it or in the cache), else `*make_at` says where to
// make one (beside the model if writable, else the cache). "" and *why on failure.
std::string find_image(const std::string& model, std::string* make_at, std::string* why);
// Makes the image at `out` for inputs of these shapes ("" or why): `swapnet pack` in a child.
std::string make_image(const std::string& model, const std::string& out, const std::string& shapes);
// SWAPNET_BUDGET's text: bytes, "60MiB", or a percentage of `full`; throws Error naming it.
std::uint64_t parse_budget(const std::string& text, std::uint64_t full);

}  // namespace transparent
}  // namespace swapnet
