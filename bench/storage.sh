#!/usr/bin/env bash
# The engine on emulated Jetson-class storage (issue 14's table): the paper's four models at 1/3
# of their bytes (or their minimum budget, when larger), at host speed and with the image's disk
# throttled to 2 GB/s (Orin NVMe), 1 GB/s and 400 MB/s (eMMC/SD class) by bench/throttle.sh.
# At each rate the device profile is measured under that throttle first (the planner's cost
# model fitted there; its errors are reported), then each model runs
# `swapnet run --compare --check` under the same throttle: direct, swapnet and naive each in its
# own process, rounds interleaved, medians; io_bound = bytes read per inference / the raw
# O_DIRECT rate measured in the same run (sustained: passes back to back for a second); and
# direct_under_io, direct inference while the image is read at the pace swapnet read it (what
# the reads cost the compute on this machine, without swapnet); physical_bound = max(direct,
# memory_bound), memory_bound being the least latency any schedule can reach with weights and
# activations within the budget (partitioner's memory_bound_ms); reserve_bound the least of plans
# that keep a constant activation reserve, as swapnet's do (Note [Two bounds], docs/partitioner.md). naive reads with buffered I/O and drops each block's
# pages after use (the budget has no page cache to keep the model in).
#   bench/storage.sh [--rounds N] [--iters N] [--rates "host 2GB/s 1GB/s 400MB/s"]
#                    [--models "resnet101 yolov3 fcn_resnet101 vgg19"] [--read-ahead ring|paper]
#                    [--emulate]
# --emulate: instead of the blkio throttle, the block readers emulate a disk of each rate
# (SWAPNET_EMULATE_READ; Note [An emulated disk] in swapcore/src/emulated_disk.cpp): no credit for time
# the disk idled, as on a real one (the throttle grants a slice of bytes at once after idling).
# Files get the suffix _emulated.
# Writes bench/results/storage.csv, storage.md, storage_<rate>_<model>.json (the run) and
# _device.json (bytes read from the device), storage_profile_<rate>.json (the device profile)
# and _report.json; prints the markdown table. Exits 77 when the disk cannot be
# throttled (bench/throttle.sh says why).
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=5 iters=3 rates="host 2GB/s 1GB/s 400MB/s" list="resnet101 yolov3 fcn_resnet101 vgg19" read_ahead=ring emulate=""

while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --models) list=$2; shift 2 ;;
    --read-ahead) read_ahead=$2; shift 2 ;;
    --emulate) emulate=1; shift ;;
    *) echo "bench/storage.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
pack_paper_models
suffix=""
[ "$read_ahead" = ring ] || suffix="_$read_ahead"
esuffix=""
[ -z "$emulate" ] || esuffix="_emulated"
suffix="$suffix$esuffix"
throttle=$repo/bench/throttle.sh
# Runs a command at a rate: under the blkio throttle, or (--emulate) with the readers emulating it.
under() {
  local rate=$1; shift
  if [ -n "$emulate" ] && [ "$rate" != host ]; then
    SWAPNET_EMULATE_READ=$rate bash "$throttle" host "$@"
  else
    bash "$throttle" "$rate" "$@"
  fi
}
rows=$out/storage$suffix.jsonl
: > "$rows"
for rate in $rates; do
  tag=${rate//\//}
  prof=$out/storage${esuffix}_profile_$tag.json          # the device profile the runs plan with
  report=$out/storage${esuffix}_profile_${tag}_report.json  # and what measuring it saw
  echo "bench/storage.sh: profile at $rate" >&2
  status=0
  under "$rate" --path "$models" -- "$cli" profile "$models/resnet101.swapnet" \
    --input-shape "${shape[resnet101]}" -o "$prof" --json > "$report" || status=$?
  [ "$status" = 0 ] || exit "$status"
  for m in $list; do
    img=$models/$m.swapnet
    data=$("$cli" inspect "$img" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data_bytes"])')
    minimum=$("$cli" plan "$img" --budget "$data" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["min_budget_bytes"])')
    budget=$(( data / 3 > minimum ? data / 3 : minimum ))
    res=$out/storage${suffix}_${tag}_$m.json dev=$out/storage${suffix}_${tag}_${m}_device.json
    echo "bench/storage.sh: $m at $rate, budget $budget (1/3: $((data / 3)), minimum $minimum)" >&2
    under "$rate" --path "$models" --stats "$dev" -- "$cli" run "$img" --budget "$budget" \
      --compare --check --rounds "$rounds" --iters "$iters" --profile "$prof" \
      --read-ahead "$read_ahead" --input-shape "${shape[$m]}" --json > "$res"
    label=$rate
    [ -z "$emulate" ] || [ "$rate" = host ] || label="$rate emulated"
    /usr/bin/python3 - "$res" "$report" "$dev" "$m" "$label" "$data" "$minimum" >> "$rows" <<'PY'
import json, sys
res, prof, dev, m, rate, data, minimum = sys.argv[1:]
j, p, d = json.load(open(res)), json.load(open(prof)), json.load(open(dev))
nv = j.get("naive", {})  # {"skipped": why} below the paper blocks' minimum (a pair of layers)
swap, direct = j["latency_ms"]["median"], j["direct"]["latency_ms"]["median"]
naive = nv["latency_ms"]["median"] if "latency_ms" in nv else None
bound = max(direct, j["io_bound_ms"])
print(json.dumps({
    "model": m, "rate": rate, "budget_bytes": j["budget_bytes"], "model_bytes": int(data), "min_budget_bytes": int(minimum),
    "blocks": j["num_blocks"], "resident_bytes": j["resident_bytes"], "ring_bytes": j["arena_bytes"],
    "direct_ms": direct, "swapnet_ms": swap, "naive_ms": naive, "io_bound_ms": j["io_bound_ms"],
    "raw_io_mb_s": j["raw_io_mb_s"], "busy_mb_s": j["pipeline"].get("disk_mb_s_while_busy"),
    "ratio_vs_bound": swap / bound, "ratio_vs_direct": swap / direct,
    "ratio_vs_bound_paired": j.get("ratio_vs_bound_paired"),
    "disk_busy_fraction": j["pipeline"].get("disk_busy_fraction"), "read_wait_ms": j["pipeline"].get("read_wait_ms"),
    "naive_vs_swapnet": naive / swap if naive else None, "naive_skipped": nv.get("skipped"), "predicted_ms": j["predicted_ms"],
    "direct_under_io_ms": j["direct_under_io"]["latency_ms"]["median"],
    "background_mb_s": j["direct_under_io"]["background_mb_s"],
    "ratio_vs_bound_under_io": j["ratio_vs_bound_under_io"],
    "memory_bound_ms": j.get("memory_bound_ms"), "physical_bound_ms": j.get("physical_bound_ms"),
    "ratio_vs_physical_bound": j.get("ratio_vs_physical_bound"),
    "memory_bound_under_io_ms": j.get("memory_bound_under_io_ms"),
    "physical_bound_under_io_ms": j.get("physical_bound_under_io_ms"),
    "ratio_vs_physical_bound_under_io": j.get("ratio_vs_physical_bound_under_io"),
    "reserve_bound_ms": j.get("reserve_bound_ms"), "ratio_vs_reserve_bound": j.get("ratio_vs_reserve_bound"),
    "reserve_bound_under_io_ms": j.get("reserve_bound_under_io_ms"),
    "ratio_vs_reserve_bound_under_io": j.get("ratio_vs_reserve_bound_under_io"),
    "prediction_error": abs(j["predicted_ms"] - swap) / swap,
    "bytes_read_per_inference": j["bytes_read_per_inference"], "min_read_bytes": j["min_read_bytes"],
    "read_vs_least": j["bytes_read_per_inference"] / j["min_read_bytes"] if j["min_read_bytes"] else None,
    "naive_bytes_read_per_inference": nv.get("bytes_read_per_inference"),
    "page_cache_direct": j["direct"]["page_cache_growth_bytes"], "page_cache_swapnet": j["page_cache_growth_bytes"],
    "page_cache_naive": nv.get("page_cache_growth_bytes"),
    "peak_model_bytes": j["peak_model_bytes"], "within_budget": j["peak_model_bytes"] <= j["budget_bytes"],
    "bytes_from_device": d.get("bytes_read_from_device"), "equal": j["equal"],
    "profile_fitted_read_mb_s": p["fitted_read_mb_s"], "profile_sustained_mb_s": p.get("sustained_read_mb_s"),
    "profile_t_in_error": p.get("t_in_error"), "profile_pipeline_error": p.get("pipeline_error"),
}))
PY
  done
done
/usr/bin/python3 "$repo/bench/storage_table.py" "$rows" "$out/storage$suffix.csv" | tee "$out/storage$suffix.md"
