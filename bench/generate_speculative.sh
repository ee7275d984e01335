#!/usr/bin/env bash
# bench/generate.sh --speculative (its header says what): speculative decoding against plain
# swapped generation, with the trained pair of models/textgen.py. Each run is its own process
# (`swapnet generate --json`), modes interleaved in every round; medians over rounds.
#   bench/generate_speculative.sh [--rounds N] [--new-tokens M] [--rates "host 1GB/s 400MB/s"]
#                                 [--fractions "1/4 1/2"]  (of the target's weights: the budget,
#                                 the draft's share inside it)
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=3 new=64 rates="host 1GB/s 400MB/s" fractions="1/4 1/2"
while [ $# -gt 0 ]; do
  case "$1" in
    --fractions) fractions=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --new-tokens) new=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    *) echo "bench/generate.sh --speculative: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bash "$repo/scripts/models.sh" textgen textgen_draft >/dev/null
vocab_file=$models/textgen_vocab.json
v=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$vocab_file")
img=$models/textgen.swapnet dimg=$models/textgen_draft.swapnet
# Their empty KV caches, as models/textgen.py shapes them.
spec() { /usr/bin/python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import textgen; print(textgen.cache_spec("textgen", sys.argv[2]))' "$repo/models" "$1"; }
[ "$img" -nt "$models/textgen.pt" ] || "$cli" pack "$models/textgen.pt" -o "$img" --input "int64[1,16]:0..$v" \
  --input "$(spec target)" >/dev/null
[ "$dimg" -nt "$models/textgen_draft.pt" ] || "$cli" pack "$models/textgen_draft.pt" -o "$dimg" \
  --input "int64[1,16]:0..$v" --input "$(spec draft)" >/dev/null
data=$("$cli" inspect "$img" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])')
prompt="The licenses for most software and other practical works are designed to take away your freedom to share and change the works."
rows=$out/generate_speculative.jsonl
: > "$rows"
for rate in $rates; do
  for r in $(seq 1 "$rounds"); do
    runs=("direct - -")
    for f in $fractions; do runs+=("plain $f -" "speculative $f auto"); done
    for run in "${runs[@]}"; do
      set -- $run
      mode=$1 div=$2 k=$3
      args=(--new-tokens "$new" --vocab-file "$vocab_file" --prompt-text "$prompt" --json)
      if [ "$mode" = direct ]; then
        args+=(--mode direct)
      else
        args+=(--budget $((data * ${div%/*} / ${div#*/})))
      fi
      [ "$mode" = speculative ] && args+=(--draft "$dimg" --speculate "$k")
      echo "bench/generate.sh --speculative: $rate round $r: $mode at ${div/-/1} of the weights" >&2
      bash "$repo/bench/throttle.sh" "$rate" --path "$models" -- "$cli" generate "$img" "${args[@]}" > "$rows.one"
      /usr/bin/python3 -c 'import json,sys
j = json.load(open(sys.argv[4]))
for k in ("call_ms", "tokens", "pass_k", "pass_tokens"): j.pop(k, None)
j["rate"], j["fraction"], j["round"], j["run"] = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
print(json.dumps(j))' "$rate" "$div" "$r" "$rows.one" "$mode" >> "$rows"
    done
  done
done
# Long runs in memory (Note [Speculative decoding], floating point): the target checks k + 1
# tokens per call where plain decoding scores one; every token compared with plain greedy
# generation, over prompts of random ids (seeds 1..8) and 400 tokens each.
long=$out/generate_speculative_long.jsonl
: > "$long"
for seed in 1 2 3 4 5 6 7 8; do
  for k in auto 8; do
    echo "bench/generate.sh --speculative: long run, seed $seed, k $k" >&2
    "$cli" generate "$img" --mode direct --draft "$dimg" --speculate "$k" --prompt-tokens 16 --new-tokens 400 \
      --seed "$seed" --json | /usr/bin/python3 -c 'import json,sys
j = json.load(sys.stdin)
print(json.dumps({"seed": int(sys.argv[1]), "k": sys.argv[2], "tokens": len(j["tokens"]), "equal": j["equal"],
                  "first_difference": j["first_difference"], "acceptance_rate": j["acceptance_rate"],
                  "tokens_per_pass": j["tokens_per_pass"]}))' "$seed" "$k" >> "$long"
  done
done
rm -f "$rows.one"
/usr/bin/python3 - "$rows" "$long" <<'PY' | tee "$out/generate_speculative.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = []
for r in rows:
    k = (r["rate"], r["run"], r["fraction"])
    if k not in keys: keys.append(k)
med = lambda rs, f: statistics.median(f(r) for r in rs)
print(f"textgen ({rows[0]['model_bytes'] / 1e6:.1f} MB, models/textgen.py) with its draft "
      f"({next((r['draft_bytes'] for r in rows if 'draft_bytes' in r), 0) / 1e6:.1f} MB) held in memory; "
      f"{rows[0]['new_tokens']} new tokens; medians of {max(r['round'] for r in rows)} interleaved rounds.\n")
print("| rate | mode | budget | tokens/s | vs plain | ms/token | I/O bound ms/token | ms/token / bound | MB read/token | "
      "acceptance | tokens/pass | mean k | draft share of time | peak MB / budget MB | ids equal |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
tps = {}
for k in keys:
    rs = [r for r in rows if (r["rate"], r["run"], r["fraction"]) == k]
    tps[k] = med(rs, lambda r: r["tokens_per_s"])
for k in keys:
    rate, run, frac = k
    rs = [r for r in rows if (r["rate"], r["run"], r["fraction"]) == k]
    plain = tps.get((rate, "plain", frac))
    ms = med(rs, lambda r: r["ms_per_token"])
    bound = med(rs, lambda r: r["io_bound_ms_per_token"])
    spec = run == "speculative"
    b = rs[0]["budget_bytes"]
    print(f"| {rate} | {run} | {'in memory' if frac == '-' else frac} | {tps[k]:.1f} | "
          f"{tps[k] / plain if plain and run != 'direct' else float('nan'):.2f} | {ms:.1f} | {bound:.1f} | "
          f"{ms / bound if bound else float('nan'):.2f} | {med(rs, lambda r: r['bytes_read_per_token']) / 1e6:.1f} | "
          f"{med(rs, lambda r: r['acceptance_rate']) if spec else float('nan'):.2f} | "
          f"{med(rs, lambda r: r['tokens_per_pass']) if spec else 1:.2f} | "
          f"{med(rs, lambda r: r['k_mean']) if spec else 0:.1f} | "
          f"{med(rs, lambda r: r['draft_ms_share']) if spec else 0:.2f} | "
          f"{max(r['peak_model_bytes'] for r in rs) / 1e6:.1f} / {b / 1e6 if b else float('nan'):.1f} | "
          f"{'yes' if all(r['equal'] for r in rs) else 'NO'} |")
long = [json.loads(l) for l in open(sys.argv[2])]
diff = [r for r in long if not r["equal"]]
print(f"\nLong runs in memory: {len(long)} generations of {long[0]['tokens']} tokens (prompts of 16 random ids, "
      f"seeds 1-8, k auto and 8): {sum(r['tokens'] for r in long)} tokens, {len(diff)} generations differing from "
      f"plain greedy decoding" + (": first differences at " + ", ".join(str(r["first_difference"]) for r in diff)
                                  if diff else "") +
      f"; acceptance {statistics.median(r['acceptance_rate'] for r in long):.2f}, "
      f"{statistics.median(r['tokens_per_pass'] for r in long):.2f} tokens per pass (medians).")
PY
