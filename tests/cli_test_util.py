"""Shared pieces of the per-model CLI test scripts (image_cli_test.py, run_cli_test.py)."""
import os
import subprocess
import sys
import time


def test_env(cli):
    """The environment for running the CLI in tests: plans use a device profile kept next to
    the binary (measured by the first test that needs one), never the user's own."""
    env = dict(os.environ)
    env.setdefault("SWAPNET_PROFILE", os.path.join(os.path.dirname(os.path.abspath(cli)), "test-profile",
                                                   "device.json"))
    return env


def long_tests():
    """The long run's sizes (scripts/test.sh --long; Note [Long test runs] in test_util.h)."""
    return os.environ.get("SWAPNET_LONG_TESTS", "0") not in ("", "0")


def run(*args, env=None):
    """Runs a command (with `env`'s variables added to the test environment); returns (exit
    status, stdout, stderr)."""
    t0 = time.monotonic()
    p = subprocess.run(list(args), capture_output=True, text=True, env={**test_env(args[0]), **(env or {})})
    if os.environ.get("SWAPNET_TEST_COMMAND_TIMES"):  # where a test's time goes, command by command
        print(f"[{time.monotonic() - t0:6.2f} s] {' '.join(os.path.basename(a) for a in args[:4])}", file=sys.stderr)
    return p.returncode, p.stdout, p.stderr


class Checks:
    """Collects failed expectations, printing each as it happens."""

    def __init__(self):
        self.failures = []

    def expect(self, cond, what):
        if not cond:
            self.failures.append(what)
            print("FAIL:", what, file=sys.stderr)

    def exit_status(self, name):
        print(f"{name}: {len(self.failures)} failures")
        return 1 if self.failures else 0


def prepare(argv):
    """The per-model scripts' common start: (cli, model, shape, work, name, image path, Checks)."""
    cli, model, shape, work = argv[1:5]
    name = os.path.splitext(os.path.basename(model))[0]
    os.makedirs(work, exist_ok=True)
    return cli, model, shape, work, name, os.path.join(work, name + ".swapnet"), Checks()
