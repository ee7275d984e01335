#!/usr/bin/env bash
# Builds the Debian package (cpack -G DEB) into build-deb/: swapnet's libraries, CLI, preload,
# headers, CMake package and the Python package under /usr. Then checks it: its dependencies
# install on this Debian 12 (apt-get --simulate), and, unpacked in a scratch root, its preload
# runs a Python PyTorch program and its Python package imports and runs an image.
#   scripts/package.sh          -> build-deb/swapnet_VERSION_ARCH.deb
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
build=$repo/build-deb
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DSWAPNET_BUILD_TESTS=OFF >/dev/null
cmake --build "$build"
(cd "$build" && cpack -G DEB >/dev/null)
deb=$(ls -t "$build"/swapnet_*.deb | head -n 1)
echo "package: $deb"
dpkg-deb --field "$deb" Package Version Depends
apt-get install --simulate --no-install-recommends "$deb" >/dev/null && echo "package: installable here (apt-get --simulate)"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg-deb -x "$deb" "$root"
preload=$(find "$root/usr/lib" -name libswapnet_preload.so | head -n 1)
out=$(LD_PRELOAD=$preload /usr/bin/python3 -c 'import torch; print(torch.ones(2).sum())')
[ "$out" = "tensor(2.)" ] || { echo "package: the packaged preload broke a Python program: $out" >&2; exit 1; }
echo "package: its preload runs a Python PyTorch program"
# The launcher finds the full tool in libexec/swapnet/ and answers ctl itself.
libdir=$(dirname "$(find "$root/usr/lib" -name 'libswapnet.so*' | head -n 1)")
LD_LIBRARY_PATH=$libdir "$root/usr/bin/swapnet" info >/dev/null ||
  { echo "package: usr/bin/swapnet did not run the full tool (libexec/swapnet/swapnet-cli)" >&2; exit 1; }
err=$("$root/usr/bin/swapnet" ctl --socket "$root/none.sock" status 2>&1 || true)
case "$err" in *"no swapnet serve answers there"*) ;; *) echo "package: swapnet ctl: $err" >&2; exit 1 ;; esac
echo "package: usr/bin/swapnet runs libexec/swapnet/swapnet-cli and answers ctl itself"
pydir=$(dirname "$(find "$root/usr/lib" -path '*/swapnet/__init__.py' | head -n 1)")
/usr/bin/python3 -S -c "
import sys; sys.path[:0] = ['$(dirname "$pydir")', '/usr/lib/python3/dist-packages']
import swapnet; print('package: import swapnet ->', swapnet.library_path)"
