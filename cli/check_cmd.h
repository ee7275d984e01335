// `swapnet check IMAGE`: every layer checksum of a swap image (cli/check_cmd.cpp). It needs
// nothing of libtorch, so the launcher (cli/launcher.cpp) answers it itself, like `ctl`.
#pragma once

#include <string>

namespace swapnet {
namespace cli {

// Prints the verdict (a line, or JSON with `as_json`); returns the exit status: 0 every checksum
// matches, 1 a checksum does not (the layer named), 2 the image cannot be read.
int check_image_command(const std::string& image, bool as_json);

}  // namespace cli
}  // namespace swapnet
