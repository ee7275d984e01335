#!/usr/bin/env bash
# Budget storm on real sizes (issue 18): the four paper models of scheduler/scenarios/
# self_driving.json serve (every output compared with direct inference) while N budget changes
# arrive through the control socket (`swapnet ctl`, a few ms each), one every 10-60 ms, with
# random totals from 0.3 to 1.5 x the scenario's total: below the sum of the models' minimums
# (models pause) and above their full size (nothing swapped). Then the total goes back to the
# scenario's and the serve runs on, so every paused model must resume.
#   bench/storm.sh [--changes N] [--seed S] [--after S]
# Writes bench/results/storm.json (serve's --json), storm_timeline.csv (every request) and
# storm.md, and prints: the changes sent and answered, the serve's exit status (a crash is not 0),
# wrong outputs, inferences over budget, failed requests, and per model the requests served after
# the storm (0: a paused model that never resumed). Exits 1 if any of those is wrong.
set -euo pipefail
source "$(dirname "$0")/common.sh"
changes=1000 seed=1 after=15
while [ $# -gt 0 ]; do
  case "$1" in
    --changes) changes=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    *) echo "bench/storm.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
pack_paper_models
work=$(mktemp -d)
serve_pid=""
trap '[ -z "$serve_pid" ] || kill "$serve_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
# Long enough for the storm (up to 60 ms a change, ~3 ms a ctl) and the calm after it; the serve
# is told to stop once the storm has ended (the scenario's duration is only an upper bound).
start_serve "$repo/scheduler/scenarios/self_driving.json" --duration $(( changes * 70 / 1000 + after + 60 )) \
  --timeline "$out/storm_timeline.csv"
initial=$(serve_total)
t0=$(date +%s.%N)
/usr/bin/python3 - "$cli" "$sock" "$initial" "$changes" "$seed" > "$work/storm.txt" <<'PY'
import random, subprocess, sys, time
cli, sock, initial, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
ok = err = 0
took = []
for i in range(n):
    total = int(initial * rng.uniform(0.3, 1.5))
    t = time.monotonic()
    p = subprocess.run([cli, "ctl", "--socket", sock, "budget", str(total)], capture_output=True, text=True)
    took.append((time.monotonic() - t) * 1e3)
    if p.returncode == 0 and p.stdout.startswith("ok"):
        ok += 1
    else:
        err += 1
        print(f"change {i}: {total}: {p.returncode} {p.stdout.strip()} {p.stderr.strip()}", file=sys.stderr)
    time.sleep(rng.uniform(0.010, 0.060))
p = subprocess.run([cli, "ctl", "--socket", sock, "budget", str(initial)], capture_output=True, text=True)
took.sort()
print(ok, err, int(p.returncode == 0), f"{took[len(took) // 2]:.1f}/{took[int(len(took) * 0.99)]:.1f}/{took[-1]:.1f}")
PY
read -r sent_ok sent_err restored ctl_ms < "$work/storm.txt"
t1=$(date +%s.%N)
storm_s=$(/usr/bin/python3 -c "print($t1 - $t0)")
sleep "$after"
kill -INT "$serve_pid" 2>/dev/null || true
set +e
wait "$serve_pid"
status=$?
set -e
cp "$work/serve.json" "$out/storm.json"
/usr/bin/python3 - "$out/storm.json" "$out/storm_timeline.csv" "$status" "$sent_ok" "$sent_err" "$restored" \
  "$ctl_ms" "$storm_s" "$changes" <<'PY' | tee "$out/storm.md"
import csv, json, sys
path, timeline, status, ok, err, restored, ctl_ms, storm_s, n = sys.argv[1:10]
try:
    j = json.load(open(path))
except ValueError:
    print(f"serve exited {status} without its JSON: a crash"); sys.exit(1)
rows = list(csv.DictReader(open(timeline)))
end = float(storm_s)
# The storm ends with the total restored: the last adaptation, on the serve's clock.
restored_at = max((a["at_s"] for a in j["adaptations"]), default=0.0)
print(f"budget storm: {n} changes over {end:.1f} s through `swapnet ctl` ({ok} answered ok, {err} not; each call, process start included, median/p99/max {ctl_ms} ms), "
      f"total back to {j['initial_budget_bytes'] / 2**20:.0f} MiB: {'yes' if restored == '1' else 'NO'}; serve exit status {status}")
print()
print(f"requests after the storm: those finished more than 2 s after the total was restored (at {restored_at:.1f} s)")
print()
print("| model | requests | after the storm | equal | over budget | failed | abandoned | rejected (paused) | budget changes | mid-inference moves |")
print("|---|---|---|---|---|---|---|---|---|---|")
bad = int(status) != 0 or int(err) != 0 or restored != "1"
for m in j["models"]:
    after = sum(1 for r in rows if r["model"] == m["name"] and float(r["t_s"]) > restored_at + 2.0)
    print(f"| {m['name']} | {m['requests']} | {after} | {m['equal']} | {m['over_budget']} | {m['failed']} | "
          f"{m['abandoned']} | {m['rejected']} | {m['budget_changes']} | {m['mid_inference_moves']} |")
    bad |= m["equal"] is not True or m["over_budget"] != 0 or after == 0
print()
took = sorted(a["took_ms"] for a in j["adaptations"] if a["took_ms"] >= 0)
print(f"changes in effect before the next arrived: {len(took)} of {len(j['adaptations'])} (the others superseded); "
      f"their took_ms median {took[len(took) // 2]:.1f}, p90 {took[int(len(took) * 0.9)]:.1f}, max {took[-1]:.1f}" if took else "none took effect")
sys.exit(1 if bad else 0)
PY
