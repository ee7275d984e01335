#!/usr/bin/env python3
"""Where the disk idled, from a trace (`swapnet run --trace FILE`; Note [Tracing] in
swapcore/src/trace.cpp).

For every executor in the trace and every inference: its time, the layers' compute, the waits for
reads, and the disk's idle time within it (no request of the executor's in flight). Each idle
stretch is charged to the layers running during it and to the reason the read cursor gave last
before it ("held: activations' zone 5": block 5 did not fit under what the activations may reach;
"held: no room": the blocks held fill the ring; "held: an inference ahead": everything up to the
executing block of the next inference is read). The stretches are then summed over the
inferences by (first layer, reason) and the largest printed: on slow storage, that is where the
pipeline loses time to the I/O bound.

    bench/trace_summary.py TRACE.json [--top N] [--json]
"""
import argparse
import bisect
import json
import sys
from collections import defaultdict


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"trace_summary.py: {path}: cannot read the trace: {e}")


def lanes(trace):
    """Per group (pid): {lane name: [events]} (lane names from the metadata)."""
    names = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    groups = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            groups[e["pid"]] = {"name": e["args"]["name"], "lanes": defaultdict(list)}
    for e in trace["traceEvents"]:
        if e["ph"] in ("X", "i") and e["pid"] in groups:
            groups[e["pid"]]["lanes"][names.get((e["pid"], e["tid"]), "?")].append(e)
    for g in groups.values():
        for v in g["lanes"].values():
            v.sort(key=lambda e: e["ts"])
    return groups


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def summarize(group, top):
    L = group["lanes"]
    busy = [(e["ts"], e["ts"] + e["dur"]) for e in L["disk busy"]]
    layers = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split()[1])) for e in L["compute"]]
    layer_starts = [l[0] for l in layers]
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in L["wait for reads"]]
    cursor = [(e["ts"], e["name"]) for e in L["read cursor"]]
    cursor_ts = [c[0] for c in cursor]
    infs = [(e["ts"], e["ts"] + e["dur"]) for e in L["inference"]]
    per_inf, spots = [], defaultdict(lambda: {"idle_ms": 0.0, "stretches": 0})
    for t0, t1 in infs:
        b = sum(overlap(s, e, t0, t1) for s, e in busy)
        w = sum(overlap(s, e, t0, t1) for s, e in waits)
        c = sum(overlap(s, e, t0, t1) for s, e, _ in layers)
        # Idle stretches: the gaps between busy periods, within the inference.
        idle, at = [], t0
        for s, e in busy:
            if e <= at:
                continue
            if s > at:
                idle.append((at, min(s, t1)))
            at = max(at, e)
            if at >= t1:
                break
        if at < t1:
            idle.append((at, t1))
        for s, e in idle:
            if e - s <= 0:
                continue
            i = bisect.bisect_right(cursor_ts, s) - 1
            why = cursor[i][1] if i >= 0 else "-"
            j = max(0, bisect.bisect_right(layer_starts, s) - 1)
            ks = [k for ls, le, k in layers[j:j + 400] if overlap(ls, le, s, e) > 0 and ls < e]
            first = ks[0] if ks else None
            last = ks[-1] if ks else None
            key = (first, last, why)
            spots[key]["idle_ms"] += (e - s) / 1e3
            spots[key]["stretches"] += 1
        per_inf.append({"ms": (t1 - t0) / 1e3, "disk_busy_ms": b / 1e3, "disk_idle_ms": (t1 - t0 - b) / 1e3,
                        "compute_ms": c / 1e3, "read_wait_ms": w / 1e3})
    n = max(1, len(per_inf))
    ranked = sorted(spots.items(), key=lambda kv: -kv[1]["idle_ms"])[:top]
    return {
        "name": group["name"],
        "inferences": per_inf,
        "mean": {k: sum(p[k] for p in per_inf) / n for k in ("ms", "disk_busy_ms", "disk_idle_ms", "compute_ms", "read_wait_ms")},
        "idle_spots": [{"layers": [k[0], k[1]], "reason": k[2], "idle_ms_per_inference": v["idle_ms"] / n,
                        "stretches": v["stretches"]} for k, v in ranked],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    trace = load(a.trace)
    out = [summarize(g, a.top) for g in lanes(trace).values() if g["lanes"].get("inference")]
    if not out:
        sys.exit(f"trace_summary.py: {a.trace}: no inference in the trace")
    if a.json:
        print(json.dumps(out, indent=1))
        return
    dropped = trace.get("otherData", {}).get("dropped_events", 0)
    if dropped:
        print(f"({dropped} events dropped: the trace's buffer was full)")
    for s in out:
        m = s["mean"]
        print(f"{s['name']}: {len(s['inferences'])} inferences, mean {m['ms']:.1f} ms: disk busy {m['disk_busy_ms']:.1f}, "
              f"idle {m['disk_idle_ms']:.1f}; layers {m['compute_ms']:.1f}; waiting for reads {m['read_wait_ms']:.1f}")
        print("  idle ms/inference  stretches  layers running      last cursor event before")
        for sp in s["idle_spots"]:
            f, l = sp["layers"]
            lay = "-" if f is None else (f"{f}" if f == l else f"{f}-{l}")
            print(f"  {sp['idle_ms_per_inference']:17.2f}  {sp['stretches']:9d}  {lay:18s}  {sp['reason']}")


if __name__ == "__main__":
    main()
