#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh) and builds swapnet into build/ (Release, Ninja,
# ccache). Extra arguments go to cmake's configure step, e.g. -DSWAPNET_SANITIZE=address,undefined.
# BUILD_DIR overrides the build directory.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
build=${BUILD_DIR:-$repo/build}
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$build"
