#!/usr/bin/env bash
# ThreadSanitizer on swapcore in every CI run (issue 18): the block reader's I/O thread, waiters
# hashing as bytes land, cancellation and the SharedDisk several readers take turns on, built
# from source with -fsanitize=thread (no libtorch, whose uninstrumented OpenMP pool TSan cannot
# follow; the full TSan build of every test is -DSWAPNET_SANITIZE=thread, README).
# Fails on any race report.
#   tsan_swapcore.sh CXX SOURCE_DIR WORK_DIR
set -euo pipefail
cxx=$1 src=$2 work=$3
mkdir -p "$work"
"$cxx" -std=c++17 -O1 -g -fsanitize=thread -I "$src/swapcore/include" \
  "$src/tests/image_test.cpp" "$src"/swapcore/src/*.cpp \
  -lgtest -lgtest_main -luring -lxxhash -lpthread -o "$work/image_test_tsan"
cd "$work"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ./image_test_tsan --gtest_brief=1 2>&1 | tail -n 30
