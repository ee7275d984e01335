#!/usr/bin/env bash
# Installs swapnet's build and run dependencies from Debian's registry (idempotent: only what
# is missing is installed). Needs root or sudo. Every dependency is a Debian package.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  libtorch-dev liburing-dev libfmt-dev libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libxxhash-dev
  libopenblas0-openmp
  python3-torch python3-torchvision python3-pytest
)
# --bench: also what the benchmarks need (gnuplot draws bench/scheduler.sh's timeline plot).
[ "${1:-}" = "--bench" ] && pkgs+=(gnuplot-nox)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# OpenBLAS's OpenMP build, selected for libblas/liblapack/libopenblas: libtorch's linear layers
# then run on the calling thread's OpenMP pool. The pthread build keeps a pool of its own, whose
# threads wait for cores behind the OpenMP helpers still spinning after a model's convolutions
# (Note [BLAS on the OpenMP pool] in scheduler/src/intra_op.cpp: vgg19's linear blocks 4-5 ms
# slower after another model's step, 1.3x its direct latency).
blas_to_set() {
  local dir multi lib
  for dir in /usr/lib/*/openblas-openmp; do
    [ -d "$dir" ] || continue
    multi=${dir%/openblas-openmp}
    multi=${multi##*/}
    for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
      [ -e "$dir/$lib" ] || continue
      [ "$(readlink -f "/usr/lib/$multi/$lib")" = "$(readlink -f "$dir/$lib")" ] || echo "$lib-$multi $dir/$lib"
    done
  done
}

if [ ${#missing[@]} -eq 0 ] && [ -z "$(blas_to_set)" ]; then
  echo "setup: all ${#pkgs[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]} (and select OpenBLAS's OpenMP build)" >&2; exit 1; }
  sudo=sudo
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
blas_to_set | while read -r name path; do
  $sudo update-alternatives --quiet --set "$name" "$path"
  echo "setup: $name -> $path (OpenBLAS's OpenMP build)"
done
echo "setup: done"
