#!/usr/bin/env bash
# Two read-ahead modes side by side: by default streaming into the ring (Note [Streaming into
# the ring]) against waiting for a block's whole room (ring-whole); `--modes "ring ring-blocks"`
# compares layer-by-layer pipelining (Note [Layer by layer] in assembly/src/read_ahead.cpp) with
# block by block; `--modes "ring ring-reserved"` lending the activation reserve to blocks (Note
# [Lending the activation reserve]) with keeping it for activations; `--modes "ring ring-serial"`
# reading blocks past a streamed block that waits with reading nothing after it until it is whole
# (Note [Streaming into the ring]). The paper's four models at the storage table's budgets (1/3 of their bytes or
# their minimum), on emulated storage (bench/throttle.sh), each mode in its own process, modes
# interleaved within every round; medians of the per-run medians.
#   bench/stream.sh [--rounds N] [--iters N] [--rates "400MB/s 1GB/s"] [--models "..."]
#                   [--modes "ring ring-whole"] [--tag NAME] [--emulate]
# --emulate: the readers emulate each rate (SWAPNET_EMULATE_READ; Note [An emulated disk] in
# swapcore/src/emulated_disk.cpp: no credit for idle time) instead of the blkio throttle, with the
# profiles bench/storage.sh --emulate measured (storage_emulated_profile_<rate>.json); files get
# the suffix _emulated.
# Plans with the profile bench/storage.sh measured under each throttle
# (bench/results/storage_profile_<rate>.json; measured here when missing). Writes
# bench/results/stream[_TAG].jsonl (one line per run) and stream[_TAG].md (the table). Exits 77
# when the disk cannot be throttled.
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=3 iters=5 rates="400MB/s 1GB/s" list="resnet101 yolov3 fcn_resnet101 vgg19" modes="ring ring-whole" tag="" emulate=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --models) list=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --tag) tag=_$2; shift 2 ;;
    --emulate) emulate=1; shift ;;
    *) echo "bench/stream.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
pack_paper_models
throttle=$repo/bench/throttle.sh
[ -z "$emulate" ] || tag="${tag}_emulated"
rows=$out/stream$tag.jsonl
: > "$rows"
for rate in $rates; do
  if [ -n "$emulate" ]; then
    prof=$out/storage_emulated_profile_${rate//\//}.json
    [ -f "$prof" ] || { echo "bench/stream.sh: no $prof: run bench/storage.sh --emulate first" >&2; exit 2; }
  else
    prof=$(rate_profile "$rate")
  fi
  for m in $list; do
    img=$models/$m.swapnet
    budget=$(storage_budget "$img")
    for r in $(seq "$rounds"); do
      for mode in $modes; do
        echo "bench/stream.sh: $m at $rate, $mode, round $r" >&2
        if [ -n "$emulate" ] && [ "$rate" != host ]; then
          run_at=(env SWAPNET_EMULATE_READ="$rate" bash "$throttle" host)
        else
          run_at=(bash "$throttle" "$rate")
        fi
        "${run_at[@]}" --path "$models" -- "$cli" run "$img" --budget "$budget" --check \
          --iters "$iters" --profile "$prof" --read-ahead "$mode" --input-shape "${shape[$m]}" --json |
          /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
print(json.dumps({"model": sys.argv[1], "rate": sys.argv[2], "mode": sys.argv[3], "round": int(sys.argv[4]),
                  "budget_bytes": j["budget_bytes"], "median_ms": j["latency_ms"]["median"],
                  "all_ms": j["latency_ms"]["all"], "io_bound_ms": j["io_bound_ms"],
                  "predicted_ms": j["predicted_ms"], "streamed_blocks": j.get("streamed_blocks", 0),
                  "bit_identical": j.get("equal"), "peak_model_bytes": j["peak_model_bytes"],
                  "read_wait_ms": j.get("pipeline", {}).get("read_wait_ms"),
                  "lent_peak_bytes": j.get("pipeline", {}).get("lent_peak_bytes", 0),
                  "zone_misses": j.get("pipeline", {}).get("zone_misses", 0),
                  "disk_busy_fraction": j.get("pipeline", {}).get("disk_busy_fraction"),
                  "read_past_streamed": j.get("pipeline", {}).get("read_past_streamed", 0)}))
' "$m" "$rate" "$mode" "$r" >> "$rows"
      done
    done
  done
done
/usr/bin/python3 - "$rows" $modes <<'PY' | tee "$out/stream$tag.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
A, B = sys.argv[2], sys.argv[3]
print(f"| model | rate | {A} ms | {B} ms | {A} / {B} | per-round ratios | io_bound ms | {A} / io_bound | predicted {A} ms | "
      f"streamed blocks per run | read wait ms {A} / {B} | lent MB {A} / {B} | disk busy {A} / {B} | bit-identical | within budget |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
keys = []
for r in rows:
    if (r["model"], r["rate"]) not in keys: keys.append((r["model"], r["rate"]))
for m, rate in keys:
    sel = [r for r in rows if r["model"] == m and r["rate"] == rate]
    by = {mode: [r for r in sel if r["mode"] == mode] for mode in (A, B)}
    med = {k: statistics.median([r["median_ms"] for r in v]) for k, v in by.items()}
    ratios = [a["median_ms"] / b["median_ms"] for a, b in zip(by[A], by[B])]
    wait = {k: statistics.median([r.get("read_wait_ms") or 0 for r in v]) for k, v in by.items()}
    io = statistics.median([r["io_bound_ms"] for r in sel])
    ok = all(r["bit_identical"] is True for r in sel)
    within = all(r["peak_model_bytes"] <= r["budget_bytes"] for r in sel)
    lent = {k: max([r.get("lent_peak_bytes") or 0 for r in v] or [0]) / 1e6 for k, v in by.items()}
    busy = {k: statistics.median([r.get("disk_busy_fraction") or 0 for r in v]) for k, v in by.items()}
    print(f"| {m} | {rate} | {med[A]:.0f} | {med[B]:.0f} | {med[A] / med[B]:.3f} | "
          f"{', '.join(f'{x:.2f}' for x in ratios)} | {io:.0f} | {med[A] / io:.3f} | "
          f"{statistics.median([r['predicted_ms'] for r in by[A]]):.0f} | "
          f"{statistics.median([r['streamed_blocks'] for r in by[A]]):.0f} | {wait[A]:.1f} / {wait[B]:.1f} | "
          f"{lent[A]:.1f} / {lent[B]:.1f} | {100 * busy[A]:.0f} / {100 * busy[B]:.0f} % | "
          f"{'yes' if ok else 'NO'} | {'yes' if within else 'NO'} |")
PY
