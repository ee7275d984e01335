#!/usr/bin/env bash
# Runs swapnet and direct inference of one image under a cgroup v1 memory limit of
# budget + the process's fixed overhead (libtorch code and runtime: the peak RSS of the same
# command on a tiny model), page cache counted. swapnet must complete; direct, which needs the
# whole model in memory, is expected to be killed by the OOM killer.
#   bench/cgroup.sh IMAGE BUDGET_BYTES [TINY_IMAGE]      (root, cgroup v1 memory controller)
# Prints one JSON line per mode: exit status (137 = killed), peak usage, limit, OOM kills.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
img=$1 budget=$2
cli=${SWAPNET_CLI:-$repo/build/swapnet}
models=${SWAPNET_MODELS:-$repo/.cache/models}
tiny=${3:-$models/synthetic.swapnet}
root=/sys/fs/cgroup/memory
[ -d "$root" ] || { echo "cgroup.sh: no cgroup v1 memory controller at $root" >&2; exit 77; }
[ -f "$tiny" ] || "$cli" pack "$models/synthetic.pt" -o "$tiny" --input-shape 2,3,16,16 >/dev/null
overhead=$("$cli" run "$tiny" --budget 64MiB --iters 3 --json |
  /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_rss_bytes"])')
limit=$(( budget + overhead ))
cg=$root/swapnet-bench-$$
mkdir "$cg"
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
echo "$limit" > "$cg/memory.limit_in_bytes"
echo "cgroup.sh: limit $limit = budget $budget + fixed overhead $overhead (peak RSS of a tiny-model run)" >&2
for mode in swapnet direct; do
  rc=0
  echo 0 > "$cg/memory.max_usage_in_bytes"
  kills_before=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control"); kills_before=${kills_before:-0}
  sync; echo 1 > /proc/sys/vm/drop_caches
  bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    "$cli" run "$img" --mode "$mode" --budget "$budget" --iters 3 --json > "/tmp/cgroup-$$-$mode.json" 2>&1 || rc=$?
  kills=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control"); kills=${kills:-0}
  lat=$(/usr/bin/python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1]))["latency_ms"]["median"])
except Exception: print("null")' "/tmp/cgroup-$$-$mode.json")
  echo "{\"image\": \"$img\", \"mode\": \"$mode\", \"exit\": $rc, \"latency_ms\": $lat, \"max_usage_bytes\": $(cat "$cg/memory.max_usage_in_bytes"), \"limit_bytes\": $limit, \"budget_bytes\": $budget, \"overhead_bytes\": $overhead, \"oom_kills\": $((kills - kills_before))}"
  rm -f "/tmp/cgroup-$$-$mode.json"
done
