#!/usr/bin/python3
"""Hostile input to `swapnet serve` (issue 18): seeded random scenario files and random bytes on
the control socket. Never a crash, a hang or a changed output.

Scenarios: a valid two-model scenario mutated at random (a field replaced by a hostile value -
wrong types, negative, huge, empty, 5,000 characters, unicode, nesting - a field deleted, an
unknown field added, the text truncated or a byte flipped). Each runs `serve --duration 0.5`:
it must exit 0 (then its JSON parses, every output is bit-identical and no model is over
budget) or 2 with one error line naming the scenario file; any other status, a signal or a
time-out fails.

Control socket: while a serve runs, clients send random lines (random bytes with NUL and
newlines inside, lines over the 4,096-byte limit, half lines then a close, hostile `budget`
sizes, `status`, bursts of connections). Every answered line is `ok N`, `error: ...` or the
status JSON; the server still answers `status` at the end, and the serve, ended by SIGTERM,
exits 0 with outputs bit-identical and 0 over budget.

The default run takes 12 mutants (each kind of mutation comes up; the same seed, so the same 12
every run); a long run (SWAPNET_LONG_TESTS=1) at least 200.

  serve_fuzz_test.py SWAPNET_CLI RESNET18.pt MOBILENET_V2.pt WORKDIR [SEED] [MUTATIONS]
"""
import copy
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

from cli_test_util import Checks, long_tests, read_until_closed, run, test_env

HOSTILE = [None, True, -1, 0, 1, 2 ** 64, -2 ** 63, 1e308, -1e-300, 0.5, "", "x" * 5000, "é☃\u0000",
           "-5MiB", "1e400", "100%", "0%", "999999999999999999999999%", "12 MiB", [], [1, 2], {}, {"a": {"b": []}},
           "../../../etc/passwd", "resnet18.swapnet"]


def paths(obj, at=()):
    """Every (path) to a value inside obj."""
    yield at
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, at + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, at + (i,))


def mutate(base, rng):
    s = copy.deepcopy(base)
    ps = [p for p in paths(s) if p]
    p = rng.choice(ps)
    parent = s
    for k in p[:-1]:
        parent = parent[k]
    kind = rng.random()
    if kind < 0.6:
        parent[p[-1]] = copy.deepcopy(rng.choice(HOSTILE))
        what = f"{'.'.join(map(str, p))} = {json.dumps(parent[p[-1]])[:40]}"
    elif kind < 0.8 and isinstance(parent, dict):
        del parent[p[-1]]
        what = f"{'.'.join(map(str, p))} deleted"
    else:
        target = parent if isinstance(parent, dict) else s
        target["surprise"] = rng.choice(HOSTILE)
        what = "unknown field added"
    text = json.dumps(s)
    r = rng.random()
    if r < 0.1:
        cut = rng.randrange(len(text))
        text, what = text[:cut], f"truncated at {cut}"
    elif r < 0.2:
        i = rng.randrange(len(text))
        text = text[:i] + chr(rng.randrange(1, 256)) + text[i + 1:]
        what += f", byte {i} flipped"
    return text, what


def main() -> int:
    cli, r18, mv2, work = sys.argv[1:5]
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    count = int(sys.argv[6]) if len(sys.argv) > 6 else 40
    if long_tests():
        count = max(count, 200)
    rng = random.Random(seed)
    os.makedirs(work, exist_ok=True)
    checks = Checks()
    expect = checks.expect
    for pt in (r18, mv2):
        img = os.path.join(work, os.path.basename(pt).replace(".pt", ".swapnet"))
        if not os.path.exists(img):
            rc, _, err = run(cli, "pack", pt, "-o", img, "--input-shape", "1,3,64,64")
            if rc != 0:
                print(err, file=sys.stderr)
                return 1
    base = {"name": "fuzz", "total_budget": "70%", "duration_s": 0.5, "policy": "paper",
            "models": [{"name": "r18", "image": "resnet18.swapnet", "urgency": 2, "period_ms": 50, "slo_ms": 200},
                       {"name": "mv2", "image": "mobilenet_v2.swapnet", "input_shape": "1,3,64,64"}],
            "schedule": [{"at_s": 0.2, "budget": "55%"}]}

    outcomes = {0: 0, 2: 0}
    for i in range(count):
        text, what = mutate(base, rng)
        path = os.path.join(work, f"mutant{i}.json")
        with open(path, "w") as f:
            f.write(text)
        try:
            p = subprocess.run([cli, "serve", path, "--json", "--socket", "none", "--duration", "0.5"],
                               capture_output=True, encoding="utf-8", errors="replace", env=test_env(cli), timeout=120)
        except subprocess.TimeoutExpired:
            expect(False, f"mutant {i} ({what}): serve did not end within 120 s")
            continue
        rc, out, err = p.returncode, p.stdout, p.stderr
        expect(rc in (0, 2), f"mutant {i} ({what}): exit {rc}: {err[-400:]}")
        outcomes[rc] = outcomes.get(rc, 0) + 1
        if rc == 2:
            lines = [l for l in err.splitlines() if l.startswith("swapnet: error:")]
            expect(len(lines) == 1 and path in lines[0], f"mutant {i} ({what}): error names the file: {err[-300:]}")
        elif rc == 0:
            try:
                j = json.loads(out)
                expect(all(m["equal"] and m["over_budget"] == 0 for m in j["models"]),
                       f"mutant {i} ({what}): outputs or budgets: {[(m['name'], m['equal'], m['over_budget']) for m in j['models']]}")
            except (ValueError, KeyError) as e:
                expect(False, f"mutant {i} ({what}): --json output unreadable: {e}")
    print(json.dumps({"mutants": count, "served": outcomes.get(0, 0), "refused": outcomes.get(2, 0)}))
    expect(outcomes.get(0, 0) > 0 and outcomes.get(2, 0) > 0, f"both outcomes seen: {outcomes}")

    # The control socket under random clients.
    sock = os.path.join(work, "fuzz.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    path = os.path.join(work, "control.json")
    scen = copy.deepcopy(base)
    scen.pop("schedule")
    scen["duration_s"] = 120  # ended by SIGTERM once the clients are done, as a user's Ctrl-C would
    with open(path, "w") as f:
        json.dump(scen, f)
    p = subprocess.Popen([cli, "serve", path, "--json", "--socket", sock], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=test_env(cli))
    for _ in range(400):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    expect(os.path.exists(sock), "control socket appears")

    def client(data, close_early=False, timeout=5.0):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(timeout)
        try:
            # A socket with a timeout connects non-blocking: a full backlog (a burst of idle
            # clients the server has not accepted yet, on a loaded machine) answers EAGAIN at
            # once, where `swapnet ctl`'s blocking connect waits. Wait as it does.
            give_up = time.monotonic() + timeout
            while True:
                try:
                    c.connect(sock)
                    break
                except BlockingIOError:
                    if time.monotonic() > give_up:
                        raise
                    time.sleep(0.01)
            c.sendall(data)
            if close_early:
                c.shutdown(socket.SHUT_WR)
            return read_until_closed(c).decode("utf-8", "replace")
        finally:
            c.close()

    sizes = ["30MiB", "1", "0", "-5", "1e400", "18446744073709551616", "999999999TiB", "12.5 MiB", "nan",
             "70%", "MiB", "9" * 300, "40MiB", "25MiB"]
    answered = 0
    for i in range(120 if os.path.exists(sock) else 0):
        r = rng.random()
        close_early = False
        if r < 0.3:
            data = ("budget " + rng.choice(sizes) + "\n").encode()
        elif r < 0.4:
            data = b"status\n"
        elif r < 0.6:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) + b"\n"
        elif r < 0.7:
            data = b"budget " + b"7" * 5000 + b"\n"  # over the line limit
        elif r < 0.85:
            data = bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 50)))  # no newline
            close_early = True
        else:
            data = b"\n"
        try:
            reply = client(data, close_early)
        except OSError as e:
            expect(False, f"client {i} ({data[:40]!r}): {e}")
            continue
        reply = reply.strip()
        if reply:
            answered += 1
            ok = reply.startswith("ok ") or reply.startswith("error:") or reply.startswith("{")
            expect(ok, f"client {i} ({data[:40]!r}): reply {reply[:200]!r}")
            if reply.startswith("{"):
                try:
                    json.loads(reply)
                except ValueError:
                    expect(False, f"client {i}: status is not JSON: {reply[:200]!r}")
    # A burst of idle connections, then the server still answers.
    idle = []
    for _ in range(80):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            c.connect(sock)
            idle.append(c)
        except OSError:
            c.close()
    try:
        status = client(b"status\n", timeout=10).strip()
        expect(status.startswith("{") and "total_budget_bytes" in json.loads(status), f"status after the fuzz: {status[:200]!r}")
    except (OSError, ValueError) as e:
        expect(False, f"status after the fuzz: {e}")
    for c in idle:
        c.close()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=180)
    expect(p.returncode == 0, f"serve under fuzzed control exit {p.returncode}: {err[-400:]}")
    if p.returncode == 0:
        j = json.loads(out)
        expect(all(m["equal"] and m["over_budget"] == 0 for m in j["models"]),
               f"fuzzed control: outputs or budgets {[(m['name'], m['equal'], m['over_budget']) for m in j['models']]}")
        print(json.dumps({"control_clients": 120, "answered": answered, "adaptations": len(j.get("adaptations", []))}))
    return checks.exit_status("serve fuzz")


if __name__ == "__main__":
    sys.exit(main())
