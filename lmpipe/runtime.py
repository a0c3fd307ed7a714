"""What every stage shares: the one-line error, atomic outputs, logging, progress."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("lmpipe")
_UMASK = os.umask(0)
os.umask(_UMASK)


class StageError(Exception):
    """Bad input or configuration: reported as one line and a non-zero exit, never a traceback."""


def setup_logging() -> None:
    """The stages' log format; also called in worker processes, which start without it."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def run_main(main: Callable[[], object]) -> None:
    """Entry point of `python -m stages.<name>`."""
    setup_logging()
    try:
        main()
    except StageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted; outputs left as they were", file=sys.stderr)
        sys.exit(130)
    except OSError as exc:  # a full disk, a vanished or read-only folder: outputs are written atomically
        stage = Path(sys.argv[0]).stem
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {stage}: {exc.strerror or exc}{where}; outputs left as they were", file=sys.stderr)
        sys.exit(2)


def cpu_threads(requested: int) -> int:
    """`0` means every core this process may use."""
    return requested or len(os.sched_getaffinity(0))


def training_threads(requested: int, processes: int = 1) -> int:
    """A training process's threads: `requested`, or (0) its share of the cores among `processes`
    (per node). Never OMP_NUM_THREADS, which flows set by how many stages run at once."""
    return requested or max(1, cpu_threads(0) // max(1, processes))


def _remove_leftovers(target: Path) -> None:
    """A killed writer's temporary siblings of `target` (SIGKILL skips every `finally`): they would sit
    in a folder that downstream stages hash, making them stale for good. One writer per target at a
    time (DVC's lock), so every such sibling is a leftover."""
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for leftover in target.parent.glob(pattern):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces `target` only if the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o777 & ~_UMASK)  # mkdtemp makes it private; outputs get the usual mode
    try:
        yield tmp
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_file(target: Path, mode: str = "w") -> Iterator[Any]:
    """Write to a temporary sibling, then rename over `target` only if the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(target)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    tmp = Path(tmp_name)
    tmp.chmod(0o666 & ~_UMASK)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, data: Any) -> None:
    with atomic_file(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")


def read_json(path: Path, produced_by: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StageError(f"{path}: missing; run the '{produced_by}' stage first") from None
