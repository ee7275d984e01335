#!/usr/bin/env bash
# Transparent swapping measured as the issue asks: an unmodified C++ program (tests/jit_forward,
# not linked with swapnet) and an unmodified Python program (tests/preload/jit_forward.py) load
# a model with torch::jit::load / torch.jit.load and run forward ITERS times, without the preload
# and with LD_PRELOAD + SWAPNET_BUDGET (default 33 % of the model's weights + activations),
# rounds interleaved. Reports per program: outputs bit-identical, peak RSS (VmHWM) medians and
# their difference against the model's weight bytes, wall time, and the swapnet-model stats line.
#   bench/transparent.sh [--model resnet101] [--budget 33%] [--rounds 3] [--iters 5]
# Writes bench/results/transparent.json and transparent.md.
set -euo pipefail
source "$(dirname "$0")/common.sh"
model=resnet101 budget=33% rounds=3 iters=5
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    *) echo "bench/transparent.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
pack_paper_models
pt=$models/$model.pt
input=${shape[$model]}
build=$(dirname "$cli")
runs=$(mktemp)
for r in $(seq "$rounds"); do
  for prog in cxx python; do
    for mode in plain swapped; do
      cmd=("$build/tests/jit_forward" "$pt" "$input" "$iters")
      [ "$prog" = python ] && cmd=(/usr/bin/python3 "$repo/tests/preload/jit_forward.py" "$pt" "$input")
      envs=()
      [ "$mode" = swapped ] && envs=(LD_PRELOAD="$build/libswapnet_preload.so" SWAPNET_BUDGET="$budget"
                                   SWAPNET_INPUT_SHAPE="$input" SWAPNET_ALLOC_STATS=1)
      t0=$(date +%s.%N)
      output=$(env "${envs[@]}" "${cmd[@]}" 2>/tmp/transparent.err)
      t1=$(date +%s.%N)
      /usr/bin/python3 - "$prog" "$mode" "$output" "$t0" "$t1" /tmp/transparent.err >> "$runs" <<'PY'
import json, re, sys
prog, mode, out, t0, t1, err = sys.argv[1:]
text = open(err).read()
hwm = int(re.search(r"^vm_hwm_kb (\d+)", text, re.M).group(1)) * 1024
m = re.search(r"^swapnet-model: .*", text, re.M)
stats = dict(kv.split("=") for kv in m.group(0).split()[2:]) if m else None
print(json.dumps({"program": prog, "mode": mode, "output": out, "peak_rss_bytes": hwm,
                  "wall_s": float(t1) - float(t0), "stats": stats}))
PY
    done
  done
done
weights=$("$cli" inspect "$models/$model.swapnet" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])')
/usr/bin/python3 - "$runs" "$weights" "$model" "$budget" "$out/transparent.json" <<'PY' | tee "$out/transparent.md"
import json, statistics, sys
runs_file, weights, model, budget, dest = sys.argv[1:]
weights = int(weights)
runs = [json.loads(l) for l in open(runs_file)]
res = {"model": model, "budget": budget, "weight_bytes": weights, "programs": {}}
print(f"| program | outputs bit-identical | peak RSS without (MiB) | with SWAPNET_BUDGET={budget} (MiB) | saved / weight bytes | budget (MiB) | blocks | peak model bytes (MiB) | read per run (MiB) | wall s without / with |")
print("|---|---|---|---|---|---|---|---|---|---|")
for prog in ("cxx", "python"):
    plain = [r for r in runs if r["program"] == prog and r["mode"] == "plain"]
    sw = [r for r in runs if r["program"] == prog and r["mode"] == "swapped"]
    same = all(r["output"] == plain[0]["output"] and r["output"].endswith("same=1") for r in plain + sw)
    hp = statistics.median(r["peak_rss_bytes"] for r in plain)
    hs = statistics.median(r["peak_rss_bytes"] for r in sw)
    st = sw[-1]["stats"] or {}
    row = {"bit_identical": same, "peak_rss_plain": hp, "peak_rss_swapped": hs,
           "saved_over_weights": (hp - hs) / weights, "stats": st,
           "wall_s_plain": statistics.median(r["wall_s"] for r in plain),
           "wall_s_swapped": statistics.median(r["wall_s"] for r in sw)}
    res["programs"][prog] = row
    M = 1 << 20
    print(f"| {'C++' if prog == 'cxx' else 'Python'} | {'yes' if same else 'NO'} | {hp / M:.0f} | {hs / M:.0f} | "
          f"{row['saved_over_weights']:.2f} | {int(st.get('budget', 0)) / M:.1f} | {st.get('blocks')} | "
          f"{int(st.get('peak_model_bytes', 0)) / M:.1f} | {int(st.get('bytes_read', 0)) / max(1, int(st.get('inferences', 1))) / M:.0f} | "
          f"{row['wall_s_plain']:.1f} / {row['wall_s_swapped']:.1f} |")
json.dump(res, open(dest, "w"), indent=1)
PY
rm -f "$runs"
