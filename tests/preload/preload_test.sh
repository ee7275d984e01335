#!/usr/bin/env bash
# The preload library on an unmodified libtorch program (tests/preload/torch_program.cpp, not
# linked with swapnet), run as mimalloc tests its override: outputs identical with and without
# LD_PRELOAD; the stats line shows the tensor bytes came through swapnet; tensors made by
# torch::jit::load, by ops and by torch::nn are swapnet's; SWAPNET_ALLOC=off passes everything
# to c10; SWAPNET_ALLOC=managed without a usable GPU says so once and uses host memory; a program
# that does not use libtorch is unaffected.
#   preload_test.sh PRELOAD.so TORCH_PROGRAM MODEL.pt
set -u
lib=$1 prog=$2 model=$3
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1" >&2; fail=1; else echo "ok: $1"; fi; }

plain=$("$prog" "$model" 2>/dev/null); rc_plain=$?
check "program runs without the preload" '[ $rc_plain -eq 0 ] && [ -n "$plain" ]'
err=$(mktemp)
pre=$(LD_PRELOAD=$lib SWAPNET_ALLOC_STATS=1 "$prog" "$model" 2>"$err"); rc_pre=$?
cat "$err"
check "program runs under the preload" '[ $rc_pre -eq 0 ]'
check "outputs identical with and without the preload" '[ "$plain" = "$pre" ]'
stats=$(grep '^swapnet-preload: ' "$err" | tail -n 1)
check "stats line printed at exit" '[[ "$stats" =~ ^swapnet-preload:\ backend=(host|managed)\ allocations=([0-9]+)\ frees=([0-9]+)\ bytes=([0-9]+)\ peak_bytes=([0-9]+)$ ]]'
if [[ "$stats" =~ allocations=([0-9]+)\ frees=([0-9]+)\ bytes=([0-9]+)\ peak_bytes=([0-9]+) ]]; then
  allocs=${BASH_REMATCH[1]} frees=${BASH_REMATCH[2]} bytes=${BASH_REMATCH[3]} peak=${BASH_REMATCH[4]}
  model_bytes=$(stat -c %s "$model")
  check "hundreds of tensors came through swapnet ($allocs)" '[ "$allocs" -gt 100 ]'
  check "at least the model's bytes came through swapnet ($bytes >= 0.9 x $model_bytes file bytes)" \
    '[ "$bytes" -ge $(( model_bytes * 9 / 10 )) ]'
  check "peak within the total, frees within the allocations" '[ "$peak" -le "$bytes" ] && [ "$frees" -le "$allocs" ]'
fi
check "jit weights, op results and nn parameters are swapnet's" 'grep -q "^owned: jit=1 op=1 nn=1$" "$err"'

off=$(LD_PRELOAD=$lib SWAPNET_ALLOC=off SWAPNET_ALLOC_STATS=1 "$prog" "$model" 2>"$err")
check "SWAPNET_ALLOC=off: same outputs" '[ "$plain" = "$off" ]'
check "SWAPNET_ALLOC=off: nothing through swapnet" 'grep -q "backend=off allocations=0 frees=0 bytes=0" "$err"'
check "SWAPNET_ALLOC=off: c10 owns the tensors" 'grep -q "^owned: jit=0 op=0 nn=0$" "$err"'

if [ -z "${SWAPNET_EXPECT_GPU:-}" ]; then
  man=$(LD_PRELOAD=$lib SWAPNET_ALLOC=managed SWAPNET_ALLOC_STATS=1 "$prog" "$model" 2>"$err")
  check "SWAPNET_ALLOC=managed without a GPU: same outputs" '[ "$plain" = "$man" ]'
  check "SWAPNET_ALLOC=managed without a GPU: said once, host memory" \
    '[ "$(grep -c "SWAPNET_ALLOC=managed but" "$err")" -eq 1 ] && grep -q "backend=host" "$err"'
fi
bogus=$(LD_PRELOAD=$lib SWAPNET_ALLOC=bogus "$prog" "$model" 2>"$err")
check "SWAPNET_ALLOC=bogus: said, default used, same outputs" \
  'grep -q "is not one of managed|host|off" "$err" && [ "$plain" = "$bogus" ]'

echo_out=$(LD_PRELOAD=$lib SWAPNET_ALLOC_STATS=1 /bin/echo hello 2>"$err")
check "a program without libtorch is unaffected" '[ "$echo_out" = hello ] && [ ! -s "$err" ]'
sorted=$(printf '3\n1\n2\n' | LD_PRELOAD=$lib sort | tr '\n' ' ')
check "sort under the preload" '[ "$sorted" = "1 2 3 " ]'
rm -f "$err"
exit $fail
