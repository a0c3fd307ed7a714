"""Training FLOPs of a pretraining step, counted and estimated, and the GPU peaks MFU is taken against.

Counted: torch's FlopCounterMode over one micro-batch's forward and backward, run on the meta device
(tensors with shapes and no data), so it costs nothing and needs no corpus. Estimated: Kaplan et al.
(2020)'s 6·N·D, with N the matmul parameters each token passes through, plus attention as Chinchilla
counts it (QKᵀ and AV over the full T×T: the kernels compute the masked half too) and the tied LM
head on the positions that get a prediction (with ALBERT's factorized embeddings, its projections).
Shared layers (ALBERT) cost what unshared ones do. Both count matmuls only, so they agree to the FLOP.
"""

from __future__ import annotations

import json

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from models import implementations
from models.architectures.base import architecture
from models.config import ModelConfig
from models.pretraining import PretrainModule, TrainConfig
from models.specs.architectures import ARCHITECTURES
from models.specs.objectives import OBJECTIVES, ObjectiveSpec
from models.specs.objectives.base import ObjectiveParams
from models.stack_flops import (
    lm_head_weights,
    relative_attention_flops,
    sinusoid_projection_flops,
    stack_forward_flops,
)

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' datasheets, by a part of
# torch.cuda.get_device_name(); the longest matching key wins ("A100" before "A10").
PEAK_BF16_FLOPS: dict[str, float] = {
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM; "NVIDIA H100 80GB HBM3"
    "H200": 989e12,
    "A100": 312e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def peak_flops(device_name: str) -> float | None:
    """The bf16 peak of a GPU by its name, or None for a device the table does not know."""
    matches = [key for key in PEAK_BF16_FLOPS if key in device_name]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None


def components(train: TrainConfig) -> list[tuple[float, ObjectiveSpec, ObjectiveParams]]:
    """(share, objective, params) of what makes the batches: the objective, or a mixture's parts."""
    return OBJECTIVES[train.objective].components(train.objective_params)


def lengths(train: TrainConfig, objective: ObjectiveSpec, params: ObjectiveParams) -> tuple[int, int, float]:
    """(encoder tokens, decoder tokens, predicted tokens) per row: the objective's pair widths as the
    architecture reads them."""
    return ARCHITECTURES[train.arch].tokens(objective.kind, *objective.widths(train.seq_len, params))


def example_batch(train: TrainConfig, objective: ObjectiveSpec, params: ObjectiveParams) -> dict[str, Tensor]:
    """A batch of the pair's shapes as the architecture has it, on the meta device (with a pair
    format's labels, for its head)."""
    widths = objective.widths(train.seq_len, params)
    batch = architecture(train.arch).example_batch(train.batch_size, objective.kind, *widths)
    batch |= implementations.objective(objective.name).example_extras(batch, params)
    if train.pair_loss() != "none":
        batch["pair_labels"] = torch.zeros(train.batch_size, dtype=torch.long, device="meta")
    return batch


def count_step_flops(model: ModelConfig, train: TrainConfig) -> int:
    """FLOPs of one micro-batch's forward and backward pass, as FlopCounterMode counts them (a
    mixture's: each component's by its share). Shapes alone set them, so each pair is counted once
    per process: planning an equal-FLOPs sweep asks for its ★ row's at every point, and points that
    differ in their schedule alone share one count."""
    shaping = {k: v for k, v in train.hparams().items() if k not in SCHEDULE_FIELDS}
    key = (model, json.dumps(shaping, sort_keys=True, default=str))
    if key not in _COUNTED:
        _COUNTED[key] = _count_step_flops(model, train)
    return _COUNTED[key]


_COUNTED: dict[tuple[ModelConfig, str], int] = {}
# TrainConfig's fields that set the optimizer, the schedule and the run's length: never a tensor's shape
SCHEDULE_FIELDS = frozenset(
    {
        "seed",
        "max_steps",
        "accumulate",
        "lr",
        "warmup_steps",
        "schedule",
        "min_lr_ratio",
        "weight_decay",
        "beta1",
        "beta2",
        "sampling",
        "val_batches",
        "short_seq_prob",
    }
)


def _count_step_flops(model: ModelConfig, train: TrainConfig) -> int:
    with torch.device("meta"):
        module = PretrainModule(model, train)
    return module_step_flops(module, train)


def module_step_flops(module: PretrainModule, train: TrainConfig) -> int:
    """FLOPs of one micro-batch's forward and backward through `module`, built on the meta device (a
    pretraining's, a student's with its teacher), as FlopCounterMode counts them."""
    model = module.model_cfg
    total = 0.0
    for share, objective, params in components(train):
        batch = example_batch(train, objective, params)
        if model.mem_len:  # Transformer-XL's steady state: a full memory before every segment
            memory = torch.zeros(train.batch_size, model.mem_len, model.d_model, device="meta")
            module.memory, batch["stream"] = {0: [memory] * model.n_layers}, (0, True)
        counter = FlopCounterMode(display=False)
        with counter:
            loss, _, _ = module.training_loss(batch)
            loss.backward()
        total += share * counter.get_total_flops()
    return round(total)


def estimate_step_flops(model: ModelConfig, train: TrainConfig) -> int:
    """6·N·D + attention + LM head for one micro-batch (forward 2 FLOPs a multiply-add, backward 2x):
    each stack over its own tokens, and a decoder's cross-attention to the encoder's; an objective's
    own head in place of the LM head (a mixture's: each component's by its share)."""
    total = sum(share * _estimate(model, train, o, p) for share, o, p in components(train))
    return round(total)


def _estimate(
    model: ModelConfig, train: TrainConfig, objective: ObjectiveSpec, params: ObjectiveParams
) -> int:
    b, (t, u, predicted) = train.batch_size, lengths(train, objective, params)
    d = model.d_model
    forward = 0
    constant_inputs = 0  # forward FLOPs whose inputs need no gradient: backward costs them once
    embedded = t + u
    own = ARCHITECTURES[model.arch].stack_flops(model, b, embedded)
    if own is not None:  # its own stacks (an LSTM's, CBOW's window): not transformer stacks
        forward, constant_inputs = own
        t = u = 0
    if t:  # the encoder
        forward += stack_forward_flops(b, t, model.n_layers, d, model.d_ff, model.mlp)
    if u:  # the decoder (a decoder-only model's layers are n_layers)
        layers = model.decoder_layers
        forward += stack_forward_flops(b, u, layers, d, model.d_ff, model.mlp)
        if t:  # cross-attention: q and out on the decoder's tokens, keys and values of the memory
            forward += 2 * b * u * layers * 2 * d * d + 2 * b * t * layers * 2 * d * d
            forward += layers * 4 * b * u * t * d
    if model.positions == "xl":  # Transformer-XL's relative attention over the stack's memory
        # XLNet's bidirectional data: the distances' encodings made for both signs
        signs = 2 if objective.reversed_rows(params, b) else 1
        for tokens, layers, causal in ((t, model.n_layers, False), (u, model.decoder_layers, True)):
            if tokens:
                forward += relative_attention_flops(b, tokens, model.mem_len, layers, d, causal, signs)
                constant_inputs += sinusoid_projection_flops(tokens, model.mem_len, layers, d, causal, signs)
    e = model.embedding_size
    if e:  # ALBERT's projection of each embedded token to d_model, and back in the LM head
        forward += 2 * b * embedded * e * d
    head = implementations.objective(objective.name).head_flops(model, b, train.seq_len, params)
    if head is None:  # the tied LM head on the predicted tokens
        head = (
            2 * round(predicted * b) * lm_head_weights(d, e, model.vocab_size, model.lm_head == "transform")
        )
    forward += head
    if train.pair_loss() != "none":  # BERT's pooler and the two-way classifier on each [CLS]
        forward += 2 * b * d * d + 2 * b * d * 2
    return 3 * forward - constant_inputs
