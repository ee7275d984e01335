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
# `import swapnet` in Debian's python3 from this tree: a .pth file naming python/ (the package
# finds build/libswapnet_torch.so beside it). Only for the default build directory, and only
# where that python's site directory is writable (else say how to use it).
if [ "$build" = "$repo/build" ] && [ -z "${SWAPNET_NO_PYTHON_PATH:-}" ] && [ -x /usr/bin/python3 ]; then
  site=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
  if mkdir -p "$site" 2>/dev/null && echo "$repo/python" > "$site/swapnet-source.pth" 2>/dev/null; then
    echo "build: python3 imports swapnet from $repo/python ($site/swapnet-source.pth)"
  else
    echo "build: $site is not writable; use PYTHONPATH=$repo/python to import swapnet" >&2
  fi
fi
