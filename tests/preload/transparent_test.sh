#!/usr/bin/env bash
# Transparent swapping (Note [Transparent swapping], preload/src/jit_load.cpp): an unmodified C++
# program (jit_forward.cpp, not linked with swapnet) and an unmodified Python program
# (jit_forward.py) load resnet18 with torch::jit::load / torch.jit.load under LD_PRELOAD with
# SWAPNET_BUDGET at 40 % of the model: outputs bit-identical to the run without the preload, the
# stats line shows the budget held (peak model bytes within it), and peak RSS is lower by at
# least half of the model's weight bytes. The image is made once (SWAPNET_INPUT_SHAPE, in a
# child process), reused, and made again when the model's content changes; an image beside the
# model is taken. Every way of declining (no image and no shape, a failing pack, a budget below
# the minimum, a malformed one, one the model fits in) is said once and loads the model normally
# with the same outputs; without SWAPNET_BUDGET nothing is said. On the GPU: the model loaded or
# moved there, C++ and Python (below).
#   transparent_test.sh PRELOAD.so JIT_FORWARD PYTHON MODEL_DIR
set -u
lib=$1 prog=$2 py=$3 models=$4
pyprog=$(dirname "$0")/jit_forward.py
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1" >&2; fail=1; return 1; fi; echo "ok: $1"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$models/resnet18.pt" "$work/model.pt"
shape=1,3,224,224
err=$work/err
hwm() { awk '/^vm_hwm_kb/ {print $2}' "$err"; }
cxx() { "$@" "$prog" "$work/model.pt" $shape 2>"$err"; }
pyr() { "$@" "$py" "$pyprog" "$work/model.pt" $shape 2>"$err"; }
pre=(env LD_PRELOAD="$lib" SWAPNET_ALLOC_STATS=1)

plain_c=$(cxx env); hwm_c=$(hwm)
plain_p=$(pyr env); hwm_p=$(hwm)
check "programs run without the preload" '[[ "$plain_c" == "output "*" same=1" ]] && [[ "$plain_p" == "output "*" same=1" ]]'
weights=$("$SWAPNET_CLI" inspect "$models/resnet18.pt" --input-shape $shape --json 2>/dev/null |
  "$py" -c 'import json,sys; print(json.load(sys.stdin)["total_bytes"])')
check "weight bytes known ($weights)" '[ "${weights:-0}" -gt 1000000 ]'

# C++: the image is made on first load, the model runs swapped.
out=$(cxx "${pre[@]}" SWAPNET_BUDGET=40% SWAPNET_INPUT_SHAPE=$shape); cat "$err"
check "C++: outputs identical under SWAPNET_BUDGET=40%" '[ "$out" = "$plain_c" ]'
check "C++: the image was made once, beside the model" \
  '[ "$(grep -c "making the swap image of" "$err")" -eq 1 ] && ls "$work"/model.*.swapnet >/dev/null 2>&1'
check "C++: no temporary file left" '! ls "$work"/*.tmp.* >/dev/null 2>&1'
stats=$(grep '^swapnet-model: ' "$err")
if [[ "$stats" =~ budget=([0-9]+)\ blocks=([0-9]+)\ resident_blocks=([0-9]+)\ peak_model_bytes=([0-9]+)\ bytes_read=([0-9]+)\ inferences=2 ]]; then
  budget=${BASH_REMATCH[1]} blocks=${BASH_REMATCH[2]} peak=${BASH_REMATCH[4]} read=${BASH_REMATCH[5]}
  check "C++: swapped in $blocks blocks, peak model bytes $peak within the budget $budget, $read bytes read" \
    '[ "$blocks" -gt 1 ] && [ "$peak" -le "$budget" ] && [ "$read" -gt 0 ]'
else
  check "C++: stats line ($stats)" false
fi
hwm_cs=$(hwm)
check "C++: peak RSS $hwm_cs KiB vs $hwm_c KiB without: lower by >= half the weights ($((weights / 2048)) KiB)" \
  '[ $(( (hwm_c - hwm_cs) * 1024 )) -ge $(( weights / 2 )) ]'

# SWAPNET_LEARN (Note [Learning the costs in service]) with SWAPNET_LEARN_STORE (Note [Learned
# costs kept]): a window of 3, kept beside the image. Bad values of both in one run (LEARN=1,
# STORE=somewhere): each said once, the default used or nothing kept, the program unharmed.
out=$(cxx "${pre[@]}" SWAPNET_BUDGET=40% SWAPNET_INPUT_SHAPE=$shape SWAPNET_LEARN=3 SWAPNET_LEARN_STORE=beside)
check "C++: outputs identical under SWAPNET_LEARN=3 SWAPNET_LEARN_STORE=beside" '[ "$out" = "$plain_c" ]'
out=$(cxx "${pre[@]}" SWAPNET_BUDGET=40% SWAPNET_INPUT_SHAPE=$shape SWAPNET_LEARN=1 SWAPNET_LEARN_STORE=somewhere)
check "C++: SWAPNET_LEARN=1 and SWAPNET_LEARN_STORE=somewhere each said once, outputs identical" \
  '[ "$out" = "$plain_c" ] && [ "$(grep -c "SWAPNET_LEARN=.1. is not 0 (never) or a number of inferences in 3..1000" "$err")" -eq 1 ] &&
   [ "$(grep -c "SWAPNET_LEARN_STORE=.somewhere. is not beside or off" "$err")" -eq 1 ]'

# Python: the same image is reused.
out=$(pyr "${pre[@]}" SWAPNET_BUDGET=40% SWAPNET_INPUT_SHAPE=$shape); cat "$err"
check "Python: outputs identical under SWAPNET_BUDGET=40%" '[ "$out" = "$plain_p" ]'
check "Python: the image is reused (not made again)" '! grep -q "making the swap image" "$err" && grep -q "^swapnet-model: .*inferences=2" "$err"'
hwm_ps=$(hwm)
check "Python: peak RSS $hwm_ps KiB vs $hwm_p KiB without: lower by >= half the weights" \
  '[ $(( (hwm_p - hwm_ps) * 1024 )) -ge $(( weights / 2 )) ]'

# On the GPU (Note [Transparent swapping on the GPU], python/src/transparent.cpp): the model
# loaded there (map_location="cuda", torch::jit::load(file, kCUDA)) or moved there (.to("cuda"))
# by the C++ and the Python program, input on the GPU: outputs identical to the program's own GPU
# run, swapped on the GPU within the budget; host peak RSS and GPU memory with and without (also
# as JSON lines into $SWAPNET_GPU_ROWS when set: scripts/gpu-check.sh). Without a usable GPU the
# programs fail as they do without the preload, and the C++ load onto the GPU is declined, said
# once (Python's torch.jit.load refuses "cuda" itself before libtorch is called).
has_gpu=$("$py" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)
[ -z "${SWAPNET_EXPECT_GPU:-}" ] || check "a GPU is expected, and torch sees one" '[ "$has_gpu" = 1 ]'
field() { awk -v k="$1" '$1 == k {print $2}' "$err"; }
for where in cuda-map cuda-to; do
  for lang in C++ Python; do
    if [ $lang = C++ ]; then
      run() { "$@" "$prog" "$work/model.pt" $shape 2 $where 2>"$err"; }
    else
      run() { "$@" "$py" "$pyprog" "$work/model.pt" $shape $where 2>"$err"; }
    fi
    p=$(run env); prc=$?; p_rss=$(field vm_hwm_kb); p_gpu=$(field gpu_used_mb); p_alloc=$(field gpu_peak_allocated_mb)
    q=$(run "${pre[@]}" SWAPNET_BUDGET=50%); qrc=$?; q_rss=$(field vm_hwm_kb); q_gpu=$(field gpu_used_mb)
    q_alloc=$(field gpu_peak_allocated_mb)
    stats=$(grep '^swapnet-model: ' "$err" | tr -d '"\\' | tr '\n' ' ')
    if [ "$has_gpu" = 1 ]; then
      check "$lang $where: outputs identical to the program's own GPU run" \
        '[ $prc -eq 0 ] && [ $qrc -eq 0 ] && [ -n "$q" ] && [ "$q" = "$p" ]' || cat "$err"
      check "$lang $where: swapped on the GPU within the budget ($stats)" \
        '[[ "$stats" =~ budget=([0-9]+)\ blocks=([0-9]+)\ .*peak_model_bytes=([0-9]+)\ .*inferences=2\ device=cuda ]] &&
         [ "${BASH_REMATCH[2]}" -gt 1 ] && [ "${BASH_REMATCH[3]}" -le "${BASH_REMATCH[1]}" ]'
      echo "measured: $lang $where: host peak RSS $p_rss KiB without, $q_rss KiB with; GPU memory in use" \
        "$p_gpu MiB without, $q_gpu MiB with${p_alloc:+; peak allocated by PyTorch $p_alloc MiB without, $q_alloc MiB with}"
      [ -z "${SWAPNET_GPU_ROWS:-}" ] || echo "{\"kind\": \"transparent_gpu\", \"program\": \"$lang\", \"how\": \"$where\"," \
        "\"budget\": \"50%\", \"equal\": $([ "$q" = "$p" ] && echo true || echo false), \"stats\": \"$stats\"," \
        "\"rss_kb_without\": \"$p_rss\", \"rss_kb_with\": \"$q_rss\", \"gpu_used_mb_without\": \"$p_gpu\"," \
        "\"gpu_used_mb_with\": \"$q_gpu\", \"gpu_peak_allocated_mb_without\": \"$p_alloc\"," \
        "\"gpu_peak_allocated_mb_with\": \"$q_alloc\"}" >> "$SWAPNET_GPU_ROWS"
    else
      check "$lang $where without a GPU: fails as it does without the preload" \
        '[ $prc -ne 0 ] && [ $qrc -eq $prc ] && [ "$q" = "$p" ] && ! [[ "$stats" =~ inferences=[1-9] ]]' || cat "$err"
      [ "$lang $where" != "C++ cuda-map" ] ||
        check "C++ cuda-map without a GPU: declined, said once" \
          '[ "$(grep -c "map_location cuda: --device cuda: .*; loaded normally" "$err")" -eq 1 ]' || cat "$err"
    fi
  done
done

# The budget at run time: a watched file (SWAPNET_BUDGET_SOURCE) and the control socket
# (SWAPNET_CONTROL, driven by swapnet ctl while the program runs); outputs stay identical.
echo 30MiB > "$work/budget"
out=$("${pre[@]}" SWAPNET_BUDGET=40% SWAPNET_BUDGET_SOURCE=file:$work/budget SWAPNET_BUDGET_PERIOD_MS=10 \
  "$prog" "$work/model.pt" $shape 12 2>"$err")
check "SWAPNET_BUDGET_SOURCE: the file's budget taken, outputs identical in every run" \
  '[ "$out" = "$plain_c" ] && grep -q "^swapnet-model: .* budget=31457280 " "$err"' || cat "$err"
sock=$work/ctl.sock
"${pre[@]}" SWAPNET_BUDGET=40% SWAPNET_CONTROL=$sock "$prog" "$work/model.pt" $shape 60 >"$work/out" 2>"$err" &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
answer=$("$SWAPNET_CLI" ctl --socket "$sock" budget 24MiB 2>&1)
status=$("$SWAPNET_CLI" ctl --socket "$sock" status 2>&1)
wait $pid
check "SWAPNET_CONTROL: swapnet ctl budget answered ($answer), status lists the model" \
  '[ "$answer" = "ok 25165824" ] && [[ "$status" == *"\"budget_bytes\":25165824"* ]]' || echo "$status"
check "SWAPNET_CONTROL: the new budget held, outputs identical in every run" \
  '[ "$(cat "$work/out")" = "$plain_c" ] && grep -q "^swapnet-model: .* budget=25165824 .* inferences=60" "$err"' || cat "$err"
if [[ "$(grep '^swapnet-model: ' "$err")" =~ peak_model_bytes=([0-9]+) ]]; then
  peak=${BASH_REMATCH[1]}
  check "SWAPNET_CONTROL: peak model bytes $peak within the larger of the two budgets (24 MiB)" '[ "$peak" -le 25165824 ]'
fi

# A model that runs as loaded normally since its inputs went where it cannot run swapped (meta,
# standing in for a second GPU) has no share of a budget set at run time: the swapped one gets it
# all, the status says which is which, and the swapped one's output is unchanged.
cp "$models/mobilenet_v2.pt" "$work/other.pt"
share=$(dirname "$0")/fallback_share.py
fb_plain=$("$py" "$share" "$work/model.pt" "$work/other.pt" $shape "$SWAPNET_CLI" 20MiB 2>/dev/null)
fb=$("${pre[@]}" SWAPNET_BUDGET=70% SWAPNET_INPUT_SHAPE=$shape SWAPNET_CONTROL=$work/fb.sock \
  "$py" "$share" "$work/model.pt" "$work/other.pt" $shape "$SWAPNET_CLI" 20MiB 2>"$err")
fb_status=$(sed -n 's/^status //p' "$err")
check "a model loaded normally after its inputs moved: said once, no share of the budget (the other gets 20 MiB), outputs identical" \
  '[ -n "$fb_plain" ] && [ "$fb" = "$fb_plain" ] && grep -q "^answer ok 20971520" "$err" &&
   [ "$(grep -c "inputs are on meta, where it cannot run swapped" "$err")" -eq 1 ] &&
   [[ "$fb_status" == *"\"total_budget_bytes\":20971520"* ]] &&
   [[ "$fb_status" =~ \"budget_bytes\":20971520,[^}]*\"loaded_normally\":false,\"name\":\"[^\"]*/model.pt\" ]] &&
   [[ "$fb_status" =~ \"device\":\"none\",[^}]*\"loaded_normally\":true,\"name\":\"[^\"]*/other.pt\" ]] &&
   { grep -q "^meta forward failed" "$err" && u=0 || u=1; } &&
   grep -q "^swapnet-model: [^ ]*/other.pt .* device=none unswapped=$u\$" "$err"' || cat "$err"
rm -f "$work"/other.*

# Declined: each said once, the model loaded normally, outputs unchanged.
declined() {  # NAME EXPECTED_MESSAGE ENV...
  local name=$1 msg=$2; shift 2
  local o; o=$(cxx "${pre[@]}" "$@")
  check "$name: said once, loaded normally, same outputs" \
    '[ "$o" = "$plain_c" ] && [ "$(grep -c -- "$msg" "$err")" -eq 1 ] && ! grep -q "^swapnet-model:" "$err"' || cat "$err"
}
declined "budget below the minimum" "is below the minimum" SWAPNET_BUDGET=1MiB
declined "malformed budget" "SWAPNET_BUDGET='lots'" SWAPNET_BUDGET=lots
declined "a budget the model fits in" "fits in SWAPNET_BUDGET=100%" SWAPNET_BUDGET=100%
rm -f "$work"/model.*.swapnet "$work"/model.*.learned.json  # and what their executors learned (Note [Learned costs kept])
declined "a failing pack" "pack $work/model.pt -o .* --input-shape 1,3 failed" SWAPNET_BUDGET=40% SWAPNET_INPUT_SHAPE=1,3
check "a failing pack leaves no file" '! ls "$work"/model.* 2>/dev/null | grep -v "model.pt$" | grep -q .'
# No image and no SWAPNET_INPUT_SHAPE: made from the inputs of the first forward (Python here).
out=$(pyr "${pre[@]}" SWAPNET_BUDGET=40%)
check "no image, no input shape: made at the first forward, outputs identical, swapped" \
  '[ "$out" = "$plain_p" ] && grep -q "made at .* when forward is first called" "$err" &&
   [ "$(grep -c "making the swap image" "$err")" -eq 1 ] && grep -q "^swapnet-model: .*inferences=2" "$err"' || cat "$err"
rm -f "$work"/model.*.swapnet
# ... and a model that cannot be swapped (forward assigns an attribute): found out at the first
# forward, it then runs as loaded normally, said once, same outputs.
cp "$models/bad_stateful.pt" "$work/stateful.pt"
bad_plain=$("$prog" "$work/stateful.pt" 1,4 5 2>/dev/null)
bad=$("${pre[@]}" SWAPNET_BUDGET=10% "$prog" "$work/stateful.pt" 1,4 5 2>"$err")
check "a model that cannot be packed: runs as loaded normally from its first forward, said once, same outputs" \
  '[ -n "$bad_plain" ] && [ "$bad" = "$bad_plain" ] && [ "$(grep -c "running the model as loaded normally" "$err")" -eq 1 ] &&
   ! grep -q "^swapnet-model:" "$err" && ! ls "$work"/stateful.*.swapnet* >/dev/null 2>&1' || cat "$err"
o=$(cxx env LD_PRELOAD="$lib")
check "without SWAPNET_BUDGET: nothing said, same outputs" '[ "$o" = "$plain_c" ] && [ "$(grep -vc "^vm_hwm_kb" "$err")" -eq 0 ]'

# A model in a directory it cannot write to: the image goes to the cache directory. Needs a
# read-only mount (root ignores permission bits); said as skipped where it cannot be made.
ro=$work/ro
mkdir -p "$ro"
if mount -t tmpfs -o size=128m tmpfs "$ro" 2>/dev/null; then
  cp "$work/model.pt" "$ro/model.pt"
  if mount -o remount,ro "$ro" 2>/dev/null; then
    out=$("${pre[@]}" SWAPNET_BUDGET=40% SWAPNET_INPUT_SHAPE=$shape SWAPNET_CACHE_DIR=$work/cache \
      "$prog" "$ro/model.pt" $shape 2>"$err")
    check "read-only model directory: the image made in SWAPNET_CACHE_DIR, outputs identical" \
      '[ "$out" = "$plain_c" ] && ls "$work"/cache/model.*.swapnet >/dev/null 2>&1 &&
       grep -q "^swapnet-model: .* image=$work/cache/model\." "$err"' || cat "$err"
  else
    echo "skipped: read-only model directory (cannot remount read-only here)"
  fi
  umount "$ro"
else
  echo "skipped: read-only model directory (cannot mount a tmpfs here: not root)"
fi

# A changed model gets a new image; an image beside the model (MODEL's stem + .swapnet) is taken.
cp "$models/mobilenet_v2.pt" "$work/model.pt"
plain2=$(cxx env)
out=$(cxx "${pre[@]}" SWAPNET_BUDGET=75% SWAPNET_INPUT_SHAPE=$shape)
check "changed content: a new image, outputs identical to the new model's" \
  '[ "$out" = "$plain2" ] && grep -q "making the swap image" "$err" && [ "$(ls "$work"/model.*.swapnet | wc -l)" -eq 1 ] &&
   grep -q "^swapnet-model: " "$err"' || cat "$err"
mv "$work"/model.*.swapnet "$work/model.swapnet"
out=$(cxx "${pre[@]}" SWAPNET_BUDGET=75%)
check "an image beside the model is taken" \
  '[ "$out" = "$plain2" ] && grep -q "^swapnet-model: .* image=$work/model.swapnet " "$err"' || cat "$err"
exit $fail
