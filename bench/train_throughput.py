"""Training throughput: our models vs the Hugging Face transformers references with identical sizes.

    python bench/train_throughput.py [--steps 10] [--warmup 3] [--size tiny]

For each objective (MLM: BertForMaskedLM, CLM: GPT2LMHeadModel, span: T5ForConditionalGeneration) one
fwd+bwd+AdamW step on the same batch, alternating ours and the reference in one process, the median of
the timed steps after warm-up; then each model's peak memory in a child process of its own.
Prints one JSON line per objective. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.params.pretrain import PretrainParams, objectives_params  # noqa: E402
from lmpipe.pretraining import train_config  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.objectives.base import batch_generator
from models.pretraining import PretrainModule, make_batch  # noqa: E402

# vocabulary, width, layers, heads, feed-forward width, sequence, batch: the measured size, and one for
# a smoke run (tests/test_bench.py)
SIZES = {
    "bench": (16000, 256, 4, 4, 1024, 128, 16),
    "tiny": (1000, 64, 2, 2, 128, 32, 4),
}
ARCH = {"mlm": "encoder", "clm": "decoder", "span": "encoder_decoder"}


def batch_for(objective: str, size: str) -> dict[str, torch.Tensor]:
    vocab, _, _, _, _, seq, batch = SIZES[size]
    cfg = train_config(
        ARCH[objective], objective, PretrainParams(seq_len=seq, batch_size=batch), objectives_params(), 0
    )
    g = batch_generator(0, 0)
    rows = torch.randint(107, vocab, (batch, cfg.row_length()), generator=g)
    return make_batch(rows, cfg, g, vocab)


def ours(objective: str, size: str):
    vocab, width, layers, heads, ff, seq, _ = SIZES[size]
    cfg = ModelConfig(
        arch=ARCH[objective],
        vocab_size=vocab,
        d_model=width,
        n_layers=layers,
        n_heads=heads,
        d_ff=ff,
        max_len=seq,
        bias=True,
    )
    train = train_config(ARCH[objective], objective, PretrainParams(seq_len=seq), objectives_params(), 0)
    module = PretrainModule(cfg, train)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=True)

    def step(batch: dict[str, torch.Tensor]) -> float:
        loss, _, _ = module.training_loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def reference(objective: str, size: str):
    import transformers as tf

    vocab, width, layers, heads, ff, seq, _ = SIZES[size]
    if objective == "mlm":
        model = tf.BertForMaskedLM(
            tf.BertConfig(
                vocab_size=vocab,
                hidden_size=width,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                intermediate_size=ff,
                max_position_embeddings=seq,
            )
        )
    elif objective == "clm":
        config = tf.GPT2Config(
            vocab_size=vocab, n_embd=width, n_layer=layers, n_head=heads, n_inner=ff, n_positions=seq
        )
        model = tf.GPT2LMHeadModel(config)
    else:
        model = tf.T5ForConditionalGeneration(
            tf.T5Config(
                vocab_size=vocab,
                d_model=width,
                d_ff=ff,
                num_layers=layers,
                num_decoder_layers=layers,
                num_heads=heads,
                d_kv=width // heads,
                decoder_start_token_id=0,
                pad_token_id=0,
                eos_token_id=3,
            )
        )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: dict[str, torch.Tensor]) -> float:
        ids = batch["input_ids"]
        if objective == "mlm":
            labels = torch.full(ids.shape, -100, dtype=torch.long)
            labels.view(-1)[batch["positions"]] = batch["labels"]
            loss = model(input_ids=ids, labels=labels).loss
        elif objective == "clm":
            loss = model(input_ids=ids, labels=ids).loss  # GPT-2 shifts the labels itself
        else:
            loss = model(input_ids=ids, labels=batch["labels"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_memory_mb(kind: str, objective: str, size: str, queue: multiprocessing.Queue) -> None:
    """Peak resident memory added by building the model and taking three training steps."""
    before = _status_mb("VmRSS")  # VmHWM, unlike ru_maxrss, starts afresh in a new process image
    step = (ours if kind == "ours" else reference)(objective, size)
    batch = batch_for(objective, size)
    for _ in range(3):
        step(batch)
    queue.put(_status_mb("VmHWM") - before)


def measure_memory(target: Callable[..., None], *args: Any) -> float:
    """The peak memory `target(*args, queue)` puts on the queue, run in a spawned process of its own."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=target, args=(*args, queue))
    process.start()
    value = queue.get(timeout=600)
    process.join()
    return round(value, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--objectives", nargs="+", default=["mlm", "clm", "span"])
    parser.add_argument("--size", choices=list(SIZES), default="bench", help="tiny: a smoke run")
    parser.add_argument(
        "--memory", action=argparse.BooleanOptionalAction, default=True, help="peak memory, a process each"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    for objective in args.objectives:
        batch = batch_for(objective, args.size)
        tokens = batch["input_ids"].numel()
        steps = {"ours": ours(objective, args.size), "ref": reference(objective, args.size)}
        times: dict[str, list[float]] = {"ours": [], "ref": []}
        for i in range(args.warmup + args.steps):
            for name, step in steps.items():
                start = time.perf_counter()
                step(batch)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - start)
        ours_tps = tokens / statistics.median(times["ours"])
        ref_tps = tokens / statistics.median(times["ref"])
        line = {
            "objective": objective,
            "ours_tokens_per_s": round(ours_tps),
            "ref_tokens_per_s": round(ref_tps),
            "ratio": round(ours_tps / ref_tps, 2),
            "threads": torch.get_num_threads(),
            "size": args.size,
        }
        if args.memory:
            line["ours_peak_mb"] = measure_memory(peak_memory_mb, "ours", objective, args.size)
            line["ref_peak_mb"] = measure_memory(peak_memory_mb, "ref", objective, args.size)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
