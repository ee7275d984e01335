#!/usr/bin/env bash
# Builds the image-parser fuzzer with clang (libFuzzer + ASan + UBSan) and runs it for a bounded
# time, seeded with a real image. Fails if the fuzzer finds a crash, a leak, an out-of-bounds
# access or an allocation over the limit.
#   fuzz_image.sh CLANGXX SOURCE_DIR WORK_DIR SEED_IMAGE SECONDS
set -euo pipefail
clangxx=$1 src=$2 work=$3 seed=$4 seconds=$5
# SECONDS is the default run's (a few seconds); SWAPNET_FUZZ_SECONDS overrides it for a long run
# (scripts/test.sh --long, scripts/sanitize.sh fuzz).
seconds=${SWAPNET_FUZZ_SECONDS:-$seconds}
mkdir -p "$work/corpus" "$work/seeds"
# One unit (the sources #included): the headers parsed once, 2.7 CPU-s against 4.5 (issue 49).
printf '#include "%s"\n' "$src/tests/fuzz_image.cpp" "$src/swapcore/src/image.cpp" \
  "$src/swapcore/src/errors.cpp" "$src/swapcore/src/log.cpp" "$src/swapcore/src/size.cpp" > "$work/unity.cpp"
"$clangxx" -std=c++17 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$src/swapcore/include" "$work/unity.cpp" -lxxhash -o "$work/fuzz_image"
if [ -f "$seed" ]; then
  # Header and metadata are what the parser reads; the parameter data only makes inputs long.
  head -c 65536 "$seed" > "$work/seeds/image-prefix"
  cp "$seed" "$work/seeds/image-whole" 2>/dev/null || true
else
  echo "fuzz_image.sh: seed image $seed missing; fuzzing from an empty corpus" >&2
fi
cd "$work"
./fuzz_image -max_total_time="$seconds" -seed=1 -malloc_limit_mb=64 -rss_limit_mb=2048 -max_len=70000 \
  -print_final_stats=1 corpus seeds 2>&1 | tail -n 15
