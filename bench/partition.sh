#!/usr/bin/env bash
# The partitioner on the paper's four models: a fresh device profile (swapnet profile, fitted
# on resnet101), then per model at 1/2 and 1/3 of its bytes (or its minimum, when larger):
#   - `swapnet plan --json`: predicted latency, bytes read, search/grid/lookup times;
#   - `swapnet run` with --plan auto (residency), optimal (every block re-read: the paper) and
#     equal (fewest equal-byte blocks), plus --mode direct, each in its own process, rounds
#     interleaved; medians.
# Writes bench/results/partition.{jsonl,csv,md} and bench/results/device.json.
#   bench/partition.sh [ROUNDS] [ITERS]
set -euo pipefail
rounds=${1:-3} iters=${2:-5}
source "$(dirname "$0")/common.sh"
pack_paper_models
profile=$out/device.json
echo "bench/partition.sh: profiling this device" >&2
"$cli" profile "$models/resnet101.swapnet" "$models/vgg19.swapnet" "$models/fcn_resnet101.swapnet" \
  "$models/yolov3.swapnet" -o "$profile" --json > "$out/profile.json"
rows=$out/partition.jsonl
: > "$rows"
for m in resnet101 vgg19 fcn_resnet101 yolov3; do
  img=$models/$m.swapnet
  data=$("$cli" inspect "$img" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])')
  minimum=$("$cli" plan "$img" --budget 4096 --profile "$profile" --json |
            /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["min_budget_bytes"])' || true)
  budgets=$(/usr/bin/python3 -c "
d, mn = $data, $minimum
bs = sorted({max(d // 2, mn), max(d // 3, mn)})
if len(bs) == 1: bs.append((mn + d) // 2)  # vgg19: a third and a half are below its minimum
print(' '.join(str(b) for b in bs))")
  for budget in $budgets; do
    echo "bench/partition.sh: $m at $budget (minimum $minimum, model $data)" >&2
    "$cli" plan "$img" --budget "$budget" --profile "$profile" --json |
      /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); j["kind"]="plan"; j["model"]=sys.argv[1]; print(json.dumps(j))' "$m" >> "$rows"
    for r in $(seq "$rounds"); do
      for p in auto optimal equal direct; do
        if [ "$p" = direct ]; then args=(--mode direct); else args=(--plan "$p"); fi
        "$cli" run "$img" --budget "$budget" "${args[@]}" --iters "$iters" --profile "$profile" --json |
          /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
j.update(kind="run", model=sys.argv[1], round=int(sys.argv[2]), plan_kind=sys.argv[3], bench_budget=int(sys.argv[4]))
j["latency_ms"].pop("all", None)
print(json.dumps(j))' "$m" "$r" "$p" "$budget" >> "$rows"
      done
    done
  done
done
/usr/bin/python3 "$repo/bench/partition_table.py" "$rows" "$out/partition.csv" | tee "$out/partition.md"
