#!/usr/bin/env bash
# Deadline scheduling vs load and vs deadline (issue 16's benchmark): scheduler/scenarios/
# self_driving_slo.json served under every scheduler, with the periods scaled (--period-scale:
# x2 is half the load, x0.5 twice it; deadlines stay) and the deadlines scaled (--slo-scale, at
# the scenario's load), at host speed and with the image's disk throttled (bench/throttle.sh).
# Rounds interleave: each round runs every point and scheduler once, schedulers in a rotating
# order, so the VM's drift spreads over all of them. Then the periodic groups scenario
# (self_driving_groups.json, Puzzle's makespan / QoE / score) under every scheduler at host speed.
#   bench/scheduler_sweep.sh [--duration S] [--rounds N] [--schedulers "threads fifo rr sel lst heft"]
#                            [--period-scales "2 1 0.5"] [--slo-scales "0.5 2"] [--rates "host 400MB/s"]
#                            [--no-groups] [--tag NAME]
# Writes bench/results/scheduler_sweep[_NAME].csv (a row per run and model, and "all"),
# scheduler_sweep[_NAME]_groups.csv, scheduler_sweep[_NAME].md (medians over rounds) and
# scheduler_sweep[_NAME].png (gnuplot: slo_met vs load per scheduler, one panel per rate).
# A scheduler "X+io" is X made disk-aware (docs/scheduler.md); the table puts it next to X:
#   bench/scheduler_sweep.sh --schedulers "lst lst+io" --period-scales 1 --slo-scales "" \
#     --rounds 4 --no-groups --tag io
set -euo pipefail
source "$(dirname "$0")/common.sh"
duration=20 rounds=1 schedulers="threads fifo rr sel lst heft" pscales="2 1 0.5" sscales="0.5 2" rates="host 400MB/s"
groups=1 tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --schedulers) schedulers=$2; shift 2 ;;
    --period-scales) pscales=$2; shift 2 ;;
    --slo-scales) sscales=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --no-groups) groups=0; shift ;;
    --tag) tag=$2; shift 2 ;;
    *) echo "bench/scheduler_sweep.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bash "$repo/scripts/setup.sh" --bench >/dev/null
pack_paper_models
scen=$repo/scheduler/scenarios
name=scheduler_sweep${tag:+_$tag}
csv=$out/$name.csv gcsv=$out/${name}_groups.csv
echo "round,rate,scheduler,period_scale,slo_scale,model,slo_met,dropped,requests,latency_median_ms,latency_p90_ms,estimate_error,dispatch_us,over_budget,equal" >"$csv"
points=""
for p in $pscales; do points+=" $p:1"; done
for q in $sscales; do points+=" 1:$q"; done
read -r -a sched <<<"$schedulers"
run_one() {  # round rate scheduler period_scale slo_scale
  local r=$1 rate=$2 s=$3 p=$4 q=$5 f
  f=$(mktemp)
  echo "== round $r, $rate, $s, period x$p, deadline x$q" >&2
  bash "$repo/bench/throttle.sh" "$rate" --path "$models" -- "$cli" serve "$scen/self_driving_slo.json" \
    --models "$models" --duration "$duration" --socket none --json --scheduler "$s" \
    --period-scale "$p" --slo-scale "$q" >"$f" || echo "bench/scheduler_sweep.sh: serve exit $? ($rate $s $p $q)" >&2
  /usr/bin/python3 - "$f" "$r" "$rate" "$s" "$p" "$q" >>"$csv" <<'PY'
import json, sys
f, r, rate, s, p, q = sys.argv[1:]
try:
    j = json.load(open(f))
except Exception:
    sys.exit(0)
row = lambda m, *v: print(",".join(str(x) for x in (r, rate, s, p, q, m, *v)))
for m in j["models"]:
    row(m["name"], m["slo_met"], m["dropped"], m["requests"], round(m["latency_ms"]["median"], 1),
        round(m["latency_ms"]["p90"], 1), round(m["estimate_error"], 3), "", m["over_budget"], m["equal"])
row("all", j["slo_met"], sum(m["dropped"] for m in j["models"]), sum(m["requests"] for m in j["models"]), "", "",
    "", round(j["dispatch_us"], 2), sum(m["over_budget"] for m in j["models"]), all(m["equal"] for m in j["models"]))
PY
  rm -f "$f"
}
k=0
for r in $(seq 1 "$rounds"); do
  for rate in $rates; do
    for pt in $points; do
      # Rotate the schedulers' order from point to point.
      n=${#sched[@]}
      for i in $(seq 0 $((n - 1))); do
        run_one "$r" "$rate" "${sched[$(((i + k) % n))]}" "${pt%%:*}" "${pt##*:}"
      done
      k=$((k + 1))
    done
  done
done
if [ "$groups" = 1 ]; then
  echo "round,scheduler,group,frames,complete,makespan_median_ms,makespan_p90_ms,qoe,score,slo_met,equal,over_budget" >"$gcsv"
  for r in $(seq 1 "$rounds"); do
    for s in "${sched[@]}"; do
      echo "== groups, round $r, $s" >&2
      f=$(mktemp)
      "$cli" serve "$scen/self_driving_groups.json" --models "$models" --duration "$duration" --socket none --json \
        --scheduler "$s" >"$f" || echo "bench/scheduler_sweep.sh: serve groups exit $? ($s)" >&2
      /usr/bin/python3 - "$f" "$r" "$s" >>"$gcsv" <<'PY'
import json, sys
f, r, s = sys.argv[1:]
try:
    j = json.load(open(f))
except Exception:
    sys.exit(0)
for g in j["groups"]:
    print(",".join(str(x) for x in (r, s, g["name"], g["frames"], g["complete"], round(g["makespan_ms"]["median"], 1),
          round(g["makespan_ms"]["p90"], 1), round(g["qoe"], 3), round(g["score"], 3), j["slo_met"],
          all(m["equal"] for m in j["models"]), sum(m["over_budget"] for m in j["models"]))))
PY
      rm -f "$f"
    done
  done
fi
/usr/bin/python3 "$repo/bench/scheduler_sweep_table.py" "$out" "$tag" >"$out/$name.md"
cat "$out/$name.md"
