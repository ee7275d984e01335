#!/usr/bin/python3
"""Runs a swapnet CLI command and checks its exit status, its output and (for --json output)
properties of the JSON object. Used by ctest so CLI tests can fail for the right reason.

  cli_check.py [--rc N] [--stderr REGEX] [--stdout REGEX] [--check PYEXPR]... -- CMD ARGS...

--check expressions see the parsed stdout JSON as `j`, e.g. "j['equal'] is True".
"""
import argparse
import json
import re
import sys

from cli_test_util import run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rc", type=int, default=0)
    ap.add_argument("--stderr", action="append", default=[])
    ap.add_argument("--stdout", action="append", default=[])
    ap.add_argument("--check", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        print("cli_check.py: no command", file=sys.stderr)
        return 2
    rc, stdout, stderr = run(*cmd)
    print("$", " ".join(cmd))
    print(stdout[-4000:], end="")
    print(stderr[-4000:], end="", file=sys.stderr)
    failures = []
    if rc != a.rc:
        failures.append(f"exit status {rc}, expected {a.rc}")
    if rc < 0:
        failures.append(f"killed by signal {-rc}")
    for r in a.stderr:
        if not re.search(r, stderr):
            failures.append(f"stderr does not match /{r}/")
    for r in a.stdout:
        if not re.search(r, stdout):
            failures.append(f"stdout does not match /{r}/")
    if a.check:
        try:
            j = json.loads(stdout)
        except json.JSONDecodeError as e:
            failures.append(f"stdout is not one JSON object: {e}")
        else:
            for c in a.check:
                try:
                    ok = eval(c, {"j": j})
                except Exception as e:  # noqa: BLE001 - report any failing expression
                    ok, c = False, f"{c} (raised {e!r})"
                if not ok:
                    failures.append(f"check failed: {c}")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
