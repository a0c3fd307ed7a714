"""The data stages' progress: a bar on a terminal, a line in the logs elsewhere."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm import tqdm

from lmpipe.runtime import log


class Meter:
    """A data stage's progress: a bar on a terminal; elsewhere (the logs of `dvc repro`, Prefect, CI) a
    line at least every `every` seconds with documents/s, MB/s, the share dropped so far and an ETA.

    `total_docs` (or, when unknown, `total_bytes`) gives the fraction done that the ETA is made of."""

    def __init__(
        self,
        desc: str,
        total_docs: int | None = None,
        total_bytes: int | None = None,
        every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        terminal: bool | None = None,
    ) -> None:
        self.desc, self.every, self.clock = desc, every, clock
        self.total_docs, self.total_bytes = total_docs, total_bytes
        self.docs = self.bytes = self.dropped = 0
        self.start = self.last = clock()
        terminal = sys.stderr.isatty() if terminal is None else terminal
        self.bar = tqdm(total=total_docs, desc=desc, unit="doc", dynamic_ncols=True) if terminal else None

    def update(self, docs: int = 0, nbytes: int = 0, dropped: int = 0) -> None:
        self.docs += docs
        self.bytes += nbytes
        self.dropped += dropped
        if self.bar is not None:
            self.bar.update(docs)
            if self.dropped:
                self.bar.set_postfix(dropped=f"{100 * self.dropped / max(self.docs, 1):.1f}%", refresh=False)
        elif self.clock() - self.last >= self.every:
            self.last = self.clock()
            log.info("%s", self.line())

    def done_fraction(self) -> float | None:
        if self.total_docs:
            return min(self.docs / self.total_docs, 1.0)
        if self.total_bytes:
            return min(self.bytes / self.total_bytes, 1.0)
        return None

    def line(self) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        parts = [f"{self.desc}: {self.docs:,} documents", f"{self.docs / elapsed:,.0f} docs/s"]
        if self.bytes:
            parts.append(f"{self.bytes / elapsed / 1e6:.2f} MB/s")
        if self.dropped:
            parts.append(f"{100 * self.dropped / max(self.docs, 1):.1f}% dropped")
        fraction = self.done_fraction()
        if fraction:
            eta = elapsed * (1 - fraction) / fraction
            parts.append(f"{100 * fraction:.0f}% done, ETA {eta // 60:.0f} min {eta % 60:02.0f} s")
        return ", ".join(parts)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            log.info("%s (finished)", self.line())
