#!/usr/bin/env bash
# The test command: installs what is missing, builds, writes the test models, runs ctest, then
# builds and checks the Debian package (scripts/package.sh; SWAPNET_SKIP_PACKAGE=1 skips it).
# Ends with what the run cost: each phase, the slowest ten tests and each label's time against
# its budget (scripts/test_times.py, docs/testing.md). Sized for 10 minutes on a fresh 2-core
# machine, install and cold build included.
# By default everything except the big paper models (label `model`, ~1.2 GB of files);
#   --all    also the big-model tests;
#   --long   the long runs: fuzzers 5 minutes each, stress tests and fuzzed serves at their long
#            sizes (SWAPNET_LONG_TESTS=1, Note [Long test runs] in tests/test_util.h), and the
#            GPU tests' program compiled (it runs only on a GPU machine: scripts/gpu-check.sh);
#   -- ARGS  ctest arguments instead of the default selection, e.g. `-- -L zoo`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
sets=(small bad zoo)
ctest_args=(-LE model)
while [ $# -gt 0 ]; do
  case "$1" in
    --all) sets+=(paper); ctest_args=(); shift ;;
    --long) export SWAPNET_LONG_TESTS=1 SWAPNET_FUZZ_SECONDS=${SWAPNET_FUZZ_SECONDS:-300}; shift ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "test.sh: unknown argument '$1' (use --all, --long, or -- CTEST_ARGS...)" >&2; exit 2 ;;
  esac
done
build=${BUILD_DIR:-$repo/build}
phases=()
started=$(date +%s)
since=$started
phase() {  # NAME: the time since the last phase ended
  local now; now=$(date +%s)
  phases+=("$1 $((now - since)) s")
  since=$now
}
bash "$repo/scripts/build.sh"
# The GPU tests' program, not in the default build (tests/CMakeLists.txt): compiled in the long run.
[ -z "${SWAPNET_LONG_TESTS:-}" ] || cmake --build "$build" --target gpu_test
phase "install+build"
bash "$repo/scripts/models.sh" "${sets[@]}"
phase "models"
rc=0
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --output-junit ctest-junit.xml "${ctest_args[@]}") || rc=$?
phase "ctest"
if [ $rc -eq 0 ] && [ -z "${SWAPNET_SKIP_PACKAGE:-}" ]; then
  bash "$repo/scripts/package.sh" || rc=$?
  phase "package"
fi
/usr/bin/python3 "$repo/scripts/test_times.py" "$build" || true
echo "== test.sh: $(IFS=,; echo "${phases[*]}" | sed 's/,/, /g'); $(( $(date +%s) - started )) s in all$([ $rc -eq 0 ] || echo ", FAILED (exit $rc)")"
exit $rc
