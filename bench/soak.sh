#!/usr/bin/env bash
# Endurance (issue 18): the four paper models of scheduler/scenarios/self_driving.json serve for
# M minutes (every output compared with direct inference) while the total budget moves every S
# seconds through a cycle of levels (1.0, 0.8, 0.65, 0.9 x the scenario's total, via `swapnet
# ctl`). Just before each change the serve process's RSS, open files and threads are sampled, so
# that samples at the same level compare: a leak shows as a slope at every level.
#   bench/soak.sh [--minutes M] [--every S] [--warmup-minutes W] [--tag T]
# The serve inherits the environment, so allocator variants compare side by side, e.g.
#   MALLOC_ARENA_MAX=2 bench/soak.sh --tag arena2
# Writes (soak_T.* with --tag) bench/results/soak.csv (t_s, level, total_budget_bytes, rss_bytes, fds, threads),
# soak.json (serve's --json), soak.md (slopes after the first W minutes, per level, in MB/hour;
# fds and threads min/max) and soak.png (gnuplot, where installed: scripts/setup.sh --bench).
set -euo pipefail
source "$(dirname "$0")/common.sh"
minutes=60 every=4 warmup=5 name=soak
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --warmup-minutes) warmup=$2; shift 2 ;;
    --tag) name=soak_$2; shift 2 ;;
    *) echo "bench/soak.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bash "$repo/scripts/setup.sh" --bench >/dev/null
pack_paper_models
work=$(mktemp -d)
serve_pid=""
trap '[ -z "$serve_pid" ] || kill "$serve_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
start_serve "$repo/scheduler/scenarios/self_driving.json" --duration $(( minutes * 60 + 600 ))
pid=$serve_pid
initial=$(serve_total)
csv=$out/$name.csv
echo "t_s,level,total_budget_bytes,rss_bytes,fds,threads,tensor_bytes,arena_bytes,heap_in_use_bytes,heap_free_bytes,heap_mmap_bytes,activation_cache_bytes,activation_cache_live_bytes,activation_cache_hits,activation_cache_misses,rss_anon_bytes,rss_file_bytes" > "$csv"
levels=(1.0 0.8 0.65 0.9)
start=$(date +%s)
i=0
while [ $(( $(date +%s) - start )) -lt $(( minutes * 60 )) ]; do
  level=${levels[$(( i % 4 ))]}
  total=$(/usr/bin/python3 -c "print(int($initial * $level))")
  "$cli" ctl --socket "$sock" budget "$total" > /dev/null
  sleep "$every"
  kill -0 "$pid" 2>/dev/null || { echo "bench/soak.sh: serve died:" >&2; cat "$work/serve.err" >&2; exit 1; }
  rss=$(awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$pid/status")
  threads=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status")
  fds=$(ls "/proc/$pid/fd" | wc -l)
  rss_kinds=$(awk '/^RssAnon:/ {a = $2 * 1024} /^RssFile:/ {f = $2 * 1024} END {print a "," f}' "/proc/$pid/status")
  # Where the memory is (serve's status): tensors, arenas, the C heap in use, free, mmapped, the
  # activation regions (Note [Activation cache]); and anonymous vs file-backed RSS.
  mem=$("$cli" ctl --socket "$sock" status | /usr/bin/python3 -c 'import json,sys; m=json.load(sys.stdin).get("memory", {})
print(",".join(str(m.get(k, "")) for k in ("tensor_bytes", "arena_bytes", "heap_in_use_bytes", "heap_free_bytes", "heap_mmap_bytes",
  "activation_cache_bytes", "activation_cache_live_bytes", "activation_cache_hits", "activation_cache_misses")))')
  echo "$(( $(date +%s) - start )),$level,$total,$rss,$fds,$threads,$mem,$rss_kinds" >> "$csv"
  i=$(( i + 1 ))
done
kill -INT "$pid"
set +e
wait "$pid"
status=$?
set -e
cp "$work/serve.json" "$out/$name.json"
/usr/bin/python3 - "$csv" "$out/$name.json" "$status" "$warmup" <<'PY' | tee "$out/$name.md"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
status, warmup_s = int(sys.argv[3]), float(sys.argv[4]) * 60
try:
    j = json.load(open(sys.argv[2]))
except ValueError:
    j = None
def slope(pts):  # least squares, bytes per second
    n = len(pts)
    if n < 2: return float("nan")
    mx = sum(x for x, _ in pts) / n; my = sum(y for _, y in pts) / n
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else float("nan")
late = [r for r in rows if float(r["t_s"]) >= warmup_s]
print(f"soak: {float(rows[-1]['t_s']) / 60:.1f} min, {len(rows)} budget changes and samples; serve exit status {status}")
if j:
    print("serve: " + "; ".join(f"{m['name']} {m['requests']} requests, equal {m['equal']}, over budget {m['over_budget']}, "
                                 f"failed {m['failed']}" for m in j["models"]))
print()
print(f"after the first {warmup_s / 60:.0f} min ({len(late)} samples):")
print()
print("| level | samples | RSS first MB | RSS last MB | RSS min..max MB | slope MB/hour |")
print("|---|---|---|---|---|---|")
for level in sorted({r["level"] for r in late}, key=float):
    rs = [r for r in late if r["level"] == level]
    pts = [(float(r["t_s"]), float(r["rss_bytes"])) for r in rs]
    ys = [y for _, y in pts]
    print(f"| {level} | {len(rs)} | {ys[0] / 1e6:.0f} | {ys[-1] / 1e6:.0f} | {min(ys) / 1e6:.0f}..{max(ys) / 1e6:.0f} | "
          f"{slope(pts) * 3600 / 1e6:+.1f} |")
allp = [(float(r["t_s"]), float(r["rss_bytes"])) for r in late]
print(f"| all | {len(late)} | | | | {slope(allp) * 3600 / 1e6:+.1f} |")
# Where the RSS went: the same slopes for what the process says it holds (all levels).
parts = [k for k in ("tensor_bytes", "arena_bytes", "heap_in_use_bytes", "heap_free_bytes", "heap_mmap_bytes",
                    "activation_cache_bytes", "activation_cache_live_bytes", "rss_anon_bytes", "rss_file_bytes")
         if late and late[0].get(k)]
if parts:
    print()
    print("| memory | first MB | last MB | slope MB/hour |")
    print("|---|---|---|---|")
    for k in parts:
        pts = [(float(r["t_s"]), float(r[k])) for r in late]
        print(f"| {k[:-6]} | {pts[0][1] / 1e6:.0f} | {pts[-1][1] / 1e6:.0f} | {slope(pts) * 3600 / 1e6:+.1f} |")
# Per level, mean RSS in three windows: after the warm-up, the middle, the last 10 min (a level
# mean is steadier than a slope over a few points).
end = float(rows[-1]["t_s"])
wins = [(warmup_s, warmup_s + 600), (warmup_s + 600, max(warmup_s + 600, end - 600)), (end - 600, end + 1)]
print()
print("| level | RSS mean MB: first 10 min after warm-up | middle | last 10 min |")
print("|---|---|---|---|")
for level in sorted({r["level"] for r in late}, key=float):
    cells = []
    for lo, hi in wins:
        ys = [float(r["rss_bytes"]) / 1e6 for r in late if r["level"] == level and lo <= float(r["t_s"]) < hi]
        cells.append(f"{sum(ys) / len(ys):.0f}" if ys else "-")
    print(f"| {level} | " + " | ".join(cells) + " |")
if late and late[0].get("activation_cache_hits"):
    h = [int(r["activation_cache_hits"]) for r in late]; ms = [int(r["activation_cache_misses"]) for r in late]
    print()
    print(f"activation regions: {h[-1] - h[0]} allocations placed, {ms[-1] - ms[0]} not placed (libtorch's allocator) "
          f"after the first {warmup_s / 60:.0f} min")
fds = [int(r["fds"]) for r in late]; th = [int(r["threads"]) for r in late]
print()
print(f"open files {min(fds)}..{max(fds)}, threads {min(th)}..{max(th)} (after the first {warmup_s / 60:.0f} min)")
PY
if command -v gnuplot > /dev/null; then
  gnuplot <<GP
set terminal pngcairo size 900,600
set output "$out/$name.png"
set datafile separator ","
set multiplot layout 2,1 title "swapnet serve soak: the four paper models, budget moving every ${every} s"
set xlabel "minutes"
set ylabel "RSS (MB)"
plot for [l in "1.0 0.8 0.65 0.9"] "$csv" using (\$1/60):(strcol(2) eq l ? \$4/1e6 : 1/0) skip 1 with points pt 7 ps 0.4 title "level ".l
set ylabel "count"
plot "$csv" using (\$1/60):5 skip 1 with lines title "open files", "$csv" using (\$1/60):6 skip 1 with lines title "threads"
unset multiplot
GP
fi
