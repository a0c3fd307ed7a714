"""The process that writes the stages' MLflow runs, shared by every stage process of this user and
checkout while it lives.

Importing MLflow and opening its SQLite store take about 3 s: more than a data stage with little to do
takes for its work. So a stage does not import MLflow; it sends its run, a JSON line at a time, to a
writer on a Unix socket, which the first stage starts (`python -m lmpipe.run_writer`) and the next
stages of the pipeline find there already warm. It ends 30 s after its last stage has gone.

- Found by a socket in a folder only this user can enter, named by the digest of what the writer runs
  with: this interpreter, this checkout's tracking code, the `MLFLOW_*` settings (the store's URI is
  sent with each run, so one writer serves every store).
- Started under a file lock by a stage that found none: the stage binds the socket and hands it to the
  writer, so it connects at once and goes on with its work while the writer imports MLflow.
- One thread per stage process; the writes themselves one at a time, each in the stage's folder (where
  MLflow resolves relative paths). A stage that ends without ending its run (killed) leaves it KILLED.
- An error writing a run answers that stage's next question (the run's id, an artifact, the end), so
  the stage fails with one line; the other stages' runs go on.
- Idle, it removes its socket under the lock, serves whatever connected before that, and exits.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from lmpipe.runtime import StageError

IDLE_SECONDS = 30.0
_CODE = (Path(__file__), Path(__file__).with_name("tracking.py"))


def socket_path() -> Path:
    """Where this user's writer for this interpreter, code and MLflow settings listens."""
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith("MLFLOW_"))
    settings = [(k, v) for k, v in settings if k != "MLFLOW_TRACKING_URI"]
    code = [path.read_bytes() for path in _CODE]  # (checkouts with the same code share a writer)
    key = hashlib.sha256(repr((sys.executable, code, settings)).encode()).hexdigest()
    base = Path(tempfile.gettempdir())
    if len(str(base)) > 60:  # a Unix socket's path has at most 107 bytes
        base = Path("/tmp")
    folder = base / f"lmpipe-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise StageError(f"MLflow: {folder} is not a folder only this user can enter; remove it")
    return folder / f"runs-{key[:16]}.sock"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Held while a writer is started, and while one gives up its socket."""
    with open(path.with_suffix(".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _dial(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):  # none, or one that died and left its socket
        sock.close()
        return None
    return sock


class Connection:
    """A stage process's line to the writer: messages out, answers in (see `stage_run`)."""

    def __init__(self) -> None:
        self.path = path = socket_path()  # (absolute: connect() resolves it against this folder)
        sock = _dial(path)
        if sock is None:
            with _locked(path):
                sock = _dial(path) or _start(path)
        self.sock = sock
        self.lines: TextIO = sock.makefile("r", encoding="utf-8")
        self.broken = False  # the writer closed it after an error: the next run needs a new one

    def send(self, op: str, **fields: Any) -> None:
        with suppress(OSError):  # it stopped: the next `reply` says why
            self.sock.sendall((json.dumps({"op": op, **fields}) + "\n").encode())

    def reply(self) -> dict[str, Any]:
        try:
            line = self.lines.readline()
        except OSError:
            line = ""
        if not line:
            self.broken = True
            raise StageError("MLflow: the process writing the runs ended before answering")
        answer = json.loads(line)
        if "error" in answer:
            self.broken = True
            raise StageError(f"MLflow ({answer['uri']}): {answer['error']}")
        return answer


def _start(path: Path) -> socket.socket:
    """A writer on a socket bound here, and this process's connection to it (accepted once it runs)."""
    path.unlink(missing_ok=True)  # a dead writer's
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    package_root = str(Path(__file__).resolve().parents[1])
    search = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    subprocess.Popen(
        [sys.executable, "-m", "lmpipe.run_writer", str(listener.fileno()), str(path)],
        pass_fds=[listener.fileno()],
        cwd=package_root,  # (its `lmpipe`, not one in the stage's folder)
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # it outlives the stage: it must not hold the stage's log open
        start_new_session=True,  # nor get the stage's Ctrl-C
        env={**os.environ, "PYTHONPATH": search},
    )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    listener.close()
    return sock


@dataclass
class _Stage:
    """What the writer knows of one connected stage process."""

    cwd: str = ""
    uri: str = "?"
    client: Any = None
    run_id: str | None = None


class _Writes:
    """The writes, in MLflow's client API; one at a time (`lock`), in the stage's folder."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        threading.Thread(target=self._import, daemon=True).start()

    def _import(self) -> None:
        try:
            import mlflow  # noqa: F401  (the slow part: as soon as the writer starts)
            from mlflow.store.tracking import sqlalchemy_store  # noqa: F401
        except BaseException as exc:  # answered to every stage
            self.failure = exc
        self.ready.set()

    def handle(self, stage: _Stage, message: dict[str, Any]) -> dict[str, Any] | None:
        self.ready.wait()
        if self.failure is not None:
            raise self.failure
        op = message.pop("op")
        with self.lock:
            if op == "start":
                stage.cwd, stage.uri = message.pop("cwd"), message["uri"]
            os.chdir(stage.cwd)
            return getattr(self, op)(stage, **message)

    def start(
        self,
        stage: _Stage,
        uri: str,
        experiment: str,
        execution: dict[str, str],
        tags: dict[str, str],
        run_name: str,
        started_at: float,
        source: str,
        params: dict[str, str],
    ) -> dict[str, str]:
        import mlflow
        from mlflow.entities import Param
        from mlflow.tracking.context.default_context import DefaultRunContext
        from mlflow.tracking.context.git_context import GitRunContext

        from lmpipe.tracking import MLFLOW_BATCH, experiment_id, pipeline_parent

        stage.client = mlflow.MlflowClient(uri)
        experiment_id_ = experiment_id(stage.client, experiment)
        parent = pipeline_parent(stage.client, experiment_id_, execution)
        sys.argv[:1] = [source]  # MLflow names the run's source, and finds its git commit, by the program
        context: dict[str, str] = {}
        for provider in (DefaultRunContext(), GitRunContext()):  # new ones: not another stage's commit
            if provider.in_context():
                context |= provider.tags()
        all_tags = {**context, **tags, "mlflow.parentRunId": parent}
        run = stage.client.create_run(experiment_id_, int(started_at * 1000), all_tags, run_name)
        stage.run_id = run.info.run_id
        flat = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(flat), MLFLOW_BATCH):
            stage.client.log_batch(stage.run_id, params=flat[i : i + MLFLOW_BATCH])
        return {"run_id": stage.run_id, "parent_id": parent}

    def metrics(self, stage: _Stage, metrics: dict[str, float]) -> None:
        self._log(stage, [(key, value, 0) for key, value in metrics.items()])

    def series(self, stage: _Stage, key: str, values: list[float], first_step: int) -> None:
        self._log(stage, [(key, value, first_step + i) for i, value in enumerate(values)])

    def _log(self, stage: _Stage, points: list[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric

        from lmpipe.tracking import MLFLOW_METRIC_BATCH

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value, step in points]
        for i in range(0, len(metrics), MLFLOW_METRIC_BATCH):
            stage.client.log_batch(stage.run_id, metrics=metrics[i : i + MLFLOW_METRIC_BATCH])

    def tags(self, stage: _Stage, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        stage.client.log_batch(stage.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def artifact(self, stage: _Stage, path: str) -> dict:
        stage.client.log_artifact(stage.run_id, path)
        return {}

    def end(self, stage: _Stage, status: str, seconds: float | None) -> dict:
        if seconds is not None:
            self._log(stage, [("duration_s", seconds, 0)])
        stage.client.set_terminated(stage.run_id, status)
        stage.run_id = None
        return {}

    def gone(self, stage: _Stage) -> None:
        """The stage's process ended (or was killed) without ending its run."""
        if stage.run_id is not None and self.failure is None:
            with self.lock:
                os.chdir(stage.cwd)
                stage.client.set_terminated(stage.run_id, "KILLED")


class _Count:
    """The stage processes connected (the threads that serve them end on their own)."""

    def __init__(self) -> None:
        self._lock, self._n = threading.Lock(), 0

    def add(self, n: int) -> None:
        with self._lock:
            self._n += n

    def __bool__(self) -> bool:
        return self._n > 0


def _serve_stage(conn: socket.socket, writes: _Writes, connected: _Count) -> None:
    stage = _Stage()
    with conn, conn.makefile("r", encoding="utf-8") as lines:
        try:
            for line in lines:
                answer = writes.handle(stage, json.loads(line))
                if answer is not None:
                    conn.sendall((json.dumps(answer) + "\n").encode())
            writes.gone(stage)
        except Exception as exc:  # this stage's: it fails with this line, the others go on
            error = {"error": f"{type(exc).__name__}: {exc}", "uri": stage.uri}
            with suppress(OSError):
                conn.sendall((json.dumps(error) + "\n").encode())
        finally:
            connected.add(-1)


def serve(fd: int, path: Path) -> None:
    """`python -m lmpipe.run_writer <fd> <path>`: accept stage processes on the socket `fd` until none
    has been connected for IDLE_SECONDS."""
    listener = socket.socket(fileno=fd)
    ours = path.stat().st_ino
    writes, connected = _Writes(), _Count()

    def accept() -> None:
        conn, _ = listener.accept()
        connected.add(1)
        threading.Thread(target=_serve_stage, args=(conn, writes, connected), daemon=True).start()

    idle_since = time.monotonic()
    while True:
        if select.select([listener], [], [], 1.0)[0]:
            accept()
        if connected:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_SECONDS:
            break
    # no new stage finds this writer; those that connected before are served (its folder may be gone)
    with suppress(OSError), _locked(path):
        if path.stat().st_ino == ours:  # (not a newer writer's)
            path.unlink()
    listener.setblocking(False)
    while True:
        try:
            accept()
        except BlockingIOError:
            break
    listener.close()
    while connected:
        time.sleep(0.1)


if __name__ == "__main__":
    serve(int(sys.argv[1]), Path(sys.argv[2]))
    os._exit(0)  # every write is committed; the interpreter's teardown (0.5 s of MLflow) only delays
