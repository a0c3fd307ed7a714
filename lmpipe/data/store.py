"""A data stage's kept work, so that a corpus that grows costs the new files only: entries addressed
by the digest of what they were computed from (a file's bytes, a shard's documents), kept between
runs beside the stage's outputs (not a DVC output), and an index that records the config and code
they were made with.

- A run whose config or code differs from the index's starts the store empty (one line says why),
  so a changed rule or param re-runs everything.
- An entry is written whole or not at all (a temporary folder renamed), and records the size, mtime
  and sha256 of each of its files. A file whose size or mtime has changed is hashed again, and an
  entry whose bytes differ is recomputed (one line), never trusted. Size and mtime are what DVC trusts
  its own cache by: a run that keeps a 100 GB corpus does not read it again to check it.
- A run that succeeds keeps only the entries it used; a killed run keeps what it finished, and the
  next run continues from there with the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lmpipe.codedeps import code_digest
from lmpipe.runtime import log, sha256_file

INDEX, ENTRY = "index.json", "entry.json"


def digest(*parts: object) -> str:
    """sha256 of the parts as JSON: a key from what an entry is computed from."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class Store:
    """Entries of one stage's work under `root/entries/<key>`; `root/index.json` is its config and code."""

    def __init__(self, root: Path, what: str, config: object, module: str) -> None:
        self.root, self.what = root.resolve(), what
        self.stamp = {"config": json.loads(json.dumps(config, sort_keys=True, default=str))}
        self.stamp["code"] = code_digest(module)

    def open(self) -> Store:
        """The store as the index allows: kept, or emptied with one line saying why."""
        index = self.root / INDEX
        reason = None
        if not index.is_file():
            if self.root.exists():
                reason = f"no {INDEX} in {self.root}"
        else:
            try:
                recorded = json.loads(index.read_text())
            except (OSError, ValueError) as exc:
                reason = f"{index} is unreadable ({type(exc).__name__})"
            else:
                if not isinstance(recorded, dict):
                    reason = f"{index} is not a record"
                elif recorded.get("code") != self.stamp["code"]:
                    reason = "it was built by other code"
                elif recorded.get("config") != self.stamp["config"]:
                    keys = changed_keys(recorded.get("config"), self.stamp["config"])
                    reason = f"it was built with other params ({', '.join(keys)})"
        if reason is not None:
            log.info("%s: rebuilding the kept work in %s: %s", self.what, self.root, reason)
            shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "entries").mkdir(parents=True, exist_ok=True)
        if reason is not None or not index.is_file():
            tmp = index.with_name(f".{INDEX}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(self.stamp, sort_keys=True))
            tmp.replace(index)
        return self

    def path(self, key: str) -> Path:
        return self.root / "entries" / key

    def get(self, key: str) -> Path | None:
        """The entry's folder if it is whole and its files are the bytes it recorded, else None (a
        damaged one is removed, with one line)."""
        folder = self.path(key)
        if not folder.is_dir():
            return None
        problem = damage(folder)
        if problem is None:
            return folder
        log.warning("%s: kept entry %s is damaged (%s); computing it again", self.what, key[:16], problem)
        shutil.rmtree(folder, ignore_errors=True)
        return None

    @contextmanager
    def put(self, key: str) -> Iterator[Path]:
        """A fresh folder to write the entry into; it becomes the entry only if the block succeeds. When
        another process finished the same entry first, its (equal) entry stays."""
        entries = self.root / "entries"
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.tmp-", dir=entries))
        try:
            yield tmp
            files = sorted(f for f in tmp.iterdir() if f.is_file())
            record = {f.name: [f.stat().st_size, f.stat().st_mtime_ns, sha256_file(f)] for f in files}
            (tmp / ENTRY).write_text(json.dumps(record, sort_keys=True))
            try:
                tmp.rename(self.path(key))
            except OSError:
                if not self.path(key).is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Remove every entry this run did not use (after its outputs are in place)."""
        used = set(keys)
        for folder in (self.root / "entries").iterdir():
            if folder.name not in used:
                shutil.rmtree(folder, ignore_errors=True)


class StatMemo:
    """What a stage computes from each input file (its sha256, its row groups' digests), kept in the
    store's root by the file's size, mtime and inode, which DVC trusts its own state by: a run reads
    again only the files whose stat moved, not a 100 GB corpus. A run keeps the values of its files."""

    def __init__(self, store: Store, name: str) -> None:
        self.file = store.root / name
        try:
            kept = json.loads(self.file.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: computed again
            kept = None
        self.kept: dict = kept if isinstance(kept, dict) else {}
        self.used: dict = {}

    def get(self, path: Path, compute: Callable[[Path], Any]) -> Any:
        found = path.stat()
        stamp = [found.st_size, found.st_mtime_ns, found.st_ino]
        key = str(path.resolve())
        kept = self.kept.get(key)
        value = kept[1] if isinstance(kept, list) and len(kept) == 2 and kept[0] == stamp else compute(path)
        self.used[key] = [stamp, value]
        return value

    def save(self) -> None:
        tmp = self.file.with_name(f".{self.file.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.used, sort_keys=True))
        tmp.replace(self.file)


def link(source: Path, target: Path) -> None:
    """`target` as a hard link to a kept file (a copy where the file system has none): the store keeps
    the file whole for the next run."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def damage(folder: Path) -> str | None:
    """What is wrong with an entry's files against its record, or None."""
    try:
        record = json.loads((folder / ENTRY).read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or not all(isinstance(v, list) and len(v) == 3 for v in record.values()):
        return f"no readable {ENTRY}"
    present = {f.name for f in folder.iterdir() if f.name != ENTRY}
    if present != set(record):
        return "its files are not the ones it recorded"
    for name, (size, mtime_ns, sha256) in record.items():
        found = (folder / name).stat()
        if found.st_size != size or (found.st_mtime_ns != mtime_ns and sha256_file(folder / name) != sha256):
            return f"{name} is not the bytes it recorded"
    return None


def changed_keys(old: object, new: object, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = []
        for key in sorted({*old, *new}, key=str):
            keys += changed_keys(old.get(key), new.get(key), f"{prefix}{key}.")
        return keys
    return [] if old == new else [prefix.rstrip(".") or "the config"]
