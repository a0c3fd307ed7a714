"""Work per shard on every core of this machine, or on the workers of a Dask cluster: the same function
on the same items gives the same results, in the items' order, wherever it runs.

Dask (`distributed`) is the engine of NeMo Curator's fuzzy dedup and runs from a laptop to a cluster
with one scheduler address; a local run needs no scheduler (a process pool). On a cluster every worker
must import this project (`pip install -e .`) and see the stage's folder at the same path (a shared
file system), as datatrove's and Dask's own file-based pipelines assume.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from lmpipe.runtime import StageError

T = TypeVar("T")
R = TypeVar("R")


def shard_map(
    fn: Callable[[T], R], items: Sequence[T], workers: int, scheduler: str | None, what: str
) -> Iterator[R]:
    """`fn` over `items`, results in order: in this process (one worker), a process pool, or Dask.

    A worker that dies (killed, out of memory) ends the stage with one line; shards already finished
    were written whole, so the next run resumes from them."""
    if not items:
        return iter(())
    if scheduler:
        return _dask_map(fn, items, scheduler, what)
    if workers <= 1 or len(items) == 1:
        return map(fn, items)
    return _pool_map(fn, items, min(workers, len(items)), what)


def _pool_map(fn: Callable[[T], R], items: Sequence[T], workers: int, what: str) -> Iterator[R]:
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            yield from pool.map(fn, items)
        except BrokenProcessPool:
            raise StageError(
                f"{what}: a worker process died (killed, or out of memory); the finished shards are "
                "kept: run the stage again to resume"
            ) from None


def _dask_map(fn: Callable[[T], R], items: Sequence[T], scheduler: str, what: str) -> Iterator[R]:
    from distributed import Client
    from distributed.scheduler import KilledWorker

    try:
        client = Client(scheduler, timeout="30s")
    except OSError as exc:
        raise StageError(
            f"{what}: cannot reach the Dask scheduler {scheduler} (cluster.scheduler): {exc}"
        ) from None
    with client:
        futures = client.map(fn, items, pure=False)
        try:
            for future in futures:
                yield future.result()
        except KilledWorker as exc:
            raise StageError(
                f"{what}: Dask workers died on the same shard 3 times ({exc.task}); the finished shards "
                "are kept: run the stage again to resume"
            ) from None
        finally:
            client.cancel(futures)


def map_unless_kept(
    fn: Callable[[T], R],
    items: Sequence[T],
    kept: Sequence[bool],
    workers: int,
    scheduler: str | None,
    what: str,
) -> Iterator[R]:
    """`shard_map` of `fn` over the items an earlier run did not leave in the store; the kept ones (for
    which `fn` only reads what is kept) in this process, so that a run with little to do starts no
    workers. Results in the items' order."""
    todo = [item for item, done in zip(items, kept, strict=True) if not done]
    computed = shard_map(fn, todo, workers, scheduler, what)
    for item, done in zip(items, kept, strict=True):
        yield fn(item) if done else next(computed)
