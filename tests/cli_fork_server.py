#!/usr/bin/python3
"""Starts and stops the tests' fork server for swapnet-cli (Note [The CLI's fork server] in
tests/cli_fork_server.cpp): ctest's fixture `cli_fork_server`.

  cli_fork_server.py start SERVER_BINARY SOCKET LAUNCHER
  cli_fork_server.py stop SOCKET

start: runs the server in a session of its own (it outlives this script; it stops by itself
after 10 minutes without a request), with the environment the launcher gives swapnet-cli, and
writes SOCKET.env (its load-time variables: a command whose differ runs as its own process) and
SOCKET.pid. It checks that the server answers a command as swapnet-cli does.
"""
import json
import os
import signal
import subprocess
import sys
import time

from cli_test_util import as_launched, load_time_vars, run, test_env

IDLE_S = 600


def stop(sock):
    try:
        with open(sock + ".pid") as f:
            pid = int(f.read())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    for path in (sock, sock + ".env", sock + ".pid"):
        try:
            os.remove(path)
        except OSError:
            pass


def start(server, sock, launcher):
    stop(sock)
    env = as_launched(test_env(launcher))
    log = open(sock + ".log", "w")
    p = subprocess.Popen([server, "--fork-server", sock, str(IDLE_S)], env=env, stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > deadline:
            print(f"cli_fork_server.py: the server did not start (exit {p.poll()}); see {sock}.log", file=sys.stderr)
            return 1
        time.sleep(0.05)
    with open(sock + ".pid", "w") as f:
        f.write(str(p.pid))
    with open(sock + ".env", "w") as f:
        json.dump(load_time_vars(env), f)
    # The same answer from the server as from the process.
    os.environ["SWAPNET_TEST_FORK_SERVER"] = sock
    forked = run(launcher, "info", "--json")
    os.environ["SWAPNET_TEST_FORK_SERVER"] = ""
    alone = run(launcher, "info", "--json")
    same = forked[0] == alone[0] == 0 and json.loads(forked[1]).keys() == json.loads(alone[1]).keys()
    print(f"cli_fork_server.py: server {p.pid} on {sock}; `info --json` the same as its own process: {same}")
    if not same:
        print(f"forked: {forked}\nalone: {alone}", file=sys.stderr)
        stop(sock)
        return 1
    return 0


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "start":
        return start(*sys.argv[2:5])
    if len(sys.argv) == 3 and sys.argv[1] == "stop":
        stop(sys.argv[2])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
