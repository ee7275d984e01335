#!/usr/bin/env bash
# Costs learned in service (Note [Learning the costs in service] in assembly/src/executor.cpp):
# the paper's four models at the storage table's budgets (1/3 of their bytes, or their minimum)
# on an emulated disk (SWAPNET_EMULATE_READ: the block readers serve at that rate), planned with
# the profile measured at that rate ("right") and with the host-speed one ("host": a profile
# from another disk), each `swapnet run --learn 0` against `--learn 3` in its own process,
# rounds interleaved, medians. What learning is for: the second pair; what it must not cost: the
# first.
#   bench/learn.sh [--rounds N] [--iters N] [--rates "400MB/s 1GB/s"] [--models "..."]
# Needs bench/storage.sh --emulate's profiles (bench/results/storage_emulated_profile_*.json).
# Writes bench/results/learn.jsonl (one line per run) and learn.md (the table); prints the table.
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=3 iters=3 rates="400MB/s 1GB/s" list="resnet101 yolov3 fcn_resnet101 vgg19"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --models) list=$2; shift 2 ;;
    *) echo "bench/learn.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
pack_paper_models
host=$out/storage_emulated_profile_host.json
[ -f "$host" ] || { echo "bench/learn.sh: $host is missing: run bench/storage.sh --emulate first" >&2; exit 2; }
rows=$out/learn.jsonl
: > "$rows"
for rate in $rates; do
  right=$out/storage_emulated_profile_${rate//\//}.json
  [ -f "$right" ] || { echo "bench/learn.sh: $right is missing: run bench/storage.sh --emulate first" >&2; exit 2; }
  for m in $list; do
    img=$models/$m.swapnet
    budget=$(storage_budget "$img")
    for r in $(seq "$rounds"); do
      for prof in right host; do
        p=$right
        [ "$prof" = right ] || p=$host
        for learn in 0 3; do
          echo "bench/learn.sh: $m at $rate, $prof profile, --learn $learn, round $r" >&2
          SWAPNET_EMULATE_READ=$rate "$cli" run "$img" --budget "$budget" --iters "$iters" --learn "$learn" \
            --profile "$p" --input-shape "${shape[$m]}" --json |
            /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
m, rate, prof, learn, r = sys.argv[1:]
l = j.get("learning", {})
print(json.dumps({"model": m, "rate": rate, "profile": prof, "learn": int(learn), "round": int(r),
                  "ms": j["latency_ms"]["median"], "predicted_ms": j["predicted_ms"],
                  "predicted_at_open_ms": l.get("predicted_at_open_ms", j["predicted_ms"]),
                  "replans": l.get("replans", 0), "blocks": j["num_blocks"],
                  "read_mb": j["bytes_read_per_inference"] / 1e6, "learned_read_mb_s": l.get("read_mb_s"),
                  "peak_model_bytes": j["peak_model_bytes"], "budget_bytes": j["budget_bytes"]}))
' "$m" "$rate" "$prof" "$learn" "$r" >> "$rows"
        done
      done
    done
  done
done
/usr/bin/python3 - "$rows" <<'PY' | tee "$out/learn.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("| model | rate | profile | ms, learn 0 | ms, learn 3 | learn 3 / learn 0 | predicted at open | predicted learned | error at open | error learned | re-plans | blocks 0 / 3 | read MB 0 / 3 | within budget |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
keys = sorted({(r["rate"], r["model"], r["profile"]) for r in rows}, key=lambda k: (k[0], k[1], k[2] != "right"))
for rate, m, prof in keys:
    g = {l: [r for r in rows if (r["rate"], r["model"], r["profile"], r["learn"]) == (rate, m, prof, l)] for l in (0, 3)}
    a, b = med([r["ms"] for r in g[0]]), med([r["ms"] for r in g[3]])
    # Same-round ratios, then their median (the VM drifts between rounds).
    pairs = [y["ms"] / x["ms"] for x in g[0] for y in g[3] if x["round"] == y["round"]]
    p0, p3 = med([r["predicted_ms"] for r in g[0]]), med([r["predicted_ms"] for r in g[3]])
    ok = all(r["peak_model_bytes"] <= r["budget_bytes"] for r in g[0] + g[3])
    print(f"| {m} | {rate} | {prof} | {a:.1f} | {b:.1f} | {med(pairs):.3f} | {p0:.0f} | {p3:.0f} | "
          f"{abs(p0 - a) / a:.0%} | {abs(p3 - b) / b:.0%} | {med([r['replans'] for r in g[3]]):.0f} | "
          f"{med([r['blocks'] for r in g[0]]):.0f} / {med([r['blocks'] for r in g[3]]):.0f} | "
          f"{med([r['read_mb'] for r in g[0]]):.1f} / {med([r['read_mb'] for r in g[3]]):.1f} | {'yes' if ok else 'NO'} |")
PY
