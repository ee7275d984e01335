#!/usr/bin/python3
"""How much slower a central scheduler's blocks run right after another model's step (issue 48).

Reads serve's debug log (`swapnet serve SCENARIO --log-level debug ... 2> LOG`: one `block:` line
per block timed, bench/estimates_replay.py) and prints, per model and after --skip-s seconds, the
median and 90th percentile of a block's compute (its time less its wait for the disk) over the
block's median, for its small blocks (median under --small-ms) run right after the same model's
block and right after each other model's (Note [BLAS on the compute thread] in
scheduler/src/intra_op.cpp). A schedule of many models switches often; the blocks after a
switch are what a block's own history cannot foresee. "Right after" is the line before in the
log, which is the block before on the same core only with one worker (serve's default).

  bench/estimates_switches.py LOG... [--skip-s 5] [--small-ms 5]
"""
import argparse
import collections
import statistics

import estimates_replay


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--skip-s", type=float, default=5.0)
    ap.add_argument("--small-ms", type=float, default=5.0)
    a = ap.parse_args()
    print("| log | model | after | blocks | median ratio | p90 ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for path in a.logs:
        rows = sorted(estimates_replay.load(path), key=lambda r: r["t"])
        rows = [r for r in rows if r["t"] >= a.skip_s * 1e3]
        key = lambda r: (r["model"], r["first"], r["last"], r["resident"])
        usual = collections.defaultdict(list)
        for r in rows:
            usual[key(r)].append(max(0.01, r["ms"] - r["wait"]))
        usual = {k: statistics.median(v) for k, v in usual.items()}
        ratios = collections.defaultdict(list)
        for p, r in zip(rows, rows[1:]):
            if usual[key(r)] >= a.small_ms:
                continue
            after = "same model" if p["model"] == r["model"] else p["model"]
            ratios[(r["model"], after)].append(max(0.01, r["ms"] - r["wait"]) / max(usual[key(r)], 0.05))
        for (model, after), v in sorted(ratios.items()):
            v.sort()
            print(f"| {path.split('/')[-1]} | {model} | {after} | {len(v)} | {statistics.median(v):.2f} | "
                  f"{v[int(0.9 * (len(v) - 1))]:.2f} |")


if __name__ == "__main__":
    main()
