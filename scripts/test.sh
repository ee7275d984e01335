#!/usr/bin/env bash
# The test command: installs what is missing, builds, writes the test models, runs ctest, then
# builds and checks the Debian package (scripts/package.sh; SWAPNET_SKIP_PACKAGE=1 skips it).
# By default everything except the big paper models (label `model`, ~1.2 GB of files);
# pass `--all` to include them, or ctest arguments after `--`, e.g. `-- -L zoo`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
sets=(small bad zoo)
ctest_args=(-LE model)
while [ $# -gt 0 ]; do
  case "$1" in
    --all) sets+=(paper); ctest_args=(); shift ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "test.sh: unknown argument '$1' (use --all, or -- CTEST_ARGS...)" >&2; exit 2 ;;
  esac
done
bash "$repo/scripts/build.sh"
bash "$repo/scripts/models.sh" "${sets[@]}"
(cd "${BUILD_DIR:-$repo/build}" && ctest --output-on-failure -j "$(nproc)" "${ctest_args[@]}")
[ -n "${SWAPNET_SKIP_PACKAGE:-}" ] || bash "$repo/scripts/package.sh"
