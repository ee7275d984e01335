#!/usr/bin/env bash
# Builds the scenario-file fuzzer with clang (libFuzzer + ASan + UBSan) and runs it for a bounded
# time, seeded with the shipped scenarios (tests/fuzz_scenario.cpp says what it checks). Fails if
# the fuzzer finds a crash, a leak, an exception other than a named error, or a scenario accepted
# that does not hold together.
#   fuzz_scenario.sh CLANGXX SOURCE_DIR WORK_DIR SECONDS
set -euo pipefail
clangxx=$1 src=$2 work=$3 seconds=$4
# SECONDS is the default run's (a few seconds); SWAPNET_FUZZ_SECONDS overrides it for a long run
# (scripts/test.sh --long, scripts/sanitize.sh fuzz).
seconds=${SWAPNET_FUZZ_SECONDS:-$seconds}
mkdir -p "$work/corpus" "$work/seeds"
# The parser and what it uses of swapcore; scheduler.h needs libtorch's headers (declarations
# only: nothing of libtorch is linked). One unit (the sources #included), so that libtorch's
# headers are parsed once: 12.2 CPU-s against 18.2 (issue 49).
printf '#include "%s"\n' "$src/tests/fuzz_scenario.cpp" "$src/cli/scenario.cpp" \
  "$src/swapcore/src/errors.cpp" "$src/swapcore/src/log.cpp" "$src/swapcore/src/size.cpp" > "$work/unity.cpp"
"$clangxx" -std=c++17 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$src/swapcore/include" -I "$src/allocator/include" -I "$src/partitioner/include" \
  -I "$src/assembly/include" -I "$src/scheduler/include" -I "$src/cli" \
  -I /usr/include/torch/csrc/api/include -Wno-deprecated-declarations \
  "$work/unity.cpp" -o "$work/fuzz_scenario"
cp "$src"/scheduler/scenarios/*.json "$work/seeds/"
# Inputs it found once (replayed every run): workers_1e20.json, an integer field JSON reads as a
# float no int holds (UBSan: float-to-int out of range).
cp "$src"/tests/fuzz_scenario_regressions/* "$work/seeds/"
cd "$work"
./fuzz_scenario -max_total_time="$seconds" -seed=1 -rss_limit_mb=2048 -max_len=8192 -timeout=10 \
  -dict="$src/tests/fuzz_scenario.dict" \
  -print_final_stats=1 corpus seeds 2>&1 | tail -n 15
