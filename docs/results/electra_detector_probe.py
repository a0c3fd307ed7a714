"""ELECTRA's discriminator alone against a fixed unigram sampler (the regime a generator reaches once
its samples follow the corpus's frequencies): 15 % of each row's tokens replaced by unigram samples,
the model and ELECTRA's detection head trained on them (AdamW, β₂ 0.98, decay 0.01, 200 warm-up
steps, clip 1.0, 32 × 128 a step); every 100 steps the ROC AUC and the mean cosine between positions'
states on four fixed validation batches, one JSON line each. The research log (2026-12) says what it
found.

    python -m docs.results.electra_detector_probe --tokens data/tokens --steps 1000 --lr 1e-3 \
        --set '{"positions": "rope"}'"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.config import PRESETS, ModelConfig
from models.objectives.base import batch_generator
from models.objectives.electra import collapse_measures, detector_head
from models.transformer import Transformer, weight_decay_groups

BATCH, LENGTH = 32, 128


def replaced_rows(tokens: np.ndarray, unigram: torch.Tensor, seed: int, step: int):
    """The step's rows with 15 % of their tokens unigram samples, and where a token differs."""
    generator = batch_generator(seed, step)
    starts = torch.randint(0, len(tokens) - LENGTH, (BATCH,), generator=generator).numpy()
    rows = torch.from_numpy(np.stack([tokens[s : s + LENGTH] for s in starts]).astype(np.int64))
    selected = torch.rand(rows.shape, generator=generator) < 0.15
    fake = rows.clone()
    fake[selected] = torch.multinomial(unigram, int(selected.sum()), replacement=True, generator=generator)
    return fake, (fake != rows).float().reshape(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--set", default="{}", help="ModelConfig fields as JSON (post-LN unless set)")
    args = parser.parse_args()
    meta = json.loads((args.tokens / "meta.json").read_text())
    train = np.memmap(args.tokens / "train.bin", dtype=meta["dtype"], mode="r")
    val = np.memmap(args.tokens / "val.bin", dtype=meta["dtype"], mode="r")
    counts = np.bincount(np.asarray(train[:2_000_000]).astype(np.int64), minlength=meta["vocab_size"])
    unigram = torch.from_numpy(counts / counts.sum()).float()
    fields = {"norm_position": "post", "norm_eps": 1e-12} | json.loads(args.set)
    cfg = ModelConfig(
        arch="encoder", vocab_size=meta["vocab_size"], **(PRESETS[args.preset] | {"max_len": LENGTH} | fields)
    )
    torch.manual_seed(1)
    model, head = Transformer(cfg), detector_head(cfg.d_model, cfg.init_std)
    modules = torch.nn.ModuleList([model, head])
    optimizer = torch.optim.AdamW(weight_decay_groups(modules, 0.01), lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    checks = [replaced_rows(val, unigram, 7, i) for i in range(4)]
    for step in range(args.steps + 1):
        if step % 100 == 0:
            modules.eval()
            with torch.no_grad():
                measured = []
                for fake, replaced in checks:
                    states = model(fake)
                    measured.append(collapse_measures(head(states).reshape(-1), replaced, states, None))
            modules.train()
            auc = np.mean([float(m["replaced_auc"]) for m in measured])
            cosine = np.mean([float(m["state_cosine"]) for m in measured])
            line = {"step": step, "auc": round(float(auc), 3), "cosine": round(float(cosine), 3)}
            print(json.dumps(line), flush=True)
        if step == args.steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 200)
        fake, replaced = replaced_rows(train, unigram, 1, step)
        loss = F.binary_cross_entropy_with_logits(head(model(fake)).reshape(-1), replaced)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(modules.parameters(), 1.0)
        optimizer.step()


if __name__ == "__main__":
    main()
