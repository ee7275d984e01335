#!/usr/bin/env bash
# One ctest test that runs a group of gtest tests in one process (Note [Unit tests in groups] in
# tests/CMakeLists.txt): the binary's output as it is, its exit status if it failed; 77 (ctest's
# SKIP_RETURN_CODE: the group shows as skipped, never as passed) if a test in it skipped.
#   gtest_chunk.sh BINARY --gtest_filter=...
# OPENBLAS_THREAD_TIMEOUT=4 unless set (or GOTO_THREAD_TIMEOUT): the environment the CLI's
# launcher gives its commands (Note [OpenBLAS's idle spin] in cli/launcher.cpp). With OpenBLAS's
# default the idle threads poll sched_yield: 210 CPU-s for the unit label against 164 with it, on
# 2 cores, 2026-11-28 (issue 49).
[ -n "${GOTO_THREAD_TIMEOUT:-}" ] || export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || exit "$rc"
if grep -q '^\[  SKIPPED \]' "$out"; then
  echo "gtest_chunk.sh: a test of this group skipped (above): the group is reported as skipped"
  exit 77
fi
