#!/usr/bin/env bash
# ThreadSanitizer on swapnet's own threads in every CI run (issue 18), each unit built from its
# sources with -fsanitize=thread and without libtorch's uninstrumented thread pools (OpenMP,
# OpenBLAS), which TSan cannot follow; the full TSan build of every test is
# -DSWAPNET_SANITIZE=thread (README). Fails on any race report.
#   swapcore:  the block reader's I/O thread, waiters hashing as bytes land, cancellation and the
#              SharedDisk several readers take turns on (tests/image_test.cpp);
#   cpu_meter: the CPU meter's accounts and activation regions under workers, frees on other
#              threads and cap changes (tests/cpu_meter_threads_test.cpp; libc10 only).
#   tsan_unit.sh CXX SOURCE_DIR WORK_DIR swapcore|cpu_meter
set -euo pipefail
cxx=$1 src=$2 work=$3 unit=$4
mkdir -p "$work"
flags=(-std=c++17 -O1 -g1 -fsanitize=thread -I "$src/swapcore/include")
case "$unit" in
  swapcore)
    # swapcore's sources as one unit: ~10 s of CPU where 16 units took 22 s (headers parsed once).
    for f in "$src"/swapcore/src/*.cpp; do echo "#include \"$f\""; done > "$work/swapcore_unity.cpp"
    "$cxx" "${flags[@]}" -I "$src/swapcore/src" "$src/tests/image_test.cpp" "$work/swapcore_unity.cpp" \
      -lgtest -lgtest_main -luring -lxxhash -lpthread -o "$work/$unit" ;;
  cpu_meter)
    # The test and the meter as one unit: 7.5 CPU-s against 12.5 for two (c10's headers parsed once).
    printf '#include "%s"\n' "$src/tests/cpu_meter_threads_test.cpp" "$src/assembly/src/cpu_meter.cpp" \
      > "$work/cpu_meter_unity.cpp"
    "$cxx" "${flags[@]}" -I "$src/assembly/include" -I "$src/assembly/internal" -I "$src/allocator/include" \
      -I "$src/partitioner/include" "$work/cpu_meter_unity.cpp" \
      -lc10 -lgtest -lgtest_main -lpthread -o "$work/$unit" ;;
  *) echo "tsan_unit.sh: unknown unit '$unit' (swapcore, cpu_meter)" >&2; exit 2 ;;
esac
cd "$work"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "./$unit" --gtest_brief=1 2>&1 | tail -n 30
