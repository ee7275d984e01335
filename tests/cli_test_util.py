"""Shared pieces of the per-model CLI test scripts (image_cli_test.py, run_cli_test.py)."""
import subprocess
import sys


def run(*args):
    """Runs a command; returns (exit status, stdout, stderr)."""
    p = subprocess.run(list(args), capture_output=True, text=True)
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
