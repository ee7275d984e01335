#!/usr/bin/env bash
# Deadline scheduling vs load (issue 48's benchmark): each SLO scenario served at loads stated
# relative to this machine (swapnet serve --load: periods derived from the models' direct
# latencies, or on a slow disk their swapped bound, measured at start: Note [Load and run rules]
# and Note [A load that counts the disk] in cli/serve_load.cpp; /mem variants count direct
# latencies only, so on a slow disk their periods are shorter), by every
# variant, at host speed and with the images' disk throttled (bench/throttle.sh), under the
# scenario's run rules (warm-up not counted, a minimum of requests, fixed seeds). Then the budget
# traces (steps, a sawtooth, a replayed trace of memory pressure) under the default scheduler:
# budget violations (bytes x seconds above the budget) and the time to comply after each cut.
# Rounds interleave: each round runs every point and variant once, variants in a rotating order,
# so the VM's drift spreads over all of them.
#   bench/scheduler_sweep.sh [--duration S] [--rounds N] [--scenarios "self_driving_slo two_rates"]
#                            [--loads "0.5 0.75 0.9 1.2 1.5"] [--variants "threads lst threads/mem"]
#                            [--rates "host 1GB/s paced:1GB/s"] [--min-requests N] [--no-traces] [--tag NAME]
# A rate: host, a blkio throttle (bench/throttle.sh: 1GB/s), or paced:RATE, swapcore's emulated
# disk (SWAPNET_EMULATE_READ: one constant rate, Note [An emulated disk]).
# A variant is a scheduler (threads, lst, heft, ...; "default": what serve chooses) with
# optional suffixes: /mem (every model in memory: a budget of 1000 %, the baseline without
# swapping where it fits), /wN (N workers; intra-op threads the cores over them), /blasN
# (OPENBLAS_NUM_THREADS=N: OpenBLAS's own threads as the user chose them, which the runtime then
# leaves; the default is one under a central scheduler, Note [BLAS on the compute thread]).
# Writes bench/results/scheduler_sweep[_NAME].csv (a row per run and model, and "all"),
# scheduler_sweep[_NAME]_traces.csv, scheduler_sweep[_NAME].md (medians over rounds) and
# scheduler_sweep[_NAME].png (gnuplot: slo_met vs load per variant, a panel per scenario and rate).
set -euo pipefail
source "$(dirname "$0")/common.sh"
duration=30 rounds=1 scenarios="self_driving_slo two_rates" loads="0.5 0.75 0.9 1.2 1.5" minreq=""
variants="threads default threads/mem" rates="host 1GB/s" traces=1 tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --scenarios) scenarios=$2; shift 2 ;;
    --loads) loads=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --no-traces) traces=0; shift ;;
    --min-requests) minreq=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    *) echo "bench/scheduler_sweep.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bash "$repo/scripts/setup.sh" --bench >/dev/null
pack_paper_models
scen=$repo/scheduler/scenarios
name=scheduler_sweep${tag:+_$tag}
csv=$out/$name.csv tcsv=$out/${name}_traces.csv
echo "round,rate,scenario,variant,load,model,slo_met,xrbench_score,dropped,requests,p50_ms,p99_ms,estimate_error,estimate_time_error,contention,over_budget,over_byte_s,equal,scheduler,workers,threads,estimate_block_error" >"$csv"
read -r -a var <<<"$variants"
# The serve options of a variant.
variant_args() {
  local v=$1 s args=()
  s=${v%%/*}
  [ "$s" != default ] && args+=(--scheduler "$s")
  case "$v" in */mem*) args+=(--budget 1000%) ;; esac
  if [[ "$v" =~ /w([0-9]+) ]]; then args+=(--workers "${BASH_REMATCH[1]}"); fi
  echo "${args[@]}"
}
summarize() {  # json round rate scenario variant load -> csv rows
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
f, r, rate, sc, v, load = sys.argv[1:]
try:
    j = json.load(open(f))
except Exception:
    sys.exit(0)
row = lambda m, *x: print(",".join(str(y) for y in (r, rate, sc, v, load, m, *x)))
ms = j["models"]
for m in ms:
    row(m["name"], m["slo_met"], m["xrbench_score"], m["counted_dropped"], m["counted_requests"],
        round(m["latency_ms"]["p50"], 1), round(m["latency_ms"]["p99"], 1), round(m["estimate_error"], 3),
        round(m["estimate_time_error"], 3), round(m["contention"], 3), m["over_budget"], "", m["equal"],
        j["scheduler"], j["workers"], m["threads"], round(m.get("estimate_block_error", m["estimate_error"]), 3))
row("all", j["slo_met"], j["xrbench_score"], sum(m["counted_dropped"] for m in ms), sum(m["counted_requests"] for m in ms),
    "", "", "", "", "", sum(m["over_budget"] for m in ms), j["memory"]["over_byte_s"], all(m["equal"] for m in ms),
    j["scheduler"], j["workers"], "", "")
PY
}
k=0
for r in $(seq 1 "$rounds"); do
  for rate in $rates; do
    for sc in $scenarios; do
      for load in $loads; do
        n=${#var[@]}
        for i in $(seq 0 $((n - 1))); do  # the variants' order rotates from point to point
          v=${var[$(((i + k) % n))]}
          echo "== round $r, $rate, $sc, load $load, $v" >&2
          f=$(mktemp)
          # shellcheck disable=SC2046
          # paced:RATE, swapcore's emulated disk of one rate (no throttle's burst after idle)
          pace=""; throttle=$rate blas=""
          if [[ "$v" =~ /blas([0-9]+) ]]; then blas=${BASH_REMATCH[1]}; fi
          case "$rate" in paced:*) pace=${rate#paced:}; throttle=host ;; esac
          env ${blas:+OPENBLAS_NUM_THREADS=$blas} SWAPNET_EMULATE_READ="$pace" bash "$repo/bench/throttle.sh" "$throttle" --path "$models" -- "$cli" serve "$scen/$sc.json" \
            --models "$models" --duration "$duration" --socket none --json --load "$load" $(variant_args "$v") \
            ${minreq:+--min-requests "$minreq"} \
            >"$f" || echo "bench/scheduler_sweep.sh: serve exit $? ($rate $sc $load $v)" >&2
          summarize "$f" "$r" "$rate" "$sc" "$v" "$load" >>"$csv"
          rm -f "$f"
        done
        k=$((k + 1))
      done
    done
  done
done
if [ "$traces" = 1 ]; then
  echo "round,trace,scenario,slo_met,changes,took_ms_median,took_ms_max,over_byte_s,complying_byte_s,peak_bytes,over_budget,equal" >"$tcsv"
  for r in $(seq 1 "$rounds"); do
    for t in self_driving_slo_cuts self_driving_slo_sawtooth self_driving_slo_pressure; do
      echo "== budget trace $t, round $r" >&2
      f=$(mktemp)
      # The trace's own duration (60 s: Fig. 18's cuts are at 20 s and 40 s).
      "$cli" serve "$scen/$t.json" --models "$models" --socket none --json --load 0.9 \
        >"$f" || echo "bench/scheduler_sweep.sh: serve exit $? ($t)" >&2
      /usr/bin/python3 - "$f" "$r" "$t" >>"$tcsv" <<'PY'
import json, statistics, sys
f, r, t = sys.argv[1:]
try:
    j = json.load(open(f))
except Exception:
    sys.exit(0)
took = [a["took_ms"] for a in j["adaptations"] if a["took_ms"] >= 0]
mem = j["memory"]
print(",".join(str(x) for x in (r, t, j["scenario"], j["slo_met"], len(j["adaptations"]),
      round(statistics.median(took), 1) if took else "", round(max(took), 1) if took else "",
      mem["over_byte_s"], round(mem["complying_byte_s"]), mem["peak_bytes"],
      sum(m["over_budget"] for m in j["models"]), all(m["equal"] for m in j["models"]))))
PY
      rm -f "$f"
    done
  done
fi
/usr/bin/python3 "$repo/bench/scheduler_sweep_table.py" "$out" "$tag" >"$out/$name.md"
cat "$out/$name.md"
