"""Fine-tuning a sequence head on a GLUE-style task: BERT's recipe as a seeded PyTorch loop.

Examples arrive encoded (`[CLS] a [SEP] b [SEP]` ids, see `finetune_data`); batches are padded to
their longest row. The order of every epoch is a permutation fixed by (seed, epoch) and dropout draws
from a stream fixed by (seed, step), so the same seed gives the same model, bit for bit on the CPU.

A plain loop rather than a Lightning Trainer: a GLUE fine-tune is one device and a few hundred steps,
and importing Lightning costs a process about 6 s, more than a whole fine-tune of the offline profile
(the pipeline starts one process per model, task and initialisation).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from models.finetune_data import pad_batch
from models.heads import SequenceHead
from models.training import derived_seed, read_losses
from models.transformer import weight_decay_groups

DROPOUT_STREAM = 2**42
READ_LOSSES_EVERY = 50  # steps between the host's reads of the losses: the device runs ahead meanwhile
Precision = Literal["32-true", "bf16-mixed"]


@dataclass(frozen=True)
class FinetuneConfig:
    """One seed's fine-tuning recipe, without defaults: `lmpipe.finetuning.finetune_config` builds it
    from params.yaml (lmpipe/params/finetune.py)."""

    seed: int
    lr: float
    epochs: int
    batch_size: int
    warmup_ratio: float
    weight_decay: float
    grad_clip: float
    precision: Precision
    group_by_length: bool

    def total_steps(self, n_examples: int) -> int:
        return math.ceil(n_examples / self.batch_size) * self.epochs


def warmup_linear(step: int, warmup: int, total: int) -> float:
    """BERT's fine-tuning schedule: linear warmup to the peak, then linear decay to zero."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def epoch_batches(
    lengths: np.ndarray, seed: int, epoch: int, batch_size: int, group_by_length: bool
) -> list[np.ndarray]:
    """The batches (example indices) of one epoch, a function of (seed, epoch). With `group_by_length`,
    as HF's LengthGroupedSampler: shuffled, cut into mega-batches of 50 batches, each sorted by length
    so that a batch pads little; then the batches themselves are shuffled."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    if group_by_length:
        mega = 50 * batch_size
        order = np.concatenate(
            [
                chunk[np.argsort(-lengths[chunk], kind="stable")]
                for chunk in np.split(order, range(mega, len(order), mega))
            ]
        )
    batches = np.split(order, range(batch_size, len(order), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))] if group_by_length else batches


def padded_batches(
    ids: list[list[int]], labels: np.ndarray | None, batches: list[np.ndarray], device: torch.device
) -> Iterator[dict[str, Tensor]]:
    """Padded tensors of the given batches; `labels` float for regression, class ids otherwise."""
    pinned = device.type == "cuda"  # page-locked host memory: the copies run while the GPU computes

    def to_device(tensor: Tensor) -> Tensor:
        return tensor.pin_memory().to(device, non_blocking=True) if pinned else tensor.to(device)

    for rows in batches:
        input_ids, pad_mask = pad_batch([ids[r] for r in rows])
        batch = {"input_ids": to_device(input_ids), "pad_mask": to_device(pad_mask)}
        if labels is not None:
            batch["labels"] = to_device(torch.as_tensor(labels[rows]))
        yield batch


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def finetune(
    head: SequenceHead, ids: list[list[int]], labels: np.ndarray, cfg: FinetuneConfig
) -> list[float]:
    """Train `head` in place: AdamW (no decay on norms, biases, embeddings), warmup then linear decay,
    gradient clipping. Returns the loss of every step (with `head.lm_loss_weight`, the task's loss plus
    the weighted LM loss: what the step minimised).

    No step reads a tensor on the host: the losses stay on the device and are read together every
    READ_LOSSES_EVERY steps and at the end, where the first non-finite one stops the run with its step."""
    if len(ids) != len(labels) or not ids:
        raise ValueError(f"{len(ids)} encoded examples for {len(labels)} labels")
    device = next(head.parameters()).device
    total = cfg.total_steps(len(ids))
    optimizer = torch.optim.AdamW(weight_decay_groups(head, cfg.weight_decay), lr=cfg.lr, foreach=True)
    warmup = round(cfg.warmup_ratio * total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_linear(s, warmup, total))
    lengths = np.array([len(row) for row in ids])
    head.train()
    losses: list[float] = []
    pending: list[Tensor] = []  # the losses of the steps since the last read, on the device
    step = 0
    for epoch in range(cfg.epochs):
        order = epoch_batches(lengths, cfg.seed, epoch, cfg.batch_size, cfg.group_by_length)
        for batch in padded_batches(ids, labels, order, device):
            torch.manual_seed(derived_seed(cfg.seed, DROPOUT_STREAM, step))
            with autocast(cfg.precision, device):
                output, lm_loss = head.forward_and_lm_loss(batch["input_ids"], batch["pad_mask"])
            loss = head.loss(output.float(), batch["labels"])
            if lm_loss is not None:  # GPT-1: L2 + λ·L1
                loss = loss + head.lm_loss_weight * lm_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            pending.append(loss.detach())
            step += 1
            if len(pending) == READ_LOSSES_EVERY:
                losses += read_losses(pending, range(len(losses), step))
                pending.clear()
    return losses + read_losses(pending, range(len(losses), step))


@torch.no_grad()
def predict(
    head: SequenceHead, ids: list[list[int]], labels: np.ndarray, batch_size: int, precision: Precision
) -> tuple[np.ndarray, float]:
    """Class ids (or scores, for regression) in the order of `ids`, and the mean loss against `labels`."""
    device = next(head.parameters()).device
    head.eval()
    order = np.argsort([-len(row) for row in ids], kind="stable")  # little padding; order restored below
    outputs = []
    for batch in padded_batches(
        ids, labels, np.split(order, range(batch_size, len(order), batch_size)), device
    ):
        with autocast(precision, device):
            outputs.append(head(batch["input_ids"], batch["pad_mask"]).float())
    output = torch.cat(outputs)
    loss = float(head.loss(output, torch.as_tensor(labels[order]).to(device)))
    ranked = (output if head.num_labels == 1 else output.argmax(-1)).cpu().numpy()
    predictions = np.empty_like(ranked)
    predictions[order] = ranked
    return predictions, loss
