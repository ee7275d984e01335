#!/usr/bin/python3
"""Tables (markdown, stdout) and the plot for bench/scheduler_sweep.sh.

  scheduler_sweep_table.py RESULTS_DIR [TAG]

Reads scheduler_sweep[_TAG].csv (and scheduler_sweep[_TAG]_traces.csv when present); medians
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


def sweep(rows):
    allrows = [r for r in rows if r["model"] == "all"]
    slo, xr = defaultdict(list), defaultdict(list)  # (rate, scenario, variant, load) -> per round
    for r in allrows:
        k = (r["rate"], r["scenario"], r["variant"], float(r["load"]))
        slo[k].append(num(r["slo_met"]))
        xr[k].append(num(r["xrbench_score"]))
    rates = list(dict.fromkeys(r["rate"] for r in allrows))
    scens = list(dict.fromkeys(r["scenario"] for r in allrows))
    variants = list(dict.fromkeys(r["variant"] for r in allrows))
    loads = sorted({float(r["load"]) for r in allrows})
    rounds = len({r["round"] for r in allrows})
    print(f"slo_met (requests arriving after the warm-up, finished by their deadline; dropped and unanswered "
          f"count as missed) / XRBench score, median over {rounds} round(s). Load: the share of time the machine "
          f"would be busy serving the requests one at a time, each at the larger of its direct latency and "
          f"the bound its budget sets on the disk (Note [Load and run rules], Note [A load that counts the "
          f"disk]; sweeps before 2026-11-28's day4: direct latencies only).\n")
    for rate in rates:
        for sc in scens:
            print(f"### {sc}.json, {rate}\n")
            print("| variant | " + " | ".join(f"load {x:g}" for x in loads) + " |")
            print("|---|" + "---|" * len(loads))
            for v in variants:
                cells = [f"{fmt(med(slo[(rate, sc, v, x)]))} / {fmt(med(xr[(rate, sc, v, x)]))}" for x in loads]
                print(f"| `{v}` | " + " | ".join(cells) + " |")
            if "threads" in variants:
                best = []
                for x in loads:
                    base = med(slo[(rate, sc, "threads", x)])
                    top = max(((med(slo[(rate, sc, v, x)]) or 0, v) for v in variants
                               if v != "threads" and "/mem" not in v), default=(0, "-"))
                    best.append(f"{x:g}: {top[1]} {top[0]:.3f}" + (f" = {top[0] / base:.2f}x" if base else " (threads 0)"))
                print("\nbest (swapping) vs threads: " + "; ".join(best) + "\n")
            else:
                print()
    # Starvation: per model, the lowest slo_met of a variant at a load.
    low = defaultdict(list)
    for r in rows:
        if r["model"] != "all" and num(r["slo_met"]) is not None:
            low[(r["rate"], r["scenario"], r["variant"], float(r["load"]), r["model"])].append(num(r["slo_met"]))
    starved = sorted((med(v), k) for k, v in low.items() if med(v) is not None and med(v) < 0.2)
    print(f"Models below 20 % of their deadlines met (median over rounds): {len(starved)} of {len(low)} model-points"
          + (": " + "; ".join(f"{k[4]} {m:.2f} ({k[1]}, {k[0]}, {k[2]}, load {k[3]:g})" for m, k in starved[:12]) if starved else "") + "\n")
    # estimate_error is per step of a grant since 2026-11-28 (Note [Steps of a grant]), per block
    # before, when a step was a block; estimate_block_error (newer sweeps) is per block.
    err, terr, berr = defaultdict(list), defaultdict(list), defaultdict(list)
    for r in rows:
        if r["model"] != "all" and num(r["estimate_error"]) and r["scheduler"] != "threads":
            err[r["variant"]].append(num(r["estimate_error"]))
            terr[r["variant"]].append(num(r["estimate_time_error"]))
            if num(r.get("estimate_block_error")):
                berr[r["variant"]].append(num(r["estimate_block_error"]))
    if err:
        print("| variant | estimate error per step (median over models and runs) | per block | per ms of work |")
        print("|---|---|---|---|")
        for v in err:
            print(f"| `{v}` | {fmt(med(err[v]))} | {fmt(med(berr[v])) if berr[v] else '—'} | {fmt(med(terr[v]))} |")
        print()
    over = sum(int(r["over_budget"]) for r in allrows)
    viol = sum(num(r["over_byte_s"]) or 0 for r in allrows)
    neq = sum(r["equal"] != "True" for r in allrows)
    print(f"Runs: {len(allrows)}; inferences over their budget: {over}; budget violations: {viol:g} byte-s; "
          f"runs with an output not bit-identical: {neq}.\n")
    return rates, scens, variants, loads, slo


def traces(path):
    t = list(csv.DictReader(open(path)))
    if not t:
        return
    print("### Budget traces (load 0.9, default scheduler): time to comply after each change, violations\n")
    print("| trace | slo_met | changes | took_ms median / max | over budget (byte-s) | complying (MB-s) | over_budget | bit-identical |")
    print("|---|---|---|---|---|---|---|---|")
    by = defaultdict(list)
    for r in t:
        by[r["trace"]].append(r)
    for name, v in by.items():
        print(f"| {name} | {fmt(med([num(r['slo_met']) for r in v]))} | {fmt(med([num(r['changes']) for r in v]), 0)} | "
              f"{fmt(med([num(r['took_ms_median']) for r in v]), 1)} / {fmt(max((num(r['took_ms_max']) or 0) for r in v), 1)} | "
              f"{sum(num(r['over_byte_s']) or 0 for r in v):g} | {fmt(med([(num(r['complying_byte_s']) or 0) / 1e6 for r in v]), 1)} | "
              f"{sum(int(r['over_budget']) for r in v)} | {all(r['equal'] == 'True' for r in v)} |")
    print()


def plot(out, name, rates, scens, variants, loads, slo):
    dat = os.path.join(out, name + ".dat")
    panels = []
    idx = 0
    with open(dat, "w") as f:
        for rate in rates:
            for sc in scens:
                parts = []
                for v in variants:
                    f.write(f"# {rate} {sc} {v}\n")
                    for x in loads:
                        m = med(slo[(rate, sc, v, x)])
                        if m is not None:
                            f.write(f"{x:g} {m}\n")
                    f.write("\n\n")
                    parts.append(f'"{dat}" index {idx} using 1:2 with linespoints title "{v}"')
                    idx += 1
                panels.append((f"{sc}, {rate}", ", ".join(parts)))
    script = [f'set terminal pngcairo size {480 * len(scens)},{400 * len(rates)} noenhanced',
              f'set output "{os.path.join(out, name + ".png")}"',
              f'set multiplot layout {len(rates)},{len(scens)}', 'set yrange [0:1.05]',
              'set xlabel "load (direct latency or disk bound)"', 'set ylabel "slo_met"', 'set key bottom left']
    for title, p in panels:
        script += [f'set title "{title}"', "plot " + p]
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    print(f"Plot: {os.path.join(out, name + '.png')}")


def main() -> int:
    out = sys.argv[1]
    name = "scheduler_sweep" + (f"_{sys.argv[2]}" if len(sys.argv) > 2 and sys.argv[2] else "")
    rows = list(csv.DictReader(open(os.path.join(out, name + ".csv"))))
    rates, scens, variants, loads, slo = sweep(rows)
    tpath = os.path.join(out, name + "_traces.csv")
    if os.path.exists(tpath):
        traces(tpath)
    if shutil.which("gnuplot") and loads:
        plot(out, name, rates, scens, variants, loads, slo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
