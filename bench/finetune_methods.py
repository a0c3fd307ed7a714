"""Fine-tuning methods (`finetune.method`): the time of a training step and the memory each saves, against
full fine-tuning of the same encoder.

    python bench/finetune_methods.py [--steps 10] [--warmup 3] [--size bench]

On one batch of a sequence-classification fine-tune (the `small` encoder: 4 × 256, 16,000 pieces; 32
rows of 128 tokens) each method takes fwd+bwd+AdamW steps, alternating with full fine-tuning in one
process; the median of the timed steps after warm-up. Then each one's peak memory in a child process
of its own (three steps), and the bytes of what only training keeps: the gradients and AdamW's two
moments of the weights it trains. Prints one JSON line per method, its ratios to full fine-tuning. Not
a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.train_throughput import _status_mb, measure_memory  # noqa: E402
from lmpipe.params.finetune import FinetuneMethods  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.finetune_methods import apply_method, parameter_counts  # noqa: E402
from models.heads import SequenceHead  # noqa: E402
from models.transformer import Transformer, weight_decay_groups  # noqa: E402

# vocabulary, width, layers, heads, feed-forward width, sequence, batch: the measured size (the
# real-cpu profile's encoder), and one for a smoke run (tests/test_bench.py)
SIZES = {"bench": (16000, 256, 4, 4, 1024, 128, 32), "tiny": (1000, 64, 2, 2, 128, 32, 4)}
METHODS = ("full", "frozen", "lora", "houlsby", "pfeiffer", "adamix", "prefix", "prompt")


def step_of(method: str, size: str):
    """One training step of `method` on the size's encoder (params.yaml's options for the method)."""
    vocab, d, layers, heads, ff, length, _ = SIZES[size]
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, d_ff=ff, max_len=length + 32
    )
    head = SequenceHead(Transformer(cfg), 2, frozen=method != "full")
    options = {} if method == "full" else getattr(FinetuneMethods(), method).model_dump(exclude={"lr"})
    apply_method(head.backbone, method, options, 0)
    optimizer = torch.optim.AdamW(weight_decay_groups(head, 0.01), lr=1e-4)
    head.train()

    def step(ids: torch.Tensor, pad: torch.Tensor, labels: torch.Tensor) -> None:
        loss = head.loss(head(ids, pad), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, head


def batch_for(size: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    vocab, *_, length, rows = SIZES[size]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(107, vocab, (rows, length), generator=generator)
    return ids, torch.ones(rows, length, dtype=torch.bool), torch.randint(2, (rows,), generator=generator)


def peak_memory_mb(method: str, size: str, queue: multiprocessing.Queue) -> None:
    """Peak resident memory added by building the model and taking three training steps (peft's
    modules imported before: their code is no method's training memory)."""
    import peft  # noqa: F401

    before = _status_mb("VmRSS")
    step, _ = step_of(method, size)
    batch = batch_for(size)
    for _ in range(3):
        step(*batch)
    queue.put(_status_mb("VmHWM") - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--methods", nargs="+", choices=METHODS[1:], default=list(METHODS[1:]))
    parser.add_argument("--size", choices=list(SIZES), default="bench", help="tiny: a smoke run")
    parser.add_argument(
        "--memory", action=argparse.BooleanOptionalAction, default=True, help="peak memory, a process each"
    )
    args = parser.parse_args()
    batch = batch_for(args.size)
    full_step, full_head = step_of("full", args.size)
    full_memory = measure_memory(peak_memory_mb, "full", args.size) if args.memory else None
    for method in args.methods:
        steps = {"full": full_step, method: step_of(method, args.size)[0]}
        times: dict[str, list[float]] = {name: [] for name in steps}
        for i in range(args.warmup + args.steps):
            for name, step in steps.items():
                start = time.perf_counter()
                step(*batch)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - start)
        _, head = step_of(method, args.size)
        trained, total = parameter_counts(head)
        full_seconds, seconds = statistics.median(times["full"]), statistics.median(times[method])
        # a trained weight's gradient and AdamW's two moments, fp32: what only training keeps
        line = {
            "method": method,
            "trained": trained,
            "total": total,
            "step_seconds": round(seconds, 4),
            "full_step_seconds": round(full_seconds, 4),
            "time_ratio": round(seconds / full_seconds, 2),
            "training_state_mb": round(3 * 4 * trained / 2**20, 2),
            "full_training_state_mb": round(3 * 4 * parameter_counts(full_head)[0] / 2**20, 2),
            "threads": torch.get_num_threads(),
            "size": args.size,
        }
        if args.memory:
            line["peak_mb"], line["full_peak_mb"] = (
                measure_memory(peak_memory_mb, method, args.size),
                full_memory,
            )
            line["memory_ratio"] = round(line["peak_mb"] / full_memory, 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
