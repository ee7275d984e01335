#!/usr/bin/env bash
# The sanitizer runs of issue 18 in one command: builds swapnet with ThreadSanitizer (`thread`,
# into build-tsan/) or AddressSanitizer + UndefinedBehaviorSanitizer (`address`, build-asan/) and
# runs the tests that exercise swapnet's threads and memory -- the unit tests (reader, ring,
# executor, resume, scheduler, runtime, control socket) and the CLI tests, whose commands then
# run the sanitized CLI (pack, run, plan, serve with its control socket). Any sanitizer report
# makes that test fail (exitcode 66).
#   scripts/sanitize.sh thread|address [-- CTEST_ARGS...]
#   scripts/sanitize.sh fuzz     the fuzzers 5 minutes each (SWAPNET_FUZZ_SECONDS) and the TSan units
# Not under it: the paper models (label `model`, too slow instrumented); the fuzzers and the
# per-unit TSan builds (their own sanitizers, in every CI run); the package check; the tests that
# run Debian's python3 (an uninstrumented interpreter cannot host the TSan runtime, and ASan must
# be preloaded before it: python.module, preload.python, preload.transparent, which runs a Python
# program too); and Executor.AShrinkingBudgetGivesTheFreedHeapBack, which checks what glibc's
# malloc keeps and malloc_trim gives back (a sanitizer brings its own allocator). libtorch itself
# is not instrumented (TSAN_OPTIONS below, and tests/sanitizers/tsan.supp). Takes 30-60 minutes
# on 2 cores; not part of scripts/test.sh.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-}
shift || true
case "$kind" in
  # The fuzzers' and the TSan units' long runs (the default test run gives each a few seconds):
  # five minutes of fuzzing each, the long stress sizes (Note [Long test runs] in tests/test_util.h).
  fuzz) exec env SWAPNET_FUZZ_SECONDS="${SWAPNET_FUZZ_SECONDS:-300}" SWAPNET_LONG_TESTS=1 SWAPNET_SKIP_PACKAGE=1 \
          bash "$repo/scripts/test.sh" -- -L 'fuzz|tsan' "$@" ;;
  thread) build=${BUILD_DIR:-$repo/build-tsan}; sanitize=thread ;;
  address) build=${BUILD_DIR:-$repo/build-asan}; sanitize=address,undefined ;;
  *) echo "sanitize.sh: say thread, address or fuzz (then optionally -- CTEST_ARGS)" >&2; exit 2 ;;
esac
ctest_args=(-LE 'model|fuzz|tsan|gpu'
            -E '^(python\.module|preload\.(python|transparent)|package\..*|Executor\.AShrinkingBudgetGivesTheFreedHeapBack)$')
if [ "${1:-}" = "--" ]; then shift; ctest_args=("$@"); fi
BUILD_DIR=$build bash "$repo/scripts/build.sh" -DSWAPNET_SANITIZE=$sanitize
bash "$repo/scripts/models.sh" small bad zoo
# ignore_noninstrumented_modules: libtorch, OpenMP and OpenBLAS are not built with TSan, so their
# own synchronisation (reference counts, pool barriers) is invisible to it, and a free or delete they
# call after it raced, in TSan's eyes, with our threads' earlier use (e.g. a tensor's last reference
# dropped inside Executor::step while the caller had released its own). Interceptors called from
# them are not checked; every access of swapnet's own code still is.
export SWAPNET_LONG_TESTS=1  # the stress tests at their long sizes
export TSAN_OPTIONS="suppressions=$repo/tests/sanitizers/tsan.supp ignore_noninstrumented_modules=1 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
# verify_asan_link_order: the preload tests put the ASan-built preload library before the program's
# own ASan runtime in LD_PRELOAD.
export ASAN_OPTIONS="detect_leaks=0 verify_asan_link_order=0 exitcode=66 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 exitcode=66 ${UBSAN_OPTIONS:-}"
cd "$build"
ctest --output-on-failure --timeout 1800 "${ctest_args[@]}"
