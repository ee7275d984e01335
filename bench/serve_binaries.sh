#!/usr/bin/env bash
# Two builds of swapnet side by side under `serve` (bench/binaries.sh does the same for `run`): a
# scheduler or serve change against the commit before it. Each SLO scenario at each load and
# rate (bench/throttle.sh), each run in its own process, the two builds interleaved in every
# round (which goes first alternates); medians over rounds of slo_met, XRBench score and the
# estimate errors (per step, per block, per ms of work: median over the models).
#   bench/serve_binaries.sh --a CLI --b CLI [--rounds N] [--scenarios "self_driving_slo"]
#                           [--loads "0.9"] [--rates "host 1GB/s"] [--duration S] [--tag NAME]
# CLI: a `swapnet` launcher with its swapnet-cli beside it (e.g. a worktree of the older commit
# built with `cmake -B build -DSWAPNET_BUILD_TESTS=OFF && ninja -C build swapnet swapnet-cli`).
# Writes bench/results/serve_binaries[_TAG].jsonl and .md.
set -euo pipefail
source "$(dirname "$0")/common.sh"
a="" b="" rounds=3 scenarios="self_driving_slo" loads="0.9" rates="host 1GB/s" duration=30 tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --a) a=$2; shift 2 ;;
    --b) b=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --scenarios) scenarios=$2; shift 2 ;;
    --loads) loads=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --tag) tag=_$2; shift 2 ;;
    *) echo "bench/serve_binaries.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for x in "$a" "$b"; do
  [ -n "$x" ] && [ -x "$x" ] || { echo "bench/serve_binaries.sh: --a and --b must name swapnet binaries (got '$x')" >&2; exit 2; }
done
pack_paper_models
rows=$out/serve_binaries$tag.jsonl
: > "$rows"
for r in $(seq "$rounds"); do
  for rate in $rates; do
    for sc in $scenarios; do
      for load in $loads; do
        order="a b"
        [ $((r % 2)) = 0 ] && order="b a"
        for which in $order; do
          bin=$a
          [ "$which" = b ] && bin=$b
          echo "bench/serve_binaries.sh: $sc at load $load, $rate, build $which, round $r" >&2
          bash "$repo/bench/throttle.sh" "$rate" --path "$models" -- "$bin" serve "$repo/scheduler/scenarios/$sc.json" \
            --models "$models" --duration "$duration" --socket none --json --load "$load" |
            /usr/bin/python3 -c '
import json, statistics, sys
j = json.load(sys.stdin)
ms = j["models"]
med = lambda k: statistics.median(m.get(k, 0) for m in ms)
print(json.dumps({"scenario": sys.argv[1], "load": float(sys.argv[2]), "rate": sys.argv[3], "build": sys.argv[4],
                  "round": int(sys.argv[5]), "slo_met": j["slo_met"], "xrbench_score": j.get("xrbench_score"),
                  "step": med("estimate_error"), "block": med("estimate_block_error"), "per_ms": med("estimate_time_error"),
                  "worst_step": max(m.get("estimate_error", 0) for m in ms), "driver_cpu_s": j.get("driver_cpu_s"),
                  "duration_s": j["duration_s"], "over_budget": sum(m["over_budget"] for m in ms),
                  "over_byte_s": j["memory"]["over_byte_s"], "equal": all(m["equal"] for m in ms)}))
' "$sc" "$load" "$rate" "$which" "$r" >> "$rows"
        done
      done
    done
  done
done
/usr/bin/python3 - "$rows" "$a" "$b" <<'PY' | tee "$out/serve_binaries$tag.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"A: {sys.argv[2]}  \nB: {sys.argv[3]}\n\nMedians over rounds; estimate errors: the median over the models of each run, "
      "and the worst model's per step.\n")
print("| scenario | load | rate | slo_met A / B | XRBench A / B | per step A / B | worst model per step A / B | "
      "per block A / B | per ms A / B | driver CPU s A / B | runs | over budget | bit-identical |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
keys = []
for r in rows:
    k = (r["scenario"], r["load"], r["rate"])
    if k not in keys: keys.append(k)
for sc, load, rate in keys:
    sel = [r for r in rows if (r["scenario"], r["load"], r["rate"]) == (sc, load, rate)]
    def med(w, k):
        v = [r[k] for r in sel if r["build"] == w and r[k] is not None]
        return statistics.median(v) if v else float("nan")
    cell = lambda k, f: f"{med('a', k):{f}} / {med('b', k):{f}}"
    print(f"| {sc} | {load} | {rate} | {cell('slo_met', '.3f')} | {cell('xrbench_score', '.3f')} | {cell('step', '.3f')} | "
          f"{cell('worst_step', '.3f')} | {cell('block', '.3f')} | {cell('per_ms', '.3f')} | {cell('driver_cpu_s', '.2f')} | "
          f"{len(sel)} | {sum(r['over_budget'] for r in sel)} ({sum(r['over_byte_s'] for r in sel):.0f} byte-s) | "
          f"{'yes' if all(r['equal'] for r in sel) else 'NO'} |")
PY
