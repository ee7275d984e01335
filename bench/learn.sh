#!/usr/bin/env bash
# Costs learned in service (Note [Learning the costs in service] in assembly/src/cost_learner.cpp):
# the paper's four models at the storage table's budgets (1/3 of their bytes, or their minimum)
# on an emulated disk (SWAPNET_EMULATE_READ: the block readers serve at that rate) or, with
# --throttle, under the blkio throttle (bench/throttle.sh), planned with the profile measured at
# that rate ("right") and with one from another disk ("wrong": the host-speed profile, or at
# host speed the 400 MB/s one), each `swapnet run --learn 0` against `--learn 3` in its own
# process, rounds interleaved, medians; io_bound = bytes read per inference / the raw rate the
# same run measured. What learning is for: the wrong rows; what it must not cost: the right ones.
#   bench/learn.sh [--rounds N] [--iters N] [--rates "400MB/s 1GB/s"] [--models "..."] [--throttle]
# Needs bench/storage.sh's profiles (storage_emulated_profile_*.json; with --throttle,
# storage_profile_*.json). Writes bench/results/learn.jsonl (one line per run) and learn.md
# (learn_throttled.* with --throttle); prints the table.
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=3 iters=3 rates="400MB/s 1GB/s" list="resnet101 yolov3 fcn_resnet101 vgg19" throttle=""
while [ $# -gt 0 ]; do
  case "$1" in
    --throttle) throttle=1; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --models) list=$2; shift 2 ;;
    *) echo "bench/learn.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
pack_paper_models
kind=_emulated suffix=""
[ -z "$throttle" ] || kind="" suffix=_throttled
profile() {
  local f=$out/storage${kind}_profile_${1//\//}.json
  [ -f "$f" ] || { echo "bench/learn.sh: $f is missing: run bench/storage.sh ${throttle:+--emulate }first" >&2; exit 2; }
  echo "$f"
}
# A command at a rate: the readers emulating it, or under the blkio throttle.
under() {
  local rate=$1; shift
  if [ -n "$throttle" ]; then
    bash "$repo/bench/throttle.sh" "$rate" --path "$models" -- "$@"
  elif [ "$rate" = host ]; then
    "$@"
  else
    SWAPNET_EMULATE_READ=$rate "$@"
  fi
}
rows=$out/learn$suffix.jsonl
: > "$rows"
for rate in $rates; do
  right=$(profile "$rate")
  if [ "$rate" = host ]; then host=$(profile 400MB/s); else host=$(profile host); fi
  for m in $list; do
    img=$models/$m.swapnet
    budget=$(storage_budget "$img")
    for r in $(seq "$rounds"); do
      for prof in right wrong; do
        p=$right
        [ "$prof" = right ] || p=$host
        for learn in 0 3; do
          echo "bench/learn.sh: $m at $rate, $prof profile, --learn $learn, round $r" >&2
          under "$rate" "$cli" run "$img" --budget "$budget" --iters "$iters" --learn "$learn" \
            --profile "$p" --input-shape "${shape[$m]}" --json |
            /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
m, rate, prof, learn, r = sys.argv[1:]
l = j.get("learning", {})
print(json.dumps({"model": m, "rate": rate, "profile": prof, "learn": int(learn), "round": int(r),
                  "ms": j["latency_ms"]["median"], "predicted_ms": j["predicted_ms"],
                  "predicted_at_open_ms": l.get("predicted_at_open_ms", j["predicted_ms"]),
                  "replans": l.get("replans", 0), "kept_plans": l.get("kept_plans", 0), "blocks": j["num_blocks"],
                  "read_mb": j["bytes_read_per_inference"] / 1e6, "learned_read_mb_s": l.get("read_mb_s"),
                  "io_bound_ms": j["io_bound_ms"], "raw_io_mb_s": j["raw_io_mb_s"],
                  "peak_model_bytes": j["peak_model_bytes"], "budget_bytes": j["budget_bytes"]}))
' "$m" "$rate" "$prof" "$learn" "$r" >> "$rows"
        done
      done
    done
  done
done
/usr/bin/python3 - "$rows" <<'PY' | tee "$out/learn$suffix.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("| model | rate | profile | ms, learn 0 | ms, learn 3 | learn 3 / learn 0 | io_bound ms, learn 3 | learn 3 / io_bound | predicted at open | predicted learned | error at open | error learned | re-plans | blocks 0 / 3 | read MB 0 / 3 | within budget |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
keys = sorted({(r["rate"], r["model"], r["profile"]) for r in rows}, key=lambda k: (k[0], k[1], k[2] != "right"))
for rate, m, prof in keys:
    g = {l: [r for r in rows if (r["rate"], r["model"], r["profile"], r["learn"]) == (rate, m, prof, l)] for l in (0, 3)}
    a, b = med([r["ms"] for r in g[0]]), med([r["ms"] for r in g[3]])
    # Same-round ratios, then their median (the VM drifts between rounds).
    pairs = [y["ms"] / x["ms"] for x in g[0] for y in g[3] if x["round"] == y["round"]]
    p0, p3 = med([r["predicted_ms"] for r in g[0]]), med([r["predicted_ms"] for r in g[3]])
    ok = all(r["peak_model_bytes"] <= r["budget_bytes"] for r in g[0] + g[3])
    io = med([r["io_bound_ms"] for r in g[3] if "io_bound_ms" in r])
    print(f"| {m} | {rate} | {prof} | {a:.1f} | {b:.1f} | {med(pairs):.3f} | {io:.1f} | {b / io:.3f} | {p0:.0f} | {p3:.0f} | "
          f"{abs(p0 - a) / a:.0%} | {abs(p3 - b) / b:.0%} | {med([r['replans'] for r in g[3]]):.0f} | "
          f"{med([r['blocks'] for r in g[0]]):.0f} / {med([r['blocks'] for r in g[3]]):.0f} | "
          f"{med([r['read_mb'] for r in g[0]]):.1f} / {med([r['read_mb'] for r in g[3]]):.1f} | {'yes' if ok else 'NO'} |")
PY
