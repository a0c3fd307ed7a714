"""Training throughput: our models vs the Hugging Face transformers references with identical sizes.

    python bench/train_throughput.py [--steps 10] [--warmup 3]

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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe.params.pretrain import ObjectivesParams, PretrainParams  # noqa: E402
from lmpipe.pretraining import train_config  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.lightning import PretrainModule, make_batch  # noqa: E402
from models.objectives.base import batch_generator

V, D, LAYERS, HEADS, FF, SEQ, BATCH = 16000, 256, 4, 4, 1024, 128, 16
ARCH = {"mlm": "encoder", "clm": "decoder", "span": "encoder_decoder"}


def batch_for(objective: str) -> dict[str, torch.Tensor]:
    cfg = train_config(objective, PretrainParams(seq_len=SEQ, batch_size=BATCH), ObjectivesParams(), 0)
    g = batch_generator(0, 0)
    rows = torch.randint(107, V, (BATCH, cfg.row_length()), generator=g)
    return make_batch(rows, cfg, g, V)


def ours(objective: str):
    cfg = ModelConfig(
        arch=ARCH[objective],
        vocab_size=V,
        d_model=D,
        n_layers=LAYERS,
        n_heads=HEADS,
        d_ff=FF,
        max_len=SEQ,
        bias=True,
    )
    train = train_config(objective, PretrainParams(seq_len=SEQ), ObjectivesParams(), 0)
    module = PretrainModule(cfg.to_dict(), train.__dict__)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=True)

    def step(batch: dict[str, torch.Tensor]) -> float:
        loss, _, _ = module.loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def reference(objective: str):
    import transformers as tf

    if objective == "mlm":
        model = tf.BertForMaskedLM(
            tf.BertConfig(
                vocab_size=V,
                hidden_size=D,
                num_hidden_layers=LAYERS,
                num_attention_heads=HEADS,
                intermediate_size=FF,
                max_position_embeddings=SEQ,
            )
        )
    elif objective == "clm":
        model = tf.GPT2LMHeadModel(
            tf.GPT2Config(vocab_size=V, n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=FF, n_positions=SEQ)
        )
    else:
        model = tf.T5ForConditionalGeneration(
            tf.T5Config(
                vocab_size=V,
                d_model=D,
                d_ff=FF,
                num_layers=LAYERS,
                num_decoder_layers=LAYERS,
                num_heads=HEADS,
                d_kv=D // HEADS,
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


def peak_memory_mb(kind: str, objective: str, queue: multiprocessing.Queue) -> None:
    """Peak resident memory added by building the model and taking three training steps."""
    before = _status_mb("VmRSS")  # VmHWM, unlike ru_maxrss, starts afresh in a new process image
    step = (ours if kind == "ours" else reference)(objective)
    batch = batch_for(objective)
    for _ in range(3):
        step(batch)
    queue.put(_status_mb("VmHWM") - before)


def measure_memory(kind: str, objective: str) -> float:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=peak_memory_mb, args=(kind, objective, queue))
    process.start()
    value = queue.get(timeout=600)
    process.join()
    return round(value, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--objectives", nargs="+", default=["mlm", "clm", "span"])
    args = parser.parse_args()
    torch.manual_seed(0)
    for objective in args.objectives:
        batch = batch_for(objective)
        tokens = batch["input_ids"].numel()
        steps = {"ours": ours(objective), "ref": reference(objective)}
        times: dict[str, list[float]] = {"ours": [], "ref": []}
        for i in range(args.warmup + args.steps):
            for name, step in steps.items():
                start = time.perf_counter()
                step(batch)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - start)
        ours_tps = tokens / statistics.median(times["ours"])
        ref_tps = tokens / statistics.median(times["ref"])
        print(
            json.dumps(
                {
                    "objective": objective,
                    "ours_tokens_per_s": round(ours_tps),
                    "ref_tokens_per_s": round(ref_tps),
                    "ratio": round(ours_tps / ref_tps, 2),
                    "threads": torch.get_num_threads(),
                    "ours_peak_mb": measure_memory("ours", objective),
                    "ref_peak_mb": measure_memory("ref", objective),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
