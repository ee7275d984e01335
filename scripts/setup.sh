#!/usr/bin/env bash
# Installs swapnet's build and run dependencies from Debian's registry (idempotent: only what
# is missing is installed). Needs root or sudo. Every dependency is a Debian package.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  libtorch-dev liburing-dev libfmt-dev libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libxxhash-dev
  libopenblas0-pthread
  python3-torch python3-torchvision python3-pytest
)
# --bench: also what the benchmarks need (gnuplot draws bench/scheduler.sh's timeline plot).
[ "${1:-}" = "--bench" ] && pkgs+=(gnuplot-nox)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
