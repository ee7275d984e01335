"""bench/storage.sh's table: rows (JSON lines) -> CSV, and a markdown table on stdout.

    storage_table.py ROWS.jsonl OUT.csv
"""
import csv
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    sys.exit("storage_table.py: no rows in " + sys.argv[1])
with open(sys.argv[2], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)

MB = 1e6


def num(x, fmt):
    return "-" if x is None else format(x, fmt)


def pct(x):
    return "-" if x is None else f"{100 * x:.0f} %"


def mb(x):
    return "-" if x is None else f"{x / MB:.0f}"


cols = ["model", "rate", "budget MB", "direct ms", "swapnet ms", "naive ms", "io_bound ms", "raw MB/s", "busy MB/s", "disk busy",
        "swapnet / max(direct, io_bound)", "same, round by round", "memory bound ms", "swapnet / physical bound", "reserve bound ms", "swapnet / reserve bound", "direct under reads ms", "swapnet / max(that, io_bound)", "naive / swapnet", "read MB/inf", "least MB", "read / least",
        "page cache MB direct/swapnet/naive", "predicted error", "bit-identical"]
print("| " + " | ".join(cols) + " |")
print("|" + "---|" * len(cols))
for r in rows:
    least = r["read_vs_least"]
    print("| " + " | ".join([
        r["model"], r["rate"], mb(r["budget_bytes"]), f'{r["direct_ms"]:.0f}', f'{r["swapnet_ms"]:.0f}',
        num(r["naive_ms"], ".0f") if r["naive_ms"] is not None else "does not fit", f'{r["io_bound_ms"]:.0f}', f'{r["raw_io_mb_s"]:.0f}', num(r.get("busy_mb_s"), ".0f"), pct(r.get("disk_busy_fraction")), f'{r["ratio_vs_bound"]:.3f}', num(r.get("ratio_vs_bound_paired"), ".3f"),
        num(r.get("memory_bound_ms"), ".0f"), num(r.get("ratio_vs_physical_bound"), ".3f"),
        num(r.get("reserve_bound_ms"), ".0f"), num(r.get("ratio_vs_reserve_bound"), ".3f"),
        f'{r["direct_under_io_ms"]:.0f}', f'{r["ratio_vs_bound_under_io"]:.3f}',
        num(r["naive_vs_swapnet"], ".2f"), mb(r["bytes_read_per_inference"]), mb(r["min_read_bytes"]),
        "-" if least is None else f"{least:.3f}",
        "/".join("-" if r[k] is None else mb(max(0, r[k])) for k in ("page_cache_direct", "page_cache_swapnet", "page_cache_naive")),
        f'{100 * r["prediction_error"]:.0f} %', "yes" if r["equal"] else "NO"]) + " |")
def worst(key, what, extra=""):
    """One summary line: the worst ratio `key` over the rows that have it, and how many are within 1.05."""
    have = [r for r in rows if r.get(key) is not None]
    if not have:
        return
    w = max(have, key=lambda r: r[key])
    print(f"worst swapnet / {what}: {w[key]:.3f} ({w['model']} at {w['rate']}); rows within 1.05: "
          f"{sum(r[key] <= 1.05 for r in have)} of {len(have)}{extra}")


print()
worst("ratio_vs_bound", "max(direct, io_bound)")
worst("ratio_vs_bound_paired", "max(direct, io_bound), the median of each round's ratio")
above = sum((r.get("memory_bound_ms") or 0) > 1.01 * max(r["direct_ms"], r["io_bound_ms"]) for r in rows)
worst("ratio_vs_physical_bound", "physical bound max(direct, memory_bound)",
      f"; memory bound more than 1 % above max(direct, io_bound) in {above}")
below = [r for r in rows if (r.get("ratio_vs_physical_bound") or 1) < 1]
if below:
    burst = sum((r.get("busy_mb_s") or 0) > 1.02 * r["raw_io_mb_s"] for r in below)
    print(f"swapnet below the physical bound in {len(below)} rows; in {burst} of them its reads ran more than 2 % faster "
          f"while in flight (busy MB/s) than the raw rate the bound uses: a disk that bursts "
          f"(docs/partitioner.md, \"When a run beats the bound\")")
worst("ratio_vs_physical_bound_under_io", "physical bound under the same reads")
worst("ratio_vs_reserve_bound", "reserve bound (plans with a constant activation reserve: Note [Two bounds])")
worst("ratio_vs_reserve_bound_under_io", "reserve bound under the same reads")
worst("ratio_vs_bound_under_io", "max(direct under the same reads, io_bound)")
nv = [r["naive_vs_swapnet"] for r in rows if r["naive_vs_swapnet"] is not None]
print(f"naive / swapnet: {min(nv or [0]):.2f} .. {max(nv or [0]):.2f} "
      f"({sum(r['naive_vs_swapnet'] is None for r in rows)} rows where naive does not fit the budget); "
      f"plan reads / least any plan reads: {max(r['read_vs_least'] or 1 for r in rows):.3f} at most")
rates = []
for r in rows:
    if r["rate"] not in rates:
        rates.append(r["rate"])
for rate in rates:
    r = next(x for x in rows if x["rate"] == rate)
    e = r["profile_t_in_error"]
    pe = r["profile_pipeline_error"]
    print(f"profile at {rate}: fitted read {r['profile_fitted_read_mb_s']:.0f} MB/s, sustained "
          f"{r['profile_sustained_mb_s'] or 0:.0f} MB/s, t_in error (isolated reads) "
          f"{'-' if e is None else f'{100 * e:.0f} %'}, pipeline error {'-' if pe is None else f'{100 * pe:.0f} %'}")
