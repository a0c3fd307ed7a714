"""Processes at once on one machine's cores: PyTorch threads per process, ours (each process its share
of the cores, as the flows and the suite set OMP_NUM_THREADS) vs PyTorch's default (every process a
thread per core).

    python bench/threads.py [--processes 2] [--steps 40]

Each process trains the project's `tiny` decoder (CLM, batch 16 × 128) for `--steps` steps; all start
together and the wall time until the last one ends is the figure. Prints one JSON line per setting and
the ratio. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from flows.plan import cpu_name  # noqa: E402

TRAIN = """
import sys, torch
sys.path.insert(0, {root!r})
from lmpipe.params.pretrain import objectives_params, PretrainParams
from lmpipe.pretraining import train_config
from models.config import PRESETS, ModelConfig
from models.pretraining import PretrainModule, make_batch
from models.objectives.base import batch_generator

torch.manual_seed(0)
model = ModelConfig(arch="decoder", vocab_size=4000, **PRESETS["tiny"])
train = train_config("decoder", "clm", PretrainParams(seq_len=128, batch_size=16), objectives_params(), 0)
module = PretrainModule(model, train)
optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
generator = batch_generator(0, 0)
rows = torch.randint(107, 4000, (16, train.row_length()), generator=generator)
batch = make_batch(rows, train, generator, 4000)
for _ in range({steps}):
    loss, _, _ = module.training_loss(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
"""


def wall(processes: int, threads: int | None, steps: int) -> float:
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    code = TRAIN.format(root=str(ROOT), steps=steps)
    started = time.perf_counter()
    running = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(processes)]
    if any(process.wait() for process in running):
        raise SystemExit("a training process failed")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // args.processes)
    default = wall(args.processes, None, args.steps)
    ours = wall(args.processes, share, args.steps)
    machine = f"{cpu_name() or platform.machine()}, {cores} cores"
    for name, threads, seconds in (("torch default", cores, default), ("ours", share, ours)):
        line = {"setting": name, "threads_each": threads, "processes": args.processes, "wall_s": seconds}
        print(json.dumps({**line, "steps": args.steps, "machine": machine}))
    print(json.dumps({"speedup": default / ours}))


if __name__ == "__main__":
    main()
