#!/usr/bin/env bash
# Token generation with swapped weights (issue 17's bench): the 350 M decoder (models/gpt.py,
# gpt_350m) at 1/4 and 1/2 of its weights and in memory, swapnet vs naive, at host speed and on
# emulated Jetson-class storage (bench/throttle.sh). Each run is its own process (`swapnet
# generate --json`), modes interleaved in every round; medians of ms per token over rounds.
# The bound per token is bytes read per token / the raw O_DIRECT rate measured in the same run.
#   bench/generate.sh [--rounds N] [--new-tokens M] [--prompt-tokens N] [--rates "host 1GB/s 400MB/s"]
# Writes bench/results/generate.jsonl (one line per run) and generate.md (the table).
#   bench/generate.sh --speculative [--rounds N] [--new-tokens M] [--rates ...]: speculative
# decoding (issue 50) with the trained pair of models/textgen.py (textgen, its draft held in
# memory): plain swapped generation against --draft at 1/4 and 1/2 of the target's weights (the
# draft's bytes inside the budget), in memory beside them; acceptance, tokens per pass, bytes
# read per token, the bound (bytes read per token / the raw rate of the same run). Writes
# generate_speculative.jsonl and .md.
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=2 new=8 prompt=32 rates="host 1GB/s 400MB/s"
if [ "${1:-}" = --speculative ]; then
  shift
  exec bash "$repo/bench/generate_speculative.sh" "$@"
fi
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --new-tokens) new=$2; shift 2 ;;
    --prompt-tokens) prompt=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    *) echo "bench/generate.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
m=gpt_350m img=$models/$m.swapnet
bash "$repo/scripts/models.sh" llm >/dev/null
v=0
[ -f "$img" ] && v=$("$cli" inspect "$img" --json 2>/dev/null |
  /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin).get("format_version", 0))' || echo 0)
[ "$v" -ge 4 ] || "$cli" pack "$models/$m.pt" -o "$img" --input "int64[1,$prompt]:0..50257" \
  --input "float32[24,2,1,16,0,64]" >/dev/null
data=$("$cli" inspect "$img" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])')
rows=$out/generate.jsonl
: > "$rows"
for rate in $rates; do
  tag=${rate//\//}
  # The device profile measured at this rate by bench/storage.sh (a property of the device),
  # else one measured now on this image.
  prof=$out/storage_profile_$tag.json
  if [ ! -f "$prof" ]; then
    prof=$out/generate_profile_$tag.json
    echo "bench/generate.sh: profile at $rate" >&2
    bash "$repo/bench/throttle.sh" "$rate" --path "$models" -- "$cli" profile "$img" -o "$prof" --json > /dev/null
  fi
  for r in $(seq 1 "$rounds"); do
    for run in "direct -" "swapnet 4" "naive 4" "swapnet 2" "naive 2"; do
      set -- $run
      mode=$1 div=$2
      budget=$([ "$div" = - ] && echo "$data" || echo $((data / div)))
      echo "bench/generate.sh: $rate round $r: $mode at 1/${div/-/1} of the weights" >&2
      # naive holds a block twice (run's Note [An honest naive path]): where that does not fit
      # the budget it is refused, and the row says so.
      bash "$repo/bench/throttle.sh" "$rate" --path "$models" -- "$cli" generate "$img" --mode "$mode" \
        --budget "$budget" --prompt-tokens "$prompt" --new-tokens "$new" --profile "$prof" --json \
        > "$rows.one" 2> "$rows.err" || true
      /usr/bin/python3 -c 'import json,sys
try:
    j = json.load(open(sys.argv[4])); j.pop("call_ms"); j.pop("tokens")
except ValueError:
    err = open(sys.argv[5]).read().strip().splitlines()
    if not err or "below naive" not in err[-1]: sys.exit("bench/generate.sh: " + (err[-1] if err else "no output"))
    j = {"mode": "naive", "skipped": err[-1], "budget_bytes": int(sys.argv[6])}
j["rate"], j["fraction"], j["round"] = sys.argv[1], sys.argv[2], int(sys.argv[3]); print(json.dumps(j))' \
        "$rate" "$div" "$r" "$rows.one" "$rows.err" "$budget" >> "$rows"
    done
  done
done
/usr/bin/python3 - "$rows" <<'PY' | tee "$out/generate.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
skipped = {(r["rate"], r["fraction"]): r["skipped"] for r in rows if "skipped" in r}
rows = [r for r in rows if "skipped" not in r]
keys = []
for r in rows:
    k = (r["rate"], r["mode"], r["fraction"])
    if k not in keys: keys.append(k)
print("| rate | mode | budget | budget MB | ms/token | tokens/s | time to first token ms | MB read/token | I/O bound ms/token | ms/token / bound | vs in memory | vs naive | peak model MB | page cache MB | ids equal |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
med = {}
for k in keys:
    rs = [r for r in rows if (r["rate"], r["mode"], r["fraction"]) == k]
    med[k] = statistics.median(r["ms_per_token"] for r in rs)
for k in keys:
    rate, mode, frac = k
    rs = [r for r in rows if (r["rate"], r["mode"], r["fraction"]) == k]
    ms = med[k]
    ttft = statistics.median(r["time_to_first_token_ms"] for r in rs)
    rd = statistics.median(r["bytes_read_per_token"] for r in rs) / 1e6
    bound = statistics.median(r["io_bound_ms_per_token"] for r in rs)
    direct = med.get((rate, "direct", "-"))
    naive = med.get((rate, "naive", frac)) if mode == "swapnet" else None
    b = rs[0]["budget_bytes"]
    print(f"| {rate} | {mode} | {'in memory' if frac == '-' else '1/' + frac} | {b / 1e6 if b else rows[0]['model_bytes'] / 1e6:.0f} | "
          f"{ms:.0f} | {1e3 / ms:.2f} | {ttft:.0f} | {rd:.0f} | {bound:.0f} | "
          f"{ms / bound if bound else float('nan'):.2f} | {ms / direct if direct else float('nan'):.2f} | "
          f"{ms / naive if naive else float('nan'):.2f} | {max(r['peak_model_bytes'] for r in rs) / 1e6:.0f} | "
          f"{max(r['page_cache_growth_bytes'] for r in rs) / 1e6:.0f} | {'yes' if all(r['equal'] for r in rs) else 'NO'} |")
for (rate, frac), why in skipped.items():
    print(f"| {rate} | naive | 1/{frac} | | does not fit | | | | | | | | | | |")
for why in sorted(set(skipped.values())):
    print(f"\nnaive refused: {why}")
PY
rm -f "$rows.one" "$rows.err"
