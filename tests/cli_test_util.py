"""Shared pieces of the per-model CLI test scripts (image_cli_test.py, run_cli_test.py)."""
import json
import os
import socket
import subprocess
import sys
import tempfile
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


# What libraries read from the environment when they load (OpenBLAS, OpenMP, the loader,
# malloc): a command that sets one of these differently from the fork server runs as its own
# process (Note [The CLI's fork server] in tests/cli_fork_server.cpp).
_LOAD_TIME = ("OPENBLAS_", "GOTO_", "OMP_", "GOMP_", "KMP_", "MKL_", "LD_", "MALLOC_", "GLIBC_TUNABLES")


def as_launched(env):
    """The environment the launcher hands swapnet-cli (cli/launcher.cpp, Note [OpenBLAS's idle
    spin]): OPENBLAS_THREAD_TIMEOUT=4 unless the user set it or GOTO_THREAD_TIMEOUT."""
    env = dict(env)
    if "GOTO_THREAD_TIMEOUT" not in env:
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    return env


def load_time_vars(env):
    return {k: v for k, v in env.items() if k.startswith(_LOAD_TIME)}


def read_until_closed(c, size=65536):
    """Every byte socket `c` sends until it closes its end."""
    data = b""
    while True:
        chunk = c.recv(size)
        if not chunk:
            return data
        data += chunk


_server_vars = {}  # per fork-server socket: its load-time variables (SOCKET.env), read once


def _load_time_vars_of(sock):
    if sock not in _server_vars:
        try:
            with open(sock + ".env") as f:
                _server_vars[sock] = json.load(f)
        except (OSError, ValueError):
            return None  # not started (yet): asked again next time
    return _server_vars[sock]


def _run_forked(args, env):
    """Runs swapnet-cli's command `args` in the tests' fork server when there is one (its socket
    in SWAPNET_TEST_FORK_SERVER, its environment's load-time variables in SOCKET.env); None where
    the command must run as its own process."""
    sock = os.environ.get("SWAPNET_TEST_FORK_SERVER", "")
    if os.environ.get("SWAPNET_TEST_NO_FORK_SERVER", "") not in ("", "0"):
        return None
    if not sock or len(args) < 2 or os.path.basename(str(args[0])) not in ("swapnet", "swapnet-cli"):
        return None
    if args[1] in ("ctl", "check"):  # the launcher answers these itself
        return None
    server_vars = _load_time_vars_of(sock)
    if server_vars is None:
        return None
    env = as_launched(env)
    if load_time_vars(env) != server_vars:
        return None
    request = json.dumps({"argv": [str(a) for a in args], "env": [f"{k}={v}" for k, v in env.items()],
                          "cwd": os.getcwd()}) + "\n"
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        try:
            c.connect(sock)
        except OSError:
            return None  # no server (it stopped when idle, or was never started): run it as a process
        data = request.encode()
        sent = socket.send_fds(c, [data], [out.fileno(), err.fileno()])
        if sent < len(data):
            c.sendall(data[sent:])
        answer = read_until_closed(c)
        kind, _, value = answer.decode().strip().partition(" ")
        if kind not in ("exit", "signal"):
            raise RuntimeError(f"the CLI's fork server ({sock}) answered {answer!r} to {args}")
        out.seek(0)
        err.seek(0)
        rc = int(value) if kind == "exit" else -int(value)
        return rc, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def run(*args, env=None):
    """Runs a command (with `env`'s variables added to the test environment); returns (exit
    status, stdout, stderr). swapnet-cli's commands run in the tests' fork server where there is
    one (Note [The CLI's fork server]): the same command line without loading libtorch again."""
    t0 = time.monotonic()
    full = {**test_env(args[0]), **(env or {})}
    r = _run_forked(args, full)
    if r is None:
        p = subprocess.run(list(args), capture_output=True, text=True, env=full)
        r = (p.returncode, p.stdout, p.stderr)
    if os.environ.get("SWAPNET_TEST_COMMAND_TIMES"):  # where a test's time goes, command by command
        print(f"[{time.monotonic() - t0:6.2f} s] {' '.join(os.path.basename(str(a)) for a in args[:4])}", file=sys.stderr)
    return r


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
