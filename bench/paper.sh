#!/usr/bin/env bash
# The paper's four models at budgets of 1/2, 1/3 and 1/5 of their parameter bytes (or the
# smallest feasible budget, when larger), each measured with `swapnet run --compare --check`
# (direct, swapnet and naive each in its own process, rounds interleaved, medians).
# Writes bench/results/paper.csv and prints a markdown table.
#   bench/paper.sh [ROUNDS] [ITERS]
set -euo pipefail
rounds=${1:-3} iters=${2:-3}
source "$(dirname "$0")/common.sh"
pack_paper_models
rows=$(mktemp)
for m in resnet101 vgg19 fcn_resnet101 yolov3; do
  img=$models/$m.swapnet
  data=$("$cli" inspect "$img" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])')
  minimum=$({ "$cli" run "$img" --budget 4096 --iters 1 2>&1 || true; } | sed -n 's/.*the minimum for this model is \([0-9]*\) bytes.*/\1/p')
  for frac in 2 3 5; do
    budget=$(( data / frac > minimum ? data / frac : minimum ))
    echo "bench/paper.sh: $m at 1/$frac (budget $budget, minimum $minimum)" >&2
    "$cli" run "$img" --budget "$budget" --compare --rounds "$rounds" --iters "$iters" --check --json |
      /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
m, frac, data, minimum = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
print(",".join(str(x) for x in [m, "1/" + frac, j["budget_bytes"], minimum, data, j["num_blocks"],
      round(j["latency_ms"]["median"], 1), round(j["direct"]["latency_ms"]["median"], 1),
      round(j["ratio_vs_direct"], 3), round(j["io_bound_ms"], 1), round(j["ratio_vs_bound"], 3),
      round(j["naive"]["latency_ms"]["median"], 1), round(j["naive_ratio"], 2), j["peak_model_bytes"],
      j["peak_model_bytes"] <= j["budget_bytes"], j["peak_rss_bytes"], j["direct"]["peak_rss_bytes"],
      j["page_cache_growth_bytes"], round(j["raw_io_mb_s"]), j["equal"]]))
' "$m" "$frac" "$data" "$minimum" >> "$rows"
  done
done
header="model,fraction,budget_bytes,min_budget_bytes,model_bytes,blocks,swapnet_ms,direct_ms,ratio_vs_direct,io_bound_ms,ratio_vs_bound,naive_ms,naive_vs_swapnet,peak_model_bytes,within_budget,peak_rss_bytes,direct_peak_rss_bytes,page_cache_growth_bytes,raw_io_mb_s,equal"
{ echo "$header"; cat "$rows"; } > "$out/paper.csv"
rm -f "$rows"
/usr/bin/python3 - "$out/paper.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cols = ["model", "fraction", "budget_bytes", "blocks", "swapnet_ms", "direct_ms", "ratio_vs_direct",
        "io_bound_ms", "ratio_vs_bound", "naive_vs_swapnet", "peak_model_bytes", "within_budget",
        "page_cache_growth_bytes", "equal"]
print("| " + " | ".join(cols) + " |")
print("|" + "---|" * len(cols))
for r in rows:
    print("| " + " | ".join(r[c] for c in cols) + " |")
PY
