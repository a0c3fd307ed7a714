"""Real servers and workers for tests, on free 127.0.0.1 ports: started as process groups of their own,
waited for until they answer, stopped (with every child) at the end."""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    """A free 127.0.0.1 port below the kernel's ephemeral range: a port bound to 0 elsewhere (a Dask
    worker of a test in another xdist process) cannot take it between this pick and the server's bind,
    which for a Prefect server comes seconds later."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(10_000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def start(
    args: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.Popen:
    return subprocess.Popen(
        list(args),
        cwd=cwd,
        env=dict(env),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_until_up(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, http.client.HTTPException):  # not listening yet, or not our server yet
            pass
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)


def stop(*processes: subprocess.Popen, grace_s: float = 5) -> None:
    """SIGTERM to every process group at once, SIGKILL to those that linger `grace_s` later: the tests
    are done with them, and a Prefect worker that has run flows outlasted a 30 s grace."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def prefect_env(home: Path, port: int, **extra: str) -> dict[str, str]:
    """The environment of Prefect commands against the server on `port` (this venv's tools first)."""
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # pick a run up at once (default: every 10 s)
        **extra,
    }


def prefect_server(env: Mapping[str, str], log: Path) -> subprocess.Popen:
    port = env["PREFECT_API_URL"].split(":")[-1].split("/")[0]
    server = start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", port], log, env)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/api/health", server, log)
    except BaseException:
        stop(server)  # the caller never gets it to stop
        raise
    return server


def prefect(env: Mapping[str, str], *args: str, cwd: Path | None = None) -> str:
    """A `prefect` command that must succeed; its stdout."""
    result = subprocess.run(
        [str(BIN / "prefect"), *args], cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (whatever session it started), children first found first."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        listed = subprocess.run(["ps", "-o", "pid=", "--ppid", str(parent)], capture_output=True, text=True)
        children = [int(p) for p in listed.stdout.split()]
        found += children
        queue += children
    return found


def kill_machine(process: subprocess.Popen) -> None:
    """What a machine failure does to a worker: it and everything it started die at once (SIGKILL)."""
    for pid in [process.pid, *descendants(process.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()
