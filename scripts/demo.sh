#!/usr/bin/env bash
# The main job on the built-in default model: installs what is missing, builds, writes
# resnet101 (random weights), packs it into a swap image, checks the image, measures this
# device's cost model, plans, and runs it swapped within a budget of a third of its weights
# (60 MiB), compared with direct in-memory inference and the naive swapping path (each in its
# own process), outputs checked bit for bit. Ends with a summary (scripts/demo_summary.py): size,
# budget, peak memory with and without swapnet, latency against direct and the physical bound,
# bit-identical; and a plot of memory over time where gnuplot is installed.
# Each step prints a line; its full output (the layer table, the plan, the comparison) goes to a
# file in .cache/demo/ that the line names; --verbose prints them all as well.
# MODEL=NAME SHAPE=1,3,H,W BUDGET=SIZE choose another model from models/export.py.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
verbose=0
for arg in "$@"; do
  case "$arg" in
    -v|--verbose) verbose=1 ;;
    *) echo "demo.sh: unknown argument '$arg' (--verbose prints every step's full output)" >&2; exit 2 ;;
  esac
done
model=${MODEL:-resnet101}
shape=${SHAPE:-1,3,224,224}
budget=${BUDGET:-60MiB}
bash "$repo/scripts/build.sh"
bash "$repo/scripts/models.sh" "$model"
pt=${SWAPNET_MODELS:-$repo/.cache/models}/$model.pt
cli="${BUILD_DIR:-$repo/build}/swapnet"
out=${DEMO_DIR:-$repo/.cache/demo}
mkdir -p "$out"
img=${pt%.pt}.swapnet

# step FILE TITLE CMD...: runs CMD with its output in FILE (and on the screen with --verbose);
# prints TITLE, and the output's last line unless --verbose showed it all.
step() {
  local file=$1 title=$2; shift 2
  echo "== $title   (full output: $file)"
  if ! "$@" >"$file" 2>&1; then
    cat "$file" >&2
    echo "demo: '$*' failed (its output is above and in $file)" >&2
    exit 1
  fi
  case "$file" in
    *.json) [ $verbose -eq 0 ] || /usr/bin/python3 -m json.tool "$file" ;;  # the summary reads it
    *) if [ $verbose -eq 1 ]; then cat "$file"; else tail -n 1 "$file" | sed 's/^/   /'; fi ;;
  esac
}
step "$out/inspect.txt" "swapnet inspect $pt   (every layer: bytes, FLOPs, time)" \
  "$cli" inspect "$pt" --input-shape "$shape"
step "$out/pack.json" "swapnet pack $pt -o $img" "$cli" pack "$pt" -o "$img" --input-shape "$shape" --json
step "$out/check.txt" "swapnet check $img" "$cli" check "$img"
step "$out/profile.txt" "swapnet profile $img   (this device's cost model, once)" "$cli" profile "$img"
step "$out/plan.txt" "swapnet plan $img --budget $budget" "$cli" plan "$img" --budget "$budget"
step "$out/trace.txt" "swapnet run $img --budget $budget --trace $out/trace.json   (for the plot)" \
  "$cli" run "$img" --budget "$budget" --iters 2 --trace "$out/trace.json"
step "$out/compare.json" "swapnet run $img --budget $budget --compare --check --json   (direct, swapnet, naive)" \
  "$cli" run "$img" --budget "$budget" --compare --check --json
/usr/bin/python3 "$repo/scripts/demo_summary.py" "$out" "$model" "$budget"
