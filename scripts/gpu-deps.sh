#!/usr/bin/env bash
# Downloads (here, where Debian's registry is reachable) the .deb files scripts/gpu-check.sh
# unpacks on a GPU machine that has no package registry, into .gpu-deps/ (ignored by git; carry
# it to the device). The GPU machine brings its own libtorch (pip), CUDA, CMake and ninja.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$repo/.gpu-deps"
cd "$repo/.gpu-deps"
rm -f ./*.deb
apt-get -o APT::Sandbox::User=root download liburing-dev liburing2 libxxhash-dev libxxhash0 nlohmann-json3-dev libcli11-dev \
  libgtest-dev libgmock-dev >/dev/null
ls -l ./*.deb | awk '{s += $5} END {printf "gpu-deps: %d files, %.1f MiB in .gpu-deps/\n", NR, s / 1048576}'
