#!/usr/bin/python3
"""What keeping learned costs buys a program that starts again (Note [Learned costs kept]).

Each round runs two processes, one after the other, each timing the first N inferences of a
fresh swapnet.Executor (learn=3):
  - "cold": no store. The executor starts with the image's layer times and the profile's read
    rate, and learns from its own inferences;
  - "kept": the store the cold process wrote. The executor plans with it from its first
    inference.
The disk is emulated (SWAPNET_EMULATE_READ; --rate host: none, e.g. under bench/throttle.sh for
the blkio throttle), and the profile is this machine's default one, measured at host speed: the
case where learning matters on a slower disk.

Usage: bench/learn_store.py IMAGE BUDGET [--rate 400MB/s|host] [--rounds 3] [--inferences 8]
Prints one JSON line per process, then a Markdown table of medians over the rounds.
Needs SWAPNET_LIB and PYTHONPATH as for tests/python (scripts/build.sh sets them up)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time, torch, swapnet
image, budget, store, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
info = swapnet.image_info(image)
torch.manual_seed(0)
shape = (info.get("input_shapes") or "1,3,224,224").split(";")[0]
x = torch.randn(*[int(v) for v in shape.split(",")])
ex = swapnet.Executor(image, budget=budget, learn=3, learn_store=store or None)
ms = []
for _ in range(n):
    t = time.perf_counter()
    ex(x)
    ms.append((time.perf_counter() - t) * 1e3)
s = ex.stats
print(json.dumps({"ms": ms, "loaded": s["learn_loaded"], "replans": s["learn_replans"], "stored": s["learn_stored"]}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("image")
    ap.add_argument("budget")
    ap.add_argument("--rate", default="400MB/s")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inferences", type=int, default=8)
    a = ap.parse_args()
    env = dict(os.environ)
    if a.rate != "host":
        env["SWAPNET_EMULATE_READ"] = a.rate
    rows = {"cold": [], "kept": []}
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "learned.json")
        for r in range(a.rounds):
            if os.path.exists(store):
                os.remove(store)
            for kind in ("cold", "kept"):
                out = subprocess.run([sys.executable, "-c", CHILD, a.image, a.budget, store, str(a.inferences)],
                                     env=env, capture_output=True, text=True, check=True).stdout
                j = json.loads(out.strip().splitlines()[-1])
                j.update(kind=kind, round=r)
                print(json.dumps(j), flush=True)
                rows[kind].append(j)
    med = lambda kind, lo, hi: statistics.median(statistics.median(j["ms"][lo:hi]) for j in rows[kind])
    n = a.inferences
    total = lambda kind: statistics.median(sum(j["ms"]) for j in rows[kind])
    print(f"\n| process | inference 1, ms | inferences 1-3, ms (median) | inferences 4-{n}, ms (median) | "
          f"all {n}, ms (sum) | costs loaded | re-plans |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for kind in ("cold", "kept"):
        print(f"| {kind} | {med(kind, 0, 1):.1f} | {med(kind, 0, 3):.1f} | {med(kind, 3, n):.1f} | {total(kind):.0f} | "
              f"{sum(j['loaded'] for j in rows[kind])}/{len(rows[kind])} | "
              f"{statistics.median(j['replans'] for j in rows[kind])} |")
    print(f"\nkept / cold: inferences 1-3 {med('kept', 0, 3) / med('cold', 0, 3):.3f}, "
          f"4-{n} {med('kept', 3, n) / med('cold', 3, n):.3f}, all {n} {total('kept') / total('cold'):.3f}")


if __name__ == "__main__":
    main()
