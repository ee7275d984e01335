#!/usr/bin/env bash
# The preload library on an unmodified libtorch program (tests/preload/torch_program.cpp, not
# linked with swapnet), run as mimalloc tests its override: outputs identical with and without
# LD_PRELOAD; the stats line shows the tensor bytes came through swapnet; tensors made by
# torch::jit::load, by ops and by torch::nn are swapnet's; SWAPNET_ALLOC=off passes everything
# to c10; SWAPNET_ALLOC=managed without a usable GPU says so once and uses host memory; a program
# that does not use libtorch is unaffected. Copy-free .to(cuda) (libswapnet_dispatch.so): loaded
# where it can alias (managed memory) or when asked (SWAPNET_DISPATCH=on); other conversions keep
# PyTorch's own path; with SWAPNET_DISPATCH=alias-host the aliasing path runs on a CPU-only
# libtorch (same bytes, CUDA device, storage alive while aliased and freed after). With
# SWAPNET_EXPECT_GPU=1 (scripts/gpu-check.sh, CUDA libtorch and a GPU): managed memory, and a
# tensor moved to the GPU is aliased and computes the CPU's result.
#   preload_test.sh PRELOAD.so TORCH_PROGRAM MODEL.pt
set -u
lib=$1 prog=$2 model=$3
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1" >&2; fail=1; else echo "ok: $1"; fi; }

# The program's outputs: its first line (hashes of every output byte); the rest says what
# .to(cuda) did, which differs by design under the preload.
run() { "$@" "$prog" "$model" --to-cuda; }
plain_all=$(run env 2>/dev/null); rc_plain=$?
plain=$(head -n 1 <<<"$plain_all")
check "program runs without the preload" '[ $rc_plain -eq 0 ] && [ -n "$plain" ]'
err=$(mktemp)
pre_all=$(run env LD_PRELOAD=$lib SWAPNET_ALLOC_STATS=1 2>"$err"); rc_pre=$?
pre=$(head -n 1 <<<"$pre_all")
cat "$err"; echo "$pre_all"
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
if [ -n "${SWAPNET_EXPECT_GPU:-}" ]; then
  check "GPU: managed memory" 'grep -q "backend=managed" "$err"'
  check "GPU: .to(cuda) aliased, alive while aliased, freed after, same result as the CPU" \
    'grep -q "^to_cuda: aliased=1 cuda=1 alive_while_aliased=1 freed_after=1 equal=1$" <<<"$pre_all"'
  check "GPU: .to(cuda, half) copied" 'grep -q "^to_cuda_half: copied=1$" <<<"$pre_all"'
  check "GPU: dispatch counted one alias and one copy" 'grep -q "^swapnet-dispatch: calls=[0-9]* to_cuda=2 aliased=1 copied=1$" "$err"'
  check "GPU without the preload: .to(cuda) copies" 'grep -q "^to_cuda: aliased=0 cuda=1 .* equal=1$" <<<"$plain_all"'
else
  check "host memory: the dispatch library is not loaded (nothing to alias)" '! grep -q "^swapnet-dispatch:" "$err"'
  check "host memory: .to(cuda) takes PyTorch's path" '[ "$pre_all" = "$plain_all" ]'

  # SWAPNET_DISPATCH=on: the kernel sits in front of every CPU->CUDA _to_copy and passes it on.
  on_all=$(run env LD_PRELOAD=$lib SWAPNET_ALLOC_STATS=1 SWAPNET_DISPATCH=on 2>"$err")
  check "SWAPNET_DISPATCH=on: identical outputs and errors" '[ "$on_all" = "$plain_all" ]'
  check "SWAPNET_DISPATCH=on: kernel called, nothing aliased" 'grep -q "^swapnet-dispatch: calls=2 to_cuda=2 aliased=0 copied=2$" "$err"'
  # alias-host: the aliasing path itself, on host memory.
  al_all=$(run env LD_PRELOAD=$lib SWAPNET_ALLOC_STATS=1 SWAPNET_DISPATCH=alias-host 2>"$err")
  check "alias-host: outputs identical" '[ "$(head -n 1 <<<"$al_all")" = "$plain" ]'
  check "alias-host: same bytes on the CUDA device, alive while aliased, freed after" \
    'grep -q "^to_cuda: aliased=1 cuda=1 alive_while_aliased=1 freed_after=1 equal=-1$" <<<"$al_all"'
  check "alias-host: a dtype change takes PyTorch's path" \
    '[ "$(grep ^to_cuda_half <<<"$al_all")" = "$(grep ^to_cuda_half <<<"$plain_all")" ]'
  check "alias-host: counted" 'grep -q "^swapnet-dispatch: calls=2 to_cuda=2 aliased=1 copied=1$" "$err"'
  check "alias-host: every allocation freed" 'grep -q "allocations=\([0-9]*\) frees=\1 " "$err"'
  miss_all=$(run env LD_PRELOAD=$lib SWAPNET_DISPATCH=on SWAPNET_DISPATCH_LIB=/nonexistent/libswapnet_dispatch.so 2>"$err")
  check "missing dispatch library: said once, outputs identical" \
    '[ "$(grep -c "copy-free .to(cuda) disabled" "$err")" -eq 1 ] && [ "$miss_all" = "$plain_all" ]'
  bad_all=$(run env LD_PRELOAD=$lib SWAPNET_DISPATCH=sometimes 2>"$err")
  check "SWAPNET_DISPATCH=sometimes: said, outputs identical" \
    'grep -q "is not one of auto|on|off|alias-host" "$err" && [ "$bad_all" = "$plain_all" ]'
fi

off=$(LD_PRELOAD=$lib SWAPNET_ALLOC=off SWAPNET_ALLOC_STATS=1 "$prog" "$model" 2>"$err")
check "SWAPNET_ALLOC=off: same outputs" '[ "$plain" = "$(head -n 1 <<<"$off")" ]'
check "SWAPNET_ALLOC=off: nothing through swapnet" 'grep -q "backend=off allocations=0 frees=0 bytes=0" "$err"'
check "SWAPNET_ALLOC=off: c10 owns the tensors" 'grep -q "^owned: jit=0 op=0 nn=0$" "$err"'

if [ -z "${SWAPNET_EXPECT_GPU:-}" ]; then
  man=$(LD_PRELOAD=$lib SWAPNET_ALLOC=managed SWAPNET_ALLOC_STATS=1 "$prog" "$model" 2>"$err")
  check "SWAPNET_ALLOC=managed without a GPU: same outputs" '[ "$plain" = "$(head -n 1 <<<"$man")" ]'
  check "SWAPNET_ALLOC=managed without a GPU: said once, host memory" \
    '[ "$(grep -c "SWAPNET_ALLOC=managed but" "$err")" -eq 1 ] && grep -q "backend=host" "$err"'
fi
bogus=$(LD_PRELOAD=$lib SWAPNET_ALLOC=bogus "$prog" "$model" 2>"$err")
check "SWAPNET_ALLOC=bogus: said, default used, same outputs" \
  'grep -q "is not one of managed|host|off" "$err" && [ "$plain" = "$(head -n 1 <<<"$bogus")" ]'

echo_out=$(LD_PRELOAD=$lib SWAPNET_ALLOC_STATS=1 /bin/echo hello 2>"$err")
check "a program without libtorch is unaffected" '[ "$echo_out" = hello ] && [ ! -s "$err" ]'
sorted=$(printf '3\n1\n2\n' | LD_PRELOAD=$lib sort | tr '\n' ' ')
check "sort under the preload" '[ "$sorted" = "1 2 3 " ]'
rm -f "$err"
exit $fail
