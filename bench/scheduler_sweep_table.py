#!/usr/bin/python3
"""Tables (markdown, stdout) and the plot for bench/scheduler_sweep.sh.

  scheduler_sweep_table.py RESULTS_DIR [TAG]

Reads scheduler_sweep[_TAG].csv (and scheduler_sweep[_TAG]_groups.csv when present); medians
over rounds. Draws scheduler_sweep[_TAG].png with gnuplot when it is installed
(scripts/setup.sh --bench).
"""
import csv
import os
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def num(x):
    return None if x in ("", "None", None) else float(x)


def fmt(x, d=3):
    return "-" if x is None else f"{x:.{d}f}"


def main() -> int:
    out = sys.argv[1]
    name = "scheduler_sweep" + (f"_{sys.argv[2]}" if len(sys.argv) > 2 and sys.argv[2] else "")
    rows = list(csv.DictReader(open(os.path.join(out, name + ".csv"))))
    allrows = [r for r in rows if r["model"] == "all"]
    slo = defaultdict(list)      # (rate, scheduler, p, q) -> overall slo_met per round
    disp = defaultdict(list)
    err = defaultdict(list)
    bad = defaultdict(int)
    for r in allrows:
        k = (r["rate"], r["scheduler"], float(r["period_scale"]), float(r["slo_scale"]))
        slo[k].append(num(r["slo_met"]))
        disp[r["scheduler"]].append(num(r["dispatch_us"]))
        bad["over_budget"] += int(r["over_budget"])
        bad["not_equal"] += r["equal"] != "True"
    for r in rows:
        if r["model"] != "all" and num(r["estimate_error"]) is not None:
            err[r["scheduler"]].append(num(r["estimate_error"]))
    rates = list(dict.fromkeys(r["rate"] for r in allrows))
    scheds = list(dict.fromkeys(r["scheduler"] for r in allrows))
    loads = sorted({k[2] for k in slo if k[3] == 1.0}, reverse=True)
    sloss = sorted({k[3] for k in slo if k[2] == 1.0})
    rounds = len({r["round"] for r in allrows})
    print(f"Overall slo_met (fraction of requests finished by their deadline; dropped and unanswered count as"
          f" missed), median over {rounds} round(s); load = 1 / period scale.\n")
    for rate in rates:
        print(f"### {rate}: slo_met vs load (deadlines as the scenario's)\n")
        print("| scheduler | " + " | ".join(f"load x{1 / p:g}" for p in loads) + " |")
        print("|---|" + "---|" * len(loads))
        for s in scheds:
            print(f"| `{s}` | " + " | ".join(fmt(med(slo[(rate, s, p, 1.0)])) for p in loads) + " |")
        best = []
        for p in loads:
            base = med(slo[(rate, "threads", p, 1.0)])
            top = max(((med(slo[(rate, s, p, 1.0)]) or 0, s) for s in scheds if s != "threads"), default=(0, "-"))
            best.append(f"x{1 / p:g}: {top[1]} {top[0]:.3f} = {top[0] / base:.2f}x threads" if base else f"x{1 / p:g}: -")
        if "threads" in scheds:
            print("\nbest vs threads: " + "; ".join(best) + "\n")
        else:
            print()
        for s in scheds:  # a disk-aware variant next to its blind policy
            if s.endswith("+io") and s[:-3] in scheds:
                pairs = []
                for p in loads:
                    a, b = med(slo[(rate, s[:-3], p, 1.0)]), med(slo[(rate, s, p, 1.0)])
                    pairs.append(f"load x{1 / p:g}: {fmt(a)} -> {fmt(b)}" + (f" ({b / a:.2f}x)" if a and b is not None else ""))
                print(f"`{s}` vs `{s[:-3]}`: " + "; ".join(pairs) + "\n")
        print(f"### {rate}: slo_met vs deadline multiplier (load x1)\n")
        print("| scheduler | " + " | ".join(f"deadline x{q:g}" for q in sloss) + " |")
        print("|---|" + "---|" * len(sloss))
        for s in scheds:
            print(f"| `{s}` | " + " | ".join(fmt(med(slo[(rate, s, 1.0, q)])) for q in sloss) + " |")
        print()
    print("| scheduler | dispatch µs per decision (median of runs) | EWMA estimate error (median over models and runs) |")
    print("|---|---|---|")
    for s in scheds:
        print(f"| `{s}` | {fmt(med(disp[s]), 2)} | {fmt(med(err[s]))} |")
    print(f"\nRuns with an inference over its budget: {bad['over_budget']}; runs with an output not bit-identical:"
          f" {bad['not_equal']} (of {len(allrows)}).\n")

    gpath = os.path.join(out, name + "_groups.csv")
    if os.path.exists(gpath):
        g = list(csv.DictReader(open(gpath)))
        by = defaultdict(list)
        for r in g:
            by[(r["scheduler"], r["group"])].append(r)
        names = list(dict.fromkeys(r["group"] for r in g))
        print("### Periodic groups (self_driving_groups.json, host): makespan median / p90 ms, QoE, score\n")
        print("| scheduler | " + " | ".join(f"{n}: makespan, QoE, score" for n in names) + " | mean score |")
        print("|---|" + "---|" * len(names) + "---|")
        for s in dict.fromkeys(r["scheduler"] for r in g):
            cells, scores = [], []
            for n in names:
                v = by[(s, n)]
                sc = med([num(r["score"]) for r in v])
                scores.append(sc or 0)
                cells.append(f"{fmt(med([num(r['makespan_median_ms']) for r in v]), 0)} / "
                             f"{fmt(med([num(r['makespan_p90_ms']) for r in v]), 0)}, "
                             f"{fmt(med([num(r['qoe']) for r in v]))}, {fmt(sc)}")
            print(f"| `{s}` | " + " | ".join(cells) + f" | {sum(scores) / len(scores):.3f} |")
        print()

    if shutil.which("gnuplot") and loads:
        dat = os.path.join(out, name + ".dat")
        with open(dat, "w") as f:
            for rate in rates:
                for s in scheds:
                    f.write(f"# {rate} {s}\n")
                    for p in sorted(loads, reverse=True):
                        v = med(slo[(rate, s, p, 1.0)])
                        if v is not None:
                            f.write(f"{1 / p:g} {v}\n")
                    f.write("\n\n")
        idx = 0
        plots = []
        for rate in rates:
            parts = []
            for s in scheds:
                parts.append(f'"{dat}" index {idx} using 1:2 with linespoints title "{s}"')
                idx += 1
            plots.append((rate, ", ".join(parts)))
        script = [f'set terminal pngcairo size {550 * len(plots)},450 noenhanced',
                  f'set output "{os.path.join(out, name + ".png")}"',
                  f'set multiplot layout 1,{len(plots)}', 'set logscale x 2', 'set yrange [0:1]',
                  'set xlabel "load (x the scenario\'s arrival rate)"', 'set ylabel "slo_met"', 'set key bottom left']
        for rate, p in plots:
            script += [f'set title "self_driving_slo.json, {rate}"', "plot " + p]
        script.append("unset multiplot")
        subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
        print(f"Plot: {os.path.join(out, name + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
