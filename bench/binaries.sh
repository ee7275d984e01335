#!/usr/bin/env bash
# Two builds of swapnet side by side: an engine or planner change against the commit before it,
# each build planning with its own planner and running with its own engine. The paper's four
# models at the storage table's budgets (1/3 of their bytes or their minimum) on emulated
# storage (bench/throttle.sh), each run in its own process, the two builds interleaved in every
# round (which goes first alternates); medians of the runs' medians.
#   bench/binaries.sh --a CLI --b CLI [--rounds N] [--iters N] [--rates "host 2GB/s 1GB/s 400MB/s"]
#                     [--models "..."] [--tag NAME]
# CLI: a `swapnet` binary (e.g. a worktree of the older commit built with
# `cmake -B build -DSWAPNET_BUILD_TESTS=OFF && ninja -C build swapnet swapnet-cli`). Plans with
# the profile bench/storage.sh measured under each throttle (bench/results/storage_profile_<rate>.json;
# measured here with build A when missing). Writes bench/results/binaries[_TAG].jsonl and .md.
# Exits 77 when the disk cannot be throttled.
set -euo pipefail
source "$(dirname "$0")/common.sh"
a="" b="" rounds=3 iters=5 rates="host 2GB/s 1GB/s 400MB/s" list="resnet101 yolov3 fcn_resnet101 vgg19" tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --a) a=$2; shift 2 ;;
    --b) b=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --models) list=$2; shift 2 ;;
    --tag) tag=_$2; shift 2 ;;
    *) echo "bench/binaries.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for x in "$a" "$b"; do
  [ -n "$x" ] && [ -x "$x" ] || { echo "bench/binaries.sh: --a and --b must name swapnet binaries (got '$x')" >&2; exit 2; }
done
pack_paper_models
throttle=$repo/bench/throttle.sh
rows=$out/binaries$tag.jsonl
: > "$rows"
for rate in $rates; do
  prof=$(rate_profile "$rate" "$a")
  for m in $list; do
    img=$models/$m.swapnet
    budget=$(storage_budget "$img")
    for r in $(seq "$rounds"); do
      order="a b"
      [ $((r % 2)) = 0 ] && order="b a"
      for which in $order; do
        bin=$a
        [ "$which" = b ] && bin=$b
        echo "bench/binaries.sh: $m at $rate, build $which, round $r" >&2
        bash "$throttle" "$rate" --path "$models" -- "$bin" run "$img" --budget "$budget" --check \
          --iters "$iters" --profile "$prof" --input-shape "${shape[$m]}" --json |
          /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
print(json.dumps({"model": sys.argv[1], "rate": sys.argv[2], "build": sys.argv[3], "round": int(sys.argv[4]),
                  "budget_bytes": j["budget_bytes"], "median_ms": j["latency_ms"]["median"],
                  "all_ms": j["latency_ms"]["all"], "io_bound_ms": j["io_bound_ms"],
                  "predicted_ms": j["predicted_ms"], "blocks": j["num_blocks"],
                  "bytes_read_per_inference": j["bytes_read_per_inference"],
                  "bit_identical": j.get("equal"), "peak_model_bytes": j["peak_model_bytes"],
                  "read_wait_ms": j.get("pipeline", {}).get("read_wait_ms")}))
' "$m" "$rate" "$which" "$r" >> "$rows"
      done
    done
  done
done
/usr/bin/python3 - "$rows" "$a" "$b" <<'PY' | tee "$out/binaries$tag.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"A: {sys.argv[2]}  \nB: {sys.argv[3]}\n")
print("| model | rate | A ms | B ms | A / B | per-round ratios | blocks A / B | read MB A / B | predicted ms A / B | "
      "A read wait ms | io_bound ms | bit-identical | within budget |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
keys = []
for r in rows:
    if (r["model"], r["rate"]) not in keys: keys.append((r["model"], r["rate"]))
ratios_all = []
for m, rate in keys:
    sel = [r for r in rows if r["model"] == m and r["rate"] == rate]
    by = {w: sorted([r for r in sel if r["build"] == w], key=lambda r: r["round"]) for w in ("a", "b")}
    med = {w: statistics.median([r["median_ms"] for r in v]) for w, v in by.items()}
    per = [x["median_ms"] / y["median_ms"] for x, y in zip(by["a"], by["b"])]
    ratios_all.append(med["a"] / med["b"])
    pick = lambda w, k: statistics.median([r[k] for r in by[w]])
    wait = [r["read_wait_ms"] for r in by["a"] if r.get("read_wait_ms") is not None]
    ok = all(r["bit_identical"] is True for r in sel)
    within = all(r["peak_model_bytes"] <= r["budget_bytes"] for r in sel)
    print(f"| {m} | {rate} | {med['a']:.0f} | {med['b']:.0f} | {med['a'] / med['b']:.3f} | "
          f"{', '.join(f'{x:.2f}' for x in per)} | {pick('a', 'blocks'):.0f} / {pick('b', 'blocks'):.0f} | "
          f"{pick('a', 'bytes_read_per_inference') / 1e6:.0f} / {pick('b', 'bytes_read_per_inference') / 1e6:.0f} | "
          f"{pick('a', 'predicted_ms'):.0f} / {pick('b', 'predicted_ms'):.0f} | "
          f"{statistics.median(wait) if wait else float('nan'):.1f} | {statistics.median([r['io_bound_ms'] for r in sel]):.0f} | "
          f"{'yes' if ok else 'NO'} | {'yes' if within else 'NO'} |")
print(f"\nA / B over the cells: median {statistics.median(ratios_all):.3f}, "
      f"range {min(ratios_all):.3f} .. {max(ratios_all):.3f}; A faster in {sum(x < 1 for x in ratios_all)} of {len(ratios_all)}")
PY
