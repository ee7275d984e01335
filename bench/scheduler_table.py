#!/usr/bin/python3
"""Markdown tables from bench/scheduler.sh's JSON results: per scenario and model, swapnet (the
paper's budgeter) vs direct latency and memory vs budget; the ablations (equal split) and minmax
against the paper's rule by the largest latency; the Fig. 18 adaptation times.

  scheduler_table.py RESULTS_DIR
"""
import json
import os
import sys

MiB = 1 << 20


def load(d, s, v):
    p = os.path.join(d, f"scheduler_{s}_{v}.json")
    return json.load(open(p)) if os.path.exists(p) else None


def main():
    d = sys.argv[1]
    for s in ("self_driving", "road_side_unit", "uav"):
        r = {v: load(d, s, v) for v in ("paper", "minmax", "equal", "direct")}
        if not r["paper"]:
            continue
        print(f"### {s}: total {r['paper']['total_budget_bytes'] / MiB:.0f} MiB\n")
        print("| model | budget MiB (min..full) | blocks | peak MiB | swapnet ms | direct ms | ratio | equal-split ms | minmax ms | bit-identical |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        by = {v: {m["name"]: m for m in r[v]["models"]} for v in r if r[v]}
        for m in r["paper"]["models"]:
            n = m["name"]
            med = lambda v: by[v][n]["latency_ms"]["median"] if v in by else float("nan")
            eq = all(by[v][n]["equal"] for v in by)
            print(f"| {n} | {m['budget_bytes'] / MiB:.0f} ({m['min_budget_bytes'] / MiB:.0f}..{m['full_bytes'] / MiB:.0f}) "
                  f"| {m['blocks']} | {m['peak_model_bytes'] / MiB:.0f} | {med('paper'):.0f} | {med('direct'):.0f} "
                  f"| {med('paper') / med('direct'):.2f} | {med('equal'):.0f} | {med('minmax'):.0f} | {'yes' if eq else 'NO'} |")
        worst = {v: max(x["latency_ms"]["median"] for x in r[v]["models"]) for v in r if r[v]}
        over = sum(x["over_budget"] for v in r if r[v] for x in r[v]["models"])
        line = f"\nlargest median latency: paper {worst['paper']:.0f} ms"
        for v in ("equal", "minmax", "direct"):
            if v in worst:
                line += f", {v} {worst[v]:.0f} ms ({worst[v] / worst['paper']:.2f}x)"
        print(line + f"; inferences over their budget: {over}\n")
    f = os.path.join(d, "scheduler_fig18.json")
    if os.path.exists(f):
        j = json.load(open(f))
        print("### budget cuts (Fig. 18)\n")
        print("| at s | total MiB | planned in ms | in effect after ms |")
        print("|---|---|---|---|")
        for a in j["adaptations"]:
            print(f"| {a['at_s']:.1f} | {a['budget_bytes'] / MiB:.0f} | {a['plan_ms']:.3f} | {a['took_ms']:.0f} |")
        print()
        for m in j["models"]:
            print(f"- {m['name']}: final budget {m['budget_bytes'] / MiB:.0f} MiB, {m['blocks']} blocks, median "
                  f"{m['latency_ms']['median']:.0f} ms, equal {m['equal']}, over budget {m['over_budget']}")


if __name__ == "__main__":
    main()
