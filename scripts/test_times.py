#!/usr/bin/python3
"""What the last ctest run cost: the slowest tests, and each label's time against its budget
(tests/time_budgets.json, docs/testing.md). scripts/test.sh prints it at the end of every run, so
that the next slow test is seen when it lands.

  test_times.py BUILD_DIR [--slowest N] [--json]

Reads BUILD_DIR/ctest-junit.xml (ctest --output-junit, per-test times) and the tests' labels
from `ctest --show-only=json-v1`. A label over its budget is said (a warning, not a failure: a
loaded machine is no reason to fail a run); the budgets are for a 2-core machine.
"""
import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

KIND_LABELS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "time_budgets.json")


def times(build):
    """{test name: (seconds, status)} from the junit file of the last run."""
    path = os.path.join(build, "ctest-junit.xml")
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        out[case.get("name")] = (float(case.get("time") or 0), case.get("status") or "")
    return out


def labels(build):
    """{test name: [labels]} as ctest registered them."""
    p = subprocess.run(["ctest", "-N", "--show-only=json-v1"], cwd=build, capture_output=True, text=True, check=True)
    out = {}
    for t in json.loads(p.stdout)["tests"]:
        ls = []
        for prop in t.get("properties", []):
            if prop["name"] == "LABELS":
                ls = list(prop["value"])
        out[t["name"]] = ls
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--slowest", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        t = times(a.build)
    except (OSError, ET.ParseError) as e:
        print(f"test_times: no per-test times in {a.build}/ctest-junit.xml: {e}", file=sys.stderr)
        return 1
    with open(KIND_LABELS_FILE) as f:
        budgets = {k: v["seconds"] for k, v in json.load(f)["labels"].items()}
    lab = labels(a.build)
    per_label = {}
    for name, (sec, _) in t.items():
        kinds = [l for l in lab.get(name, []) if l in budgets] or ["(none)"]
        per_label.setdefault(kinds[0], [0.0, 0])
        per_label[kinds[0]][0] += sec
        per_label[kinds[0]][1] += 1
    slowest = sorted(t.items(), key=lambda kv: -kv[1][0])[: a.slowest]
    total = sum(sec for sec, _ in t.values())
    if a.json:
        print(json.dumps({"tests": len(t), "test_seconds": total,
                          "slowest": [{"name": n, "seconds": s, "status": st} for n, (s, st) in slowest],
                          "labels": {k: {"seconds": v[0], "tests": v[1], "budget_seconds": budgets.get(k)}
                                     for k, v in per_label.items()}}))
        return 0
    print(f"== the slowest {len(slowest)} of {len(t)} tests ({total:.0f} s of test time in all)")
    for n, (s, st) in slowest:
        print(f"  {s:6.1f} s  {n}{'' if st == 'run' else '  (' + st + ')'}")
    print("== test time per label, against its budget (tests/time_budgets.json, for 2 cores)")
    over = []
    for k in sorted(per_label, key=lambda k: -per_label[k][0]):
        sec, n = per_label[k]
        b = budgets.get(k)
        flag = ""
        if b is not None and sec > b:
            flag = "  OVER BUDGET"
            over.append(k)
        print(f"  {k:10s} {sec:6.1f} s  {n:3d} tests  budget {'-' if b is None else f'{b:.0f} s'}{flag}")
    if over:
        print(f"test_times: over budget: {', '.join(over)}: a test that grew, or a loaded machine "
              f"(docs/testing.md says what each label's tests must show)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
