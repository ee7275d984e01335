#!/usr/bin/python3
"""Replays a central scheduler's block estimates from serve's debug log (issue 48).

`swapnet serve SCENARIO --log-level debug ... 2> LOG` writes one `block:` line per block the
central scheduler timed (Runtime::Impl::log_block in scheduler/src/runtime_worker.cpp): when it
ended, the model, the block, what it took, what was expected of it and the machine's pace then.
This prints, per model, the mean |expected - measured| / measured per block and per step (the
blocks of one grant: consecutive blocks of a model while the step has run under --step-ms,
Note [Steps of a grant]), after --skip-s seconds, as logged and with the pace replayed under
other rules (Note [The machine's pace] in scheduler/src/estimates.cpp): each row takes the
logged estimate over the logged pace and multiplies it by the replayed pace.

  bench/estimates_replay.py LOG... [--skip-s 5] [--step-ms 2]
"""
import argparse
import collections
import math
import statistics


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            if "block: " not in line:
                continue
            d = dict(kv.split("=", 1) for kv in line.split("block: ", 1)[1].split())
            rows.append({k: (v if k == "model" else float(v)) for k, v in d.items()})
    return rows


def ewma(alpha, clamp=1.0, step=None):
    """A pace rule: the log ratio clamped to +-clamp; one run moves the pace by at most alpha x step."""
    def update(lp, ratio):
        x = max(-clamp, min(clamp, math.log(max(ratio, 1e-9))))
        d = x - lp[0]
        if step is not None:
            d = max(-step, min(step, d))
        lp[0] += alpha * d
    return update


def score(rows, rule, skip_s, step_ms):
    """Per model: mean error per step and per block; rule None: the logged estimates."""
    t0 = rows[0]["t"]
    lp = [0.0]
    steps, blocks = collections.defaultdict(list), collections.defaultdict(list)
    cur = None

    def close(c):
        if c and c["t"] > t0 + skip_s * 1000:
            steps[c["model"]].append(abs(c["e"] - c["ms"]) / c["ms"])

    for r in rows:
        base = r["expected"] / r["pace"] if r["pace"] > 0 else r["expected"]
        e = r["expected"] if rule is None else base * math.exp(lp[0])
        if cur and cur["model"] == r["model"] and r["first"] == cur["last"] + 1 and cur["ms"] < step_ms:
            cur["e"] += e
            cur["ms"] += r["ms"]
            cur["last"] = r["last"]
        else:
            close(cur)
            cur = {"model": r["model"], "last": r["last"], "e": e, "ms": r["ms"], "t": r["t"]}
        if r["t"] > t0 + skip_s * 1000:
            blocks[r["model"]].append(abs(e - r["ms"]) / r["ms"])
        if rule is not None and base > 0:
            rule(lp, r["ms"] / base)
    close(cur)
    return ({m: statistics.mean(v) for m, v in steps.items()}, {m: statistics.mean(v) for m, v in blocks.items()})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--skip-s", type=float, default=5, help="seconds of blocks not scored (the warm-up)")
    ap.add_argument("--step-ms", type=float, default=2, help="a step's length (0: every block its own step)")
    a = ap.parse_args()
    rules = {"logged": None, "no pace": lambda lp, r: None, "alpha 0.1": ewma(0.1),
             "alpha 0.1, step 0.2": ewma(0.1, step=0.2), "alpha 0.1, clamp 0.3": ewma(0.1, clamp=0.3),
             "alpha 0.2, step 0.2": ewma(0.2, step=0.2), "alpha 0.05, step 0.2": ewma(0.05, step=0.2)}
    for path in a.logs:
        rows = load(path)
        if not rows:
            print(f"{path}: no block lines (run serve with --log-level debug and a central scheduler)")
            continue
        print(f"{path}: {len(rows)} blocks; per model, mean error per step / per block; median over models")
        for name, rule in rules.items():
            st, bl = score(rows, rule, a.skip_s, a.step_ms)
            per = "  ".join(f"{m} {st[m]:.3f}/{bl[m]:.3f}" for m in sorted(st))
            print(f"  {name:22s} {statistics.median(st.values()):.3f}/{statistics.median(bl.values()):.3f}   {per}")


if __name__ == "__main__":
    main()
