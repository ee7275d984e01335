#!/usr/bin/env bash
# Builds the control-socket fuzzer with clang (libFuzzer + ASan + UBSan) and runs it for a
# bounded time (tests/fuzz_control.cpp says what it checks). Fails if the fuzzer finds a crash,
# a leak, an out-of-bounds access, a wrong answer or a client delayed by another.
#   fuzz_control.sh CLANGXX SOURCE_DIR WORK_DIR SECONDS
set -euo pipefail
clangxx=$1 src=$2 work=$3 seconds=$4
# SECONDS is the default run's (a few seconds); SWAPNET_FUZZ_SECONDS overrides it for a long run
# (scripts/test.sh --long, scripts/sanitize.sh fuzz).
seconds=${SWAPNET_FUZZ_SECONDS:-$seconds}
mkdir -p "$work/corpus" "$work/seeds"
# The server's sources and what they use of swapcore; scheduler.h needs libtorch's headers
# (declarations only: nothing of libtorch is linked). One unit (the sources #included), so that
# libtorch's headers are parsed once: 6.5 CPU-s against 11.4 (issue 49).
printf '#include "%s"\n' "$src/tests/fuzz_control.cpp" "$src/scheduler/src/control.cpp" \
  "$src/scheduler/src/control_client.cpp" "$src/swapcore/src/errors.cpp" "$src/swapcore/src/log.cpp" \
  "$src/swapcore/src/size.cpp" > "$work/unity.cpp"
"$clangxx" -std=c++17 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$src/swapcore/include" -I "$src/allocator/include" -I "$src/partitioner/include" \
  -I "$src/assembly/include" -I "$src/scheduler/include" -I "$src/scheduler/internal" \
  -I /usr/include/torch/csrc/api/include -Wno-deprecated-declarations \
  "$work/unity.cpp" -lpthread -o "$work/fuzz_control"
# Seeds: a stalled client beside a good one, a half line, an oversized line, garbage.
printf '\000\005\000\001' > "$work/seeds/status"
printf '\000\000\001\002garbage\n\003\000' > "$work/seeds/two-clients"
printf '\000\001\200%0128d' 0 > "$work/seeds/oversized"
printf '\000\005\000\002\004\000\000\005\001\001' > "$work/seeds/budget-zero"
cd "$work"
./fuzz_control -max_total_time="$seconds" -seed=1 -rss_limit_mb=2048 -max_len=8192 -timeout=10 \
  -print_final_stats=1 corpus seeds 2>&1 | tail -n 15
