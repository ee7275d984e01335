#!/usr/bin/python3
"""How close a central scheduler's block estimates are to what any estimate could be (issue 48).

Reads serve's debug log (`swapnet serve SCENARIO --log-level debug ... 2> LOG`: one `block:`
line per block timed, bench/estimates_replay.py) and prints per model, after serve's warm-up:
  - the logged estimates' mean |expected - measured| / measured per step (the blocks of one
    grant, Note [Steps of a grant]) and per block;
  - the same for a hindsight oracle: each block's median compute over the whole run, plus the
    wait for the disk it really had (a constant per block, chosen knowing every run of it);
  - the median, over the model's blocks, of the coefficient of variation of a block's compute
    (what no constant can follow), and the correlation of consecutive blocks' log(measured /
    expected) (what a correction from the last block could follow).

  bench/estimates_floor.py LOG... [--step-ms 2]
"""
import argparse
import collections
import math
import statistics

import estimates_replay


def load(path):
    """The log's block rows in time order (estimates_replay.load), and when serve's warm-up ended:
    the last block logged before its "serve warmed up" line (0: no such line)."""
    rows = estimates_replay.load(path)
    before = None
    with open(path) as f:
        n = 0
        for line in f:
            if "serve warmed up" in line:
                before = n
                break
            n += "block: " in line
    warm = rows[before - 1]["t"] if before else 0.0
    rows.sort(key=lambda r: r["t"])
    return rows, warm


def steps(rows, warm, step_ms, expected):
    """Mean relative error per step per model, `expected(row)` the estimate of a block."""
    out, cur = collections.defaultdict(list), None
    def close(c):
        if c and c["t"] >= warm:
            out[c["model"]].append(abs(c["e"] - c["ms"]) / c["ms"])
    for r in rows:
        if cur and cur["model"] == r["model"] and cur["ms"] < step_ms and r["first"] == cur["next"]:
            cur["ms"] += r["ms"]; cur["e"] += expected(r); cur["next"] = r["last"] + 1
        else:
            close(cur)
            cur = {"model": r["model"], "ms": r["ms"], "e": expected(r), "next": r["last"] + 1, "t": r["t"]}
    close(cur)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--step-ms", type=float, default=2.0)
    a = ap.parse_args()
    print("| log | model | per step | oracle per step | per block | oracle per block | block compute CV | consecutive rho |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in a.logs:
        rows, warm = load(path)
        key = lambda r: (r["model"], r["first"], r["last"], r["resident"])
        compute = collections.defaultdict(list)
        for r in rows:
            if r["t"] >= warm:
                compute[key(r)].append(r["ms"] - r["wait"])
        med = {k: statistics.median(v) for k, v in compute.items()}
        oracle = lambda r: med.get(key(r), r["ms"] - r["wait"]) + r["wait"]
        real, best = steps(rows, warm, a.step_ms, lambda r: r["expected"]), steps(rows, warm, a.step_ms, oracle)
        for m in sorted(real):
            after = [r for r in rows if r["model"] == m and r["t"] >= warm]
            blk = statistics.mean(abs(r["expected"] - r["ms"]) / r["ms"] for r in after)
            blk_o = statistics.mean(abs(oracle(r) - r["ms"]) / r["ms"] for r in after)
            cv = statistics.median(statistics.pstdev(v) / statistics.mean(v)
                                   for k, v in compute.items() if k[0] == m and len(v) >= 5 and statistics.mean(v) > 0)
            res = [math.log(r["ms"] / r["expected"]) for r in after if r["wait"] < 0.05 and r["expected"] > 0]
            rho = statistics.correlation(res[:-1], res[1:]) if len(res) > 3 else float("nan")
            print(f"| {path.split('/')[-1]} | {m} | {statistics.mean(real[m]):.3f} | {statistics.mean(best[m]):.3f} | "
                  f"{blk:.3f} | {blk_o:.3f} | {cv:.2f} | {rho:.2f} |")


if __name__ == "__main__":
    main()
