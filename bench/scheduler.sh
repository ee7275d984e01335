#!/usr/bin/env bash
# Several models in one budget (issue #7): the paper's three scenarios (scheduler/scenarios/)
# served by `swapnet serve`, each under
#   paper   the paper's budgeter (Eq. 1)                       -- swapnet as the paper runs it
#   minmax  the budget split minimising the largest predicted latency
#   equal   an equal split of the same total (the paper's ablation of its budgeter)
#   direct  every model whole in memory (a total that fits all: no swapping; the paper's DInf)
# one after the other on the same machine, every output compared with direct inference. Then the
# paper's Fig. 18: the self-driving models while the budget is cut twice (budget_cuts.json), as
# a timeline CSV and a plot drawn by gnuplot (Debian's gnuplot-nox; scripts/setup.sh --bench).
#   bench/scheduler.sh [DURATION_S]    (default 30 per run; the plot run lasts 60)
# Writes bench/results/scheduler.csv, scheduler_<scenario>_<variant>.json,
# scheduler_fig18_timeline.csv, scheduler_fig18.json and scheduler_fig18.png.
set -euo pipefail
source "$(dirname "$0")/common.sh"
duration=${1:-30}
bash "$repo/scripts/setup.sh" --bench >/dev/null
pack_paper_models
scen=$repo/scheduler/scenarios
csv=$out/scheduler.csv
echo "scenario,variant,model,total_budget_bytes,budget_bytes,min_budget_bytes,full_bytes,blocks,peak_model_bytes,median_ms,p90_ms,requests,equal,over_budget" >"$csv"
for s in self_driving road_side_unit uav; do
  for v in paper minmax equal direct; do
    args=(--policy paper)
    case $v in
      minmax | equal) args=(--policy "$v") ;;
      direct) args=(--budget 1000%) ;;
    esac
    echo "== $s $v" >&2
    "$cli" serve "$scen/$s.json" --models "$models" --duration "$duration" --socket none --json "${args[@]}" \
      >"$out/scheduler_${s}_${v}.json"
    python3 - "$out/scheduler_${s}_${v}.json" "$s" "$v" >>"$csv" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for m in j["models"]:
    print(",".join(str(x) for x in (sys.argv[2], sys.argv[3], m["name"], j["total_budget_bytes"], m["budget_bytes"],
          m["min_budget_bytes"], m["full_bytes"], m["blocks"], m["peak_model_bytes"], round(m["latency_ms"]["median"], 1),
          round(m["latency_ms"]["p90"], 1), m["requests"], m["equal"], m["over_budget"])))
PY
  done
done
echo "== fig18" >&2
"$cli" serve "$scen/budget_cuts.json" --models "$models" --socket none --json \
  --timeline "$out/scheduler_fig18_timeline.csv" >"$out/scheduler_fig18.json"
# Per model latency (points) and the total budget (line, right axis) over time.
gnuplot <<GP
set terminal pngcairo size 1100,600 noenhanced
set output "$out/scheduler_fig18.png"
set datafile separator ","
set title "budget cut twice while 4 models run (budget_cuts.json): latency per request and total budget"
set xlabel "time (s)"
set ylabel "latency (ms)"
set y2label "total budget (MiB)"
set y2tics
set ytics nomirror
set key outside right
models = "yolov3 fcn_resnet101 vgg19 resnet101"
plot for [m in models] "$out/scheduler_fig18_timeline.csv" using 1:(strcol(2) eq m ? \$3 : 1/0) skip 1 with linespoints title m, \
     "$out/scheduler_fig18_timeline.csv" using 1:(\$4/1048576) skip 1 axes x1y2 with steps lw 2 lc rgb "black" title "budget"
GP
python3 "$repo/bench/scheduler_table.py" "$out" >"$out/scheduler.md"
cat "$out/scheduler.md"
