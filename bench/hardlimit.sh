#!/usr/bin/env bash
# The budget as a hard limit (issue 18): the paper's Fig. 18 run (scheduler/scenarios/
# budget_cuts.json's models and cuts: 72.6 % -> 62 % -> 55 % of the models' size) served inside a
# cgroup v1 memory limit of the total budget + the process's fixed overhead, page cache counted,
# and the limit cut along with the budget: at each cut the budget goes to the serve through the
# control socket, and the cgroup's limit follows GRACE ms later (the cut's took_ms target is 100 ms).
# Then the same models in memory (--budget 100 %) under the same limits: expected to be OOM-killed.
# The fixed overhead is measured, not guessed: the peak usage (RSS + page cache) of the same serve
# command on four tiny models, in a cgroup of its own.
#   bench/hardlimit.sh [--phase-s S] [--grace-ms G]      (root, cgroup v1 memory controller)
# Writes bench/results/hardlimit.json (one object per mode) and hardlimit.md.
set -euo pipefail
source "$(dirname "$0")/common.sh"
phase=20 grace=200
while [ $# -gt 0 ]; do
  case "$1" in
    --phase-s) phase=$2; shift 2 ;;
    --grace-ms) grace=$2; shift 2 ;;
    *) echo "bench/hardlimit.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
root=/sys/fs/cgroup/memory
[ -d "$root" ] || { echo "bench/hardlimit.sh: no cgroup v1 memory controller at $root" >&2; exit 77; }
pack_paper_models
work=$(mktemp -d)
cg=$root/swapnet-hardlimit-$$
mkdir "$cg"
trap 'kill "$pid" 2>/dev/null || true; sleep 0.5; rmdir "$cg" 2>/dev/null || true; rm -rf "$work"' EXIT
pid=0
scen=$repo/scheduler/scenarios/self_driving.json  # budget_cuts' models, without its own schedule
# The models' size as serve counts it (weights + activations of each image).
whole=0
for m in yolov3 fcn_resnet101 vgg19 resnet101; do
  b=$("$cli" inspect "$models/$m.swapnet" --json | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["data_bytes"] + j["activation_bytes"])')
  whole=$(( whole + b ))
done
# Fixed overhead: the same serve on four tiny models.
tiny=$models/synthetic.swapnet
[ -f "$tiny" ] || "$cli" pack "$models/synthetic.pt" -o "$tiny" --input-shape 2,3,16,16 >/dev/null
/usr/bin/python3 - "$tiny" > "$work/tiny.json" <<'PY'
import json, sys
print(json.dumps({"name": "tiny", "total_budget": "100%", "duration_s": 5,
                  "models": [{"name": f"t{i}", "image": sys.argv[1]} for i in range(4)]}))
PY
sync; echo 1 > /proc/sys/vm/drop_caches
echo 0 > "$cg/memory.max_usage_in_bytes"
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "$cli" serve "$work/tiny.json" --socket none --json > /dev/null
overhead=$(cat "$cg/memory.max_usage_in_bytes")
limit_at() { /usr/bin/python3 -c "print(int($whole * $1) + $overhead)"; }
budget_at() { /usr/bin/python3 -c "print(int($whole * $1))"; }
echo "bench/hardlimit.sh: models $whole bytes, fixed overhead $overhead bytes (four tiny models served)" >&2
: > "$out/hardlimit.json"
for mode in swapnet direct; do
  sync; echo 1 > /proc/sys/vm/drop_caches
  echo "$(limit_at 0.726)" > "$cg/memory.limit_in_bytes"
  echo 0 > "$cg/memory.max_usage_in_bytes"
  kills_before=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control"); kills_before=${kills_before:-0}
  sock=$work/$mode.sock
  budget=$([ "$mode" = direct ] && echo "100%" || echo "72.6%")
  bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "$cli" serve "$scen" --models "$models" \
    --budget "$budget" --duration $(( 3 * phase + 120 )) --socket "$sock" --json > "$work/$mode.json" 2> "$work/$mode.err" &
  pid=$!
  for _ in $(seq 1200); do [ -S "$sock" ] || ! kill -0 "$pid" 2>/dev/null && break; sleep 0.1; done
  phases=""
  for share in 0.726 0.62 0.55; do
    if [ "$share" != 0.726 ] && kill -0 "$pid" 2>/dev/null; then
      # direct keeps the models in memory whatever the budget (a program unaware of it).
      [ "$mode" = direct ] || "$cli" ctl --socket "$sock" budget "$(budget_at "$share")" > /dev/null 2>&1 || true
      sleep "$(/usr/bin/python3 -c "print($grace / 1000)")"
      echo "$(limit_at "$share")" > "$cg/memory.limit_in_bytes" 2>/dev/null ||
        echo "bench/hardlimit.sh: $mode: the kernel refused a limit of $(limit_at "$share") (usage above it)" >&2
    fi
    phases+="${phases:+,}{\"share\": $share, \"limit_bytes\": $(cat "$cg/memory.limit_in_bytes")}"
    for _ in $(seq "$phase"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  done
  kill -INT "$pid" 2>/dev/null || true
  set +e
  wait "$pid"
  rc=$?
  set -e
  kills=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control"); kills=${kills:-0}
  /usr/bin/python3 - "$work/$mode.json" "$mode" "$rc" "$(cat "$cg/memory.max_usage_in_bytes")" "$overhead" \
    "$((kills - kills_before))" "[$phases]" "$work/$mode.err" >> "$out/hardlimit.json" <<'PY'
import json, sys
path, mode, rc, usage, overhead, kills, phases, err = sys.argv[1:9]
row = {"mode": mode, "exit": int(rc), "oom_kills": int(kills), "max_usage_bytes": int(usage),
       "overhead_bytes": int(overhead), "phases": json.loads(phases)}
try:
    j = json.load(open(path))
    row["models"] = [{k: m[k] for k in ("name", "requests", "equal", "over_budget", "failed", "abandoned", "peak_model_bytes")}
                     for m in j["models"]]
    row["took_ms"] = [a["took_ms"] for a in j["adaptations"]]
except (ValueError, OSError):
    lines = open(err).read().strip().splitlines()
    row["error"] = lines[-1] if lines else "no output"
print(json.dumps(row))
PY
done
/usr/bin/python3 - "$out/hardlimit.json" <<'PY' | tee "$out/hardlimit.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| mode | exit | OOM kills | limits MB (72.6 / 62 / 55 %) | max usage MB | requests | equal | over budget | cuts took ms |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    ms = r.get("models", [])
    print(f"| {r['mode']} | {r['exit']} | {r['oom_kills']} | {' / '.join(str(p['limit_bytes'] >> 20) for p in r['phases'])} | "
          f"{r['max_usage_bytes'] >> 20} | {sum(m['requests'] for m in ms) if ms else '-'} | "
          f"{all(m['equal'] for m in ms) if ms else '-'} | {sum(m['over_budget'] for m in ms) if ms else '-'} | "
          f"{', '.join(f'{t:.0f}' for t in r.get('took_ms', []) if t is not None)} |")
print()
print(f"fixed overhead {rows[0]['overhead_bytes'] >> 20} MB (four tiny models served); limit = budget + overhead")
for r in rows:
    if "error" in r: print(f"{r['mode']}: {r['error']}")
PY
