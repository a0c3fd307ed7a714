"""ELECTRA trained side by side with transformers' own: our model and `ElectraForPreTraining` with an
`ElectraForMaskedLM` generator (models/hf_reference.py) from the same initial weights, on the same
rows, masks and sampling uniforms, with the same optimizer and schedule; every `--every` steps the
discriminator's ROC AUC, the mean cosine between positions' states, its detection loss and the
generator's masked-LM accuracy on fixed validation batches, one CSV row per model and step.

    python -m docs.results.electra_side_by_side --tokens data/tokens --steps 1000 --out electra.csv \
        --set '{"lr": 5e-4, "warmup": 1000}'

`--tokens` is a pack stage's output (meta.json, train.bin, val.bin). The reference needs ELECTRA's
form (post-LN, learned positions, ELECTRA's generator head); `--no-reference` trains ours alone, in
any form (`norm_position: pre`, `positions: rope`, say). The research log (docs/results/) says which
runs were made."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models.config import PRESETS, ModelConfig
from models.objectives.base import batch_generator
from models.objectives.electra import collapse_measures, replace_tokens
from models.pretraining import PretrainModule, lr_factor, make_batch
from models.transformer import weight_decay_groups


@dataclass(frozen=True)
class Recipe:
    """What a side-by-side run varies (the `real-cpu` profile's values by default)."""

    preset: str = "tiny"
    norm_position: str = "post"
    positions: str = "learned"
    embedding_size: int | None = None
    dropout: float = 0.0
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 1e-3
    warmup: int = 200
    schedule: str = "cosine"
    schedule_steps: int | None = None  # the schedule's length: a longer run's, cut short (None: --steps)
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    generator_width: float = 0.25
    generator_head: str = "transform"
    discriminator_weight: float = 50.0
    mask_rate: float = 0.15
    detector_bias: float = 0.0  # the detection logit's initial bias (0: ELECTRA's; the prior's log-odds)
    # ours alone: from this step the generator's own layers stop training and its loss leaves the sum,
    # so the discriminator learns against fixed samples (the shared embeddings still train)
    freeze_generator_at: int | None = None
    seed: int = 1


def rows_of(tokens: np.ndarray, count: int, length: int, seed: int, step: int) -> torch.Tensor:
    """`count` windows of the packed tokens, drawn by the step's stream."""
    starts = torch.randint(0, len(tokens) - length, (count,), generator=batch_generator(seed, step)).numpy()
    return torch.from_numpy(np.stack([tokens[s : s + length] for s in starts]).astype(np.int64))


class Ours:
    """Our ELECTRA model: its own step (`PretrainModule.terms`) and measures."""

    def __init__(self, module: PretrainModule) -> None:
        self.module = module
        self.generator_frozen = False

    def freeze_generator(self) -> None:
        self.module.objective_head.generator.requires_grad_(False)
        self.generator_frozen = True

    def modules(self) -> torch.nn.Module:
        return torch.nn.ModuleList([self.module.model, self.module.objective_head])

    def train(self, mode: bool) -> None:
        self.module.train(mode)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        terms = self.module.terms(batch)
        if self.generator_frozen:
            detection, weight = terms.extra["replaced"]
            return weight * detection
        return terms.total()

    def measures(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        terms = self.module.terms(batch)
        return {
            "detection_loss": float(terms.extra["replaced"][0]),
            "generator_accuracy": float(terms.correct) / terms.count,
            "auc": float(terms.rates["replaced_auc"]),
            "cosine": float(terms.rates["state_cosine"]),
        }


class Reference:
    """transformers' ELECTRA holding the same initial weights: the generator's masked-LM loss plus λ ×
    the discriminator's, the discriminator reading the generator's samples drawn with the batch's
    uniforms, as ours."""

    def __init__(self, module: PretrainModule, weight: float) -> None:
        from models.hf_reference import electra_pair

        self.discriminator, self.generator = electra_pair(module, share=True)
        # ours has no segments: the one all-zero type stays zero, not a learned bias on every token
        self.discriminator.electra.embeddings.token_type_embeddings.weight.requires_grad_(False)
        self.weight = weight

    def modules(self) -> torch.nn.Module:
        return torch.nn.ModuleList([self.discriminator, self.generator])  # the embeddings once

    def train(self, mode: bool) -> None:
        self.discriminator.train(mode), self.generator.train(mode)

    def _forward(self, batch: dict[str, torch.Tensor]):
        ids, positions, labels = batch["input_ids"], batch["positions"], batch["labels"]
        # ElectraForMaskedLM's own modules, its head applied at the masked positions only (the class
        # applies it everywhere and ignores the rest: the same values, at V / 7 the cost)
        states = self.generator.electra(input_ids=ids).last_hidden_state
        picked = states.reshape(-1, states.shape[-1])[positions]
        logits = self.generator.generator_lm_head(self.generator.generator_predictions(picked))
        generator_loss = F.cross_entropy(logits, labels)
        fake, replaced = replace_tokens(ids, positions, labels, logits, batch["sample_uniforms"])
        detected = self.discriminator(input_ids=fake, labels=replaced.view_as(ids), output_hidden_states=True)
        return generator_loss, logits, labels, replaced, detected

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        generator_loss, _, _, _, detected = self._forward(batch)
        return generator_loss + self.weight * detected.loss

    def measures(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        _, logits, labels, replaced, detected = self._forward(batch)
        collapse = collapse_measures(detected.logits.reshape(-1), replaced, detected.hidden_states[-1], None)
        return {
            "detection_loss": float(detected.loss),
            "generator_accuracy": float((logits.argmax(-1) == labels).float().mean()),
            "auc": float(collapse["replaced_auc"]),
            "cosine": float(collapse["state_cosine"]),
        }


def run(
    recipe: Recipe, tokens_dir: Path, steps: int, every: int, reference: bool, out: Path
) -> dict[str, Ours | Reference]:
    """Trains the models side by side, writing their measures to `out`; returns them by name."""
    meta = json.loads((tokens_dir / "meta.json").read_text())
    train_tokens = np.memmap(tokens_dir / "train.bin", dtype=meta["dtype"], mode="r")
    val_tokens = np.memmap(tokens_dir / "val.bin", dtype=meta["dtype"], mode="r")
    objectives = objectives_params(
        {
            "electra": {
                "mask_rate": recipe.mask_rate,
                "generator_width": recipe.generator_width,
                "generator_head": recipe.generator_head,
                "discriminator_weight": recipe.discriminator_weight,
            }
        }
    )
    params = PretrainParams(
        seq_len=recipe.seq_len,
        batch_size=recipe.batch_size,
        max_steps=recipe.schedule_steps or steps,
        warmup_steps=recipe.warmup,
        schedule=recipe.schedule,
    )
    train = train_config("encoder", "electra", params, objectives, recipe.seed)
    cfg = ModelConfig(
        arch="encoder",
        vocab_size=meta["vocab_size"],
        **(PRESETS[recipe.preset] | {"max_len": recipe.seq_len}),
        norm_position=recipe.norm_position,
        positions=recipe.positions,
        embedding_size=recipe.embedding_size,
        dropout=recipe.dropout,
        norm_eps=1e-12 if recipe.norm_position == "post" else 1e-5,
    )
    torch.manual_seed(recipe.seed)
    module = PretrainModule(cfg, train)
    with torch.no_grad():
        module.objective_head.detector[-1].bias.fill_(recipe.detector_bias)
    models = {"ours": Ours(module)}
    if reference and recipe.freeze_generator_at is not None:
        raise ValueError("freeze_generator_at trains ours alone: add --no-reference")
    if reference:
        models["transformers"] = Reference(module, recipe.discriminator_weight)
    val = [
        make_batch(
            rows_of(val_tokens, recipe.batch_size, recipe.seq_len, 7, i),
            train,
            batch_generator(7, i),
            cfg.vocab_size,
        )
        for i in range(4)
    ]
    optimizers = {}
    for name, model in models.items():
        groups = weight_decay_groups(model.modules(), recipe.weight_decay)
        optimizers[name] = torch.optim.AdamW(groups, lr=recipe.lr, betas=(0.9, recipe.beta2), eps=recipe.eps)
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(
            handle,
            ["model", "step", "seconds", "loss", "detection_loss", "generator_accuracy", "auc", "cosine"]
            + [f.name for f in fields(Recipe)],
        )
        writer.writeheader()
        clock = {name: 0.0 for name in models}
        last = {name: float("nan") for name in models}
        for step in range(steps + 1):
            if step % every == 0:
                for name, model in models.items():
                    model.train(False)
                    with torch.no_grad():
                        measured = {
                            k: float(np.mean([m[k] for m in map(model.measures, val)]))
                            for k in ("detection_loss", "generator_accuracy", "auc", "cosine")
                        }
                    model.train(True)
                    row = {"model": name, "step": step, "seconds": round(clock[name], 1), "loss": last[name]}
                    writer.writerow(row | measured | asdict(recipe))
                    print(json.dumps(row | measured), flush=True)
                handle.flush()
            if step == steps:
                return models
            if step == recipe.freeze_generator_at:
                models["ours"].freeze_generator()
            generator = batch_generator(recipe.seed, step)
            batch = make_batch(
                rows_of(train_tokens, recipe.batch_size, recipe.seq_len, recipe.seed, step),
                train,
                generator,
                cfg.vocab_size,
            )
            for name, model in models.items():
                started = time.perf_counter()
                optimizer = optimizers[name]
                for group in optimizer.param_groups:
                    group["lr"] = recipe.lr * lr_factor(step, train)
                torch.manual_seed(recipe.seed * 100_003 + step)  # the same dropout stream in both
                loss = model.loss(batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(
                    [p for g in optimizer.param_groups for p in g["params"]], recipe.grad_clip
                )
                optimizer.step()
                last[name] = float(loss.detach())
                clock[name] += time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--set", default="{}", help="Recipe fields as JSON")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        recipe = Recipe(**json.loads(args.set))
    except (TypeError, json.JSONDecodeError) as error:
        print(f"--set: {error}", file=sys.stderr)
        return 2
    try:
        run(recipe, args.tokens, args.steps, args.every, not args.no_reference, args.out)
    except (ValueError, FileNotFoundError) as error:  # a recipe params.yaml's schema refuses, no tokens
        reason = error.errors()[0]["msg"] if hasattr(error, "errors") else str(error).splitlines()[0]
        print(f"electra_side_by_side: {reason}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
