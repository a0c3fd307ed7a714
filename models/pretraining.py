"""Lightning module and data for pretraining: a batch is a pure function of the seed and its index
across processes, so a resumed run sees exactly the batches and masks it would have seen, whichever
DataLoader worker builds them, and DDP over W processes sees one process's W accumulated micro-batches."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from models import implementations
from models.architectures.base import architecture
from models.config import ModelConfig
from models.input_formats import Rows, SentenceIndex, format_rows
from models.objectives.base import Pieces, Terms, batch_generator
from models.pair import Pair, stacked_pairs
from models.specs.input_formats import PAIR_FORMATS, InputFormat
from models.specs.objectives import OBJECTIVES, ObjectiveParams
from models.training import derived_seed, read_losses
from models.transformer import Transformer, init_normal, weight_decay_groups

VAL_STEP_OFFSET = 2**40  # validation masks come from a stream no training step uses
DROPOUT_STREAM = 2**41
STATIC_STREAM = 2**43  # static masking's per-row streams


@dataclass(frozen=True)
class TrainConfig:
    """What shapes a pretraining run's trajectory. `lmpipe.pretraining.train_config` builds it from
    params.yaml (lmpipe/params/pretrain.py)."""

    arch: str  # the model's architecture: its feature converter makes the batches
    objective: str
    objective_params: ObjectiveParams  # params.yaml `objectives.<objective>`, as its declaration's class
    seed: int
    seq_len: int
    batch_size: int
    max_steps: int
    accumulate: int
    lr: float
    warmup_steps: int
    schedule: Literal["cosine", "linear", "constant"]
    min_lr_ratio: float
    weight_decay: float
    beta1: float
    beta2: float
    sampling: Literal["random", "epoch", "stream"]
    val_batches: int
    input_format: InputFormat = "full_sentences"  # RoBERTa's; all but full_sentences read the sentence index
    short_seq_prob: float = 0.0  # BERT's short segment pairs (models/input_formats.py)

    def pair_loss(self) -> str:
        """The loss on a pair format's [CLS] (`objectives.mlm.pair_loss`), or none."""
        if self.input_format not in PAIR_FORMATS:
            return "none"
        return getattr(self.objective_params, "pair_loss", "none")

    def row_length(self) -> int:
        """Tokens read per row: the inputs, plus the shifted target (CLM) or what span corruption removes."""
        return OBJECTIVES[self.objective].row_length(self.seq_len, self.objective_params)

    def backward_rows(self) -> int:
        """The last rows of a batch that read their text backward (XLNet's bidirectional data)."""
        return OBJECTIVES[self.objective].reversed_rows(self.objective_params, self.batch_size)

    def hparams(self) -> dict[str, Any]:
        """Its fields as plain values (the objective's params a mapping): the checkpoints' hyperparameters
        and the resume fingerprint."""
        return asdict(self)


def make_batch(
    rows: Tensor,
    cfg: TrainConfig,
    generator: torch.Generator,
    vocab_size: int,
    row_epochs: list[tuple[int, int]] | None = None,
    formatted: Rows | None = None,
    pieces: Pieces | None = None,
) -> dict[str, Tensor]:
    """The objective's pair of the rows, as the architecture's batch; a mixture's component drawn by
    its share from the batch's stream first, the rows cut to the length it reads. With static masking
    and each row's (row index, epoch) in `row_epochs`, a row's noise comes from its own stream, fixed
    by the row and the copy the epoch reads (epoch mod copies), whichever batch it lands in. `pieces`
    holds the tokenizer's piece tables (models/pieces.py) that the objectives read, by name."""
    parts = OBJECTIVES[cfg.objective].components(cfg.objective_params)
    _, objective, params = parts[0]
    if len(parts) > 1:
        shares = torch.tensor([share for share, _, _ in parts], dtype=torch.float64)
        _, objective, params = parts[int(torch.multinomial(shares, 1, generator=generator))]
    tables = objective.piece_tables(params)
    missing = [name for name in tables if pieces is None or name not in pieces]
    if missing:
        read = ", ".join(missing)
        raise ValueError(f"objective {objective.name} reads the tokenizer's {read}: not given")
    read_pieces = {name: pieces[name] for name in tables} if pieces is not None else {}
    rows = rows[:, : objective.row_length(cfg.seq_len, params)]
    implementation = implementations.objective(objective.name)

    def pair_of(rows: Tensor, generator: torch.Generator) -> Pair:
        return implementation.pair(rows, params, generator, vocab_size, read_pieces)

    if formatted is not None:  # an input format's rows: short ones padded, pairs with their labels
        pair = pair_of(rows, generator)
        pair.input_lengths = formatted.lengths  # aligned pairs: the padding is never noise (a special id)
        batch = architecture(cfg.arch).batch(pair)
        return batch if formatted.pair_labels is None else batch | {"pair_labels": formatted.pair_labels}
    copies = objective.static_copies(params)
    if copies is None or row_epochs is None:
        return architecture(cfg.arch).batch(pair_of(rows, generator))
    pairs = [
        pair_of(row[None], static_generator(cfg.seed, index, epoch % copies))
        for row, (index, epoch) in zip(rows, row_epochs, strict=True)
    ]
    return architecture(cfg.arch).batch(stacked_pairs(pairs))


def stream_segments(
    n_tokens: int,
    row_length: int,
    stride: int,
    batch_size: int,
    lanes: int,
    index: int,
    backward: int = 0,
) -> tuple[np.ndarray, tuple[int, bool]]:
    """Transformer-XL's ordered batches: the tokens cut into lanes × batch_size contiguous streams, lane
    l's rows being streams l·B to l·B + B - 1. Micro-batch `index` is lane index mod lanes, at position
    index // lanes: each row the next segment of its stream (`stride` tokens on from the last, a row's
    length read), back to the stream's start after its last whole segment; the last `backward` rows
    read theirs from its end towards its start (XLNet's bidirectional data: the objective reverses
    them). Returns the rows' first tokens, and (lane, whether the segment continues its lane's last
    one): what its memory needs."""
    span = n_tokens // (lanes * batch_size)
    if span < row_length:
        raise ValueError(
            f"{n_tokens} tokens make {lanes * batch_size} streams of {span}, each shorter than a row "
            f"({row_length})"
        )
    segment = (index // lanes) % ((span - row_length) // stride + 1)
    lane = index % lanes
    streams = np.arange(lane * batch_size, (lane + 1) * batch_size) * span
    forward = np.arange(batch_size) < batch_size - backward
    on = np.where(forward, segment * stride, span - row_length - segment * stride)
    return streams + on, (lane, segment != 0)


def static_generator(seed: int, row: int, copy: int) -> torch.Generator:
    """The noise stream of one row of the packed data in one of static masking's copies."""
    return torch.Generator().manual_seed(derived_seed(seed, STATIC_STREAM, row, copy))


def formatted_rows(index: SentenceIndex, cfg: TrainConfig, generator: torch.Generator) -> Rows:
    """A micro-batch's rows in the config's input format, from the sentence index."""
    fmt, loss = cfg.input_format, cfg.pair_loss()
    return format_rows(index, fmt, loss, cfg.batch_size, cfg.row_length(), generator, cfg.short_seq_prob)


class PackedBatches(IterableDataset):
    """Whole batches for micro-steps [start, stop) of one rank, read from a flat token file."""

    def __init__(
        self,
        path: Path,
        dtype: str,
        cfg: TrainConfig,
        vocab_size: int,
        start: int,
        stop: int,
        rank: int = 0,
        world_size: int = 1,
        pieces: Pieces | None = None,
    ) -> None:
        self.path, self.dtype, self.cfg, self.vocab_size = path, dtype, cfg, vocab_size
        self.pieces = pieces
        self.start, self.stop, self.rank, self.world_size = start, stop, rank, world_size
        self._epoch_order: tuple[int, np.ndarray] | None = None
        self._index: SentenceIndex | None = None

    def tokens(self) -> np.ndarray:
        return np.memmap(self.path, dtype=self.dtype, mode="r")

    def offsets(
        self, index: int, generator: torch.Generator, n_tokens: int
    ) -> tuple[np.ndarray, list[tuple[int, int]] | None]:
        """The rows' first tokens; with `epoch` sampling also each row's (row index, epoch)."""
        length, batch = self.cfg.row_length(), self.cfg.batch_size
        if self.cfg.sampling == "random":
            return torch.randint(0, n_tokens - length + 1, (batch,), generator=generator).numpy(), None
        n_rows = n_tokens // length
        first = index * batch
        rows = np.empty(batch, dtype=np.int64)
        epochs = []
        for j, index in enumerate(range(first, first + batch)):
            epoch = index // n_rows
            if self._epoch_order is None or self._epoch_order[0] != epoch:
                self._epoch_order = (epoch, np.random.default_rng([self.cfg.seed, epoch]).permutation(n_rows))
            rows[j] = self._epoch_order[1][index % n_rows]
            epochs.append(epoch)
        return rows * length, list(zip(rows.tolist(), epochs, strict=True))

    def batch(self, step: int) -> dict[str, Tensor]:
        """This rank's micro-batch of micro-step `step`."""
        tokens = self.tokens()
        index = step * self.world_size + self.rank  # across processes: see batch_generator
        generator = batch_generator(self.cfg.seed, index)
        length = self.cfg.row_length()
        if self.cfg.input_format != "full_sentences":
            if self._index is None:  # opened in the process that reads it (a DataLoader worker)
                self._index = SentenceIndex(tokens, self.path.parent, self.path.stem)
            rows = formatted_rows(self._index, self.cfg, generator)
            return make_batch(
                rows.tokens, self.cfg, generator, self.vocab_size, formatted=rows, pieces=self.pieces
            )
        if self.cfg.sampling == "stream":  # lanes: the micro-batches of one step, on every process
            lanes = self.cfg.accumulate * self.world_size
            cfg = self.cfg
            starts, stream = stream_segments(
                len(tokens), length, cfg.seq_len, cfg.batch_size, lanes, index, cfg.backward_rows()
            )
            rows = torch.from_numpy(np.stack([tokens[s : s + length] for s in starts]).astype(np.int64))
            batch = make_batch(rows, self.cfg, generator, self.vocab_size, pieces=self.pieces)
            return batch | {"stream": stream}
        starts, row_epochs = self.offsets(index, generator, len(tokens))
        rows = torch.from_numpy(np.stack([tokens[s : s + length] for s in starts]).astype(np.int64))
        return make_batch(rows, self.cfg, generator, self.vocab_size, row_epochs, pieces=self.pieces)

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info else (0, 1)
        # DataLoader takes items from its workers in turn, so the global order stays start, start+1, ...
        for step in range(self.start + worker, self.stop, n_workers):
            yield self.batch(step)


def validation_batches(
    path: Path, dtype: str, cfg: TrainConfig, vocab_size: int, pieces: Pieces | None = None, lanes: int = 1
) -> list[dict[str, Tensor]]:
    """The validation batches, the same at every validation. With stream sampling, batch i is lane
    i mod `lanes`'s next segment (lanes: accumulate × processes, as in training): a process validates
    every lanes-th batch (Lightning's distributed sampler), so each follows its own lanes' streams."""
    tokens = np.memmap(path, dtype=dtype, mode="r")
    length = cfg.row_length()
    n_rows = len(tokens) // length
    if n_rows == 0:
        raise ValueError(f"{path}: {len(tokens)} tokens, fewer than one row of {length}")
    batches = []
    sentences = (
        SentenceIndex(tokens, path.parent, path.stem) if cfg.input_format != "full_sentences" else None
    )
    for i in range(cfg.val_batches):
        generator = batch_generator(cfg.seed, VAL_STEP_OFFSET + i)
        if sentences is not None:
            rows = formatted_rows(sentences, cfg, generator)
            batches.append(make_batch(rows.tokens, cfg, generator, vocab_size, formatted=rows, pieces=pieces))
            continue
        if cfg.sampling == "stream":  # consecutive segments of B streams: a memory carries across them
            starts, stream = stream_segments(
                len(tokens), length, cfg.seq_len, cfg.batch_size, lanes, i, cfg.backward_rows()
            )
            rows = torch.from_numpy(np.stack([tokens[s : s + length] for s in starts]).astype(np.int64))
            batches.append(make_batch(rows, cfg, generator, vocab_size, pieces=pieces) | {"stream": stream})
            continue
        index = [(i * cfg.batch_size + j) % n_rows for j in range(cfg.batch_size)]
        rows = torch.from_numpy(
            np.stack([tokens[r * length : (r + 1) * length] for r in index]).astype(np.int64)
        )
        batches.append(make_batch(rows, cfg, generator, vocab_size, pieces=pieces))
    return batches


class TokenDataModule(L.LightningDataModule):
    """The packed tokens as batches: built by `num_workers` processes ahead of the step (0: in the
    training process), in pinned memory when `pin_memory`, so that the copy to a GPU does not block."""

    def __init__(
        self,
        tokens_dir: Path,
        cfg: TrainConfig,
        vocab_size: int,
        dtype: str,
        num_workers: int = 0,
        pin_memory: bool = False,
        pieces: Pieces | None = None,
    ) -> None:
        super().__init__()
        self.tokens_dir, self.cfg, self.vocab_size, self.dtype = tokens_dir, cfg, vocab_size, dtype
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.pieces = pieces  # the tokenizer's piece tables that the objective reads

    def train_dataloader(self) -> DataLoader:
        # called after a checkpoint is restored: start where the restored run stopped
        start = self.trainer.global_step * self.cfg.accumulate
        stop = self.cfg.max_steps * self.cfg.accumulate
        data = PackedBatches(
            self.tokens_dir / "train.bin",
            self.dtype,
            self.cfg,
            self.vocab_size,
            start,
            stop,
            self.trainer.global_rank,
            self.trainer.world_size,
            self.pieces,
        )
        return DataLoader(
            data,
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            prefetch_factor=4 if self.num_workers else None,  # batches ready ahead, per worker
        )

    def val_dataloader(self) -> DataLoader:
        lanes = self.cfg.accumulate * self.trainer.world_size
        batches = validation_batches(
            self.tokens_dir / "val.bin", self.dtype, self.cfg, self.vocab_size, self.pieces, lanes
        )
        return DataLoader(batches, batch_size=None)


class StepCheckpoint(ModelCheckpoint):
    """A checkpoint every `every_n_train_steps`; at a step that the trainer validates after, written
    once that validation has run. Lightning writes step checkpoints at the end of the batch, before it
    validates, and a run resumed from one skips that step's validation: its curve would lack the point."""

    def __init__(self, *, val_every: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.val_every = val_every

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # a resumed run starts at the step of its checkpoint: not one to write again (Lightning would,
        # at the end of the first micro-batch of an accumulated step, mid-way through that step)
        self._last_global_step_saved = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        due = step % self._every_n_train_steps == 0 and not self._should_skip_saving_checkpoint(trainer)
        if due and step % self.val_every == 0:
            self._defer_save_until_validation = True  # on_validation_end writes it (and last.ckpt)
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine or linear decay to `min_lr_ratio` at `max_steps`."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay


def token_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy in fp32 and the number of correct predictions. Compiled with the model: then the
    fp32 copy of the logits ([B·T, vocab] for a decoder) is never written to memory."""
    return F.cross_entropy(logits.float(), labels), (logits.argmax(-1) == labels).sum()


def pair_head(cfg: ModelConfig) -> torch.nn.Module:
    """BERT's pooler (a dense layer and tanh on the [CLS] state) and a two-way classifier."""
    head = torch.nn.Sequential(
        torch.nn.Linear(cfg.d_model, cfg.d_model), torch.nn.Tanh(), torch.nn.Linear(cfg.d_model, 2)
    )
    return head.apply(lambda module: init_normal(module, cfg.init_std))


class PretrainModule(L.LightningModule):
    def __init__(self, model: ModelConfig, train: TrainConfig, compile: bool = False) -> None:
        super().__init__()
        # plain values in the checkpoints (they load with torch's weights_only)
        self.save_hyperparameters({"model": model.to_dict(), "train": train.hparams(), "compile": compile})
        self.model_cfg, self.cfg = model, train
        self.model = Transformer(self.model_cfg)
        # BERT's pooler and next-sentence (or ALBERT's sentence-order) classifier on the [CLS] state, and
        # an objective's own head (ELECTRA's generator): pretraining heads, not part of the exported model
        self.pair_head = pair_head(self.model_cfg) if self.cfg.pair_loss() != "none" else None
        objective, params = self.cfg.objective, self.cfg.objective_params
        self.objective_head = (
            implementations.objective(objective).head(self.model_cfg, params)
            if OBJECTIVES[objective].has_head(params)
            else None
        )
        self.compile = compile
        self._token_loss = token_loss
        self.history: list[dict[str, float]] = []
        self._train_losses: list[tuple[int, Tensor]] = []  # on the device until the next log boundary
        self._last_log: tuple[float, int] | None = None  # the clock and step of the last boundary
        self._ended_step = 0  # global_step at the end of the last micro-batch
        # input positions that were padding (an input format's short rows): this process's since the
        # start or the last restore, on the device; all processes' before that, from the checkpoint
        self._padding: Tensor | int = 0
        self._padding_restored = 0
        # Transformer-XL's memories by lane (stream_segments), training's and validation's
        self.memory: dict[int, list[Tensor]] = {}
        self._val_memory: dict[int, list[Tensor]] = {}
        self.step_flops: int | None = None  # one micro-batch's FLOPs (models.flops), set by the stage
        self.peak_flops: float | None = None  # the device's bf16 peak, when known: MFU

    def configure_model(self) -> None:
        if self.compile:
            self.model.compile()  # in place: parameter names and the state dict stay as they are
            self._token_loss = torch.compile(token_loss)

    def terms(self, batch: dict[str, Tensor]) -> Terms:
        """The step's terms: the token loss, with the pair head's loss and accuracy beside it where
        there is one; an objective with its own head computes them there."""
        recurrent = self.model_cfg.mem_len > 0
        if self.objective_head is not None:
            if recurrent:  # XLNet's two streams over the content stream's memory
                head = self.objective_head
                return self._recurrent(batch, lambda memory: head.recur(self.model, batch, memory))
            return self.objective_head(self.model, batch)
        if self.pair_head is None:
            hidden = None
            if recurrent:
                ids, pad_mask = batch["input_ids"], batch.get("pad_mask")
                hidden = self._recurrent(batch, lambda memory: self.model.recur(ids, memory, pad_mask))
            logits, labels = self.model.arch.logits_and_labels(self.model, batch, hidden)
            loss, correct = self._token_loss(logits, labels)
            return Terms(loss, correct, labels.numel())
        hidden = self.model(
            batch["input_ids"], batch.get("pad_mask"), prefix_lengths=batch.get("prefix_lengths")
        )
        logits, labels = self.model.arch.logits_and_labels(self.model, batch, hidden)
        loss, correct = self._token_loss(logits, labels)
        pair_logits = self.pair_head(hidden[:, 0])
        pair_loss = F.cross_entropy(pair_logits.float(), batch["pair_labels"])
        pair_correct = (pair_logits.argmax(-1) == batch["pair_labels"]).float().mean()
        name = self.cfg.pair_loss()
        return Terms(loss, correct, labels.numel(), {name: (pair_loss, 1.0)}, {name: pair_correct})

    def _recurrent(
        self, batch: dict[str, Tensor], step: Callable[[list[Tensor] | None], tuple[Any, list[Tensor]]]
    ) -> Any:
        """Transformer-XL's step: what `step` computes over the segment and its lane's memory (none at a
        stream's start, or for a batch from no stream), the new memory it returns kept for the lane's
        next segment."""
        lane, continues = batch.get("stream", (0, False))
        memories = self.memory if self.training else self._val_memory
        memory = memories.get(lane) if continues else None
        if memory is not None:
            memory = [states.to(batch["input_ids"].device) for states in memory]
        result, memories[lane] = step(memory)
        return result

    def loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, int]:
        """The token loss, its correct predictions and the number of predicted tokens."""
        terms = self.terms(batch)
        return terms.loss, terms.correct, terms.count

    def training_loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, int]:
        """What a step minimises (BERT's sum of the token and pair losses), its correct predictions and
        predicted tokens."""
        terms = self.terms(batch)
        return terms.total(), terms.correct, terms.count

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # dropout draws from a stream fixed by the step, so a resumed run repeats it exactly
        torch.manual_seed(derived_seed(self.cfg.seed, DROPOUT_STREAM, self.global_step, self.global_rank))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # nothing here reads a tensor on the host: the CPU queues the next steps while the GPU works
        terms = self.terms(batch)
        loss = terms.total()
        self._train_losses.append((self.global_step, loss.detach()))  # logged per step, below
        if "pad_mask" in batch:
            self._padding = self._padding + (~batch["pad_mask"]).sum()
        self.log(f"train/{self.cfg.objective}_accuracy", terms.correct / terms.count)
        for name, value in terms.logged().items():
            self.log(f"train/{name}", value)
        return loss

    def _step_loss(self, step: int) -> Tensor:
        """The mean loss of the step's micro-batches, on the device."""
        return torch.stack([loss for s, loss in self._train_losses if s == step]).mean()

    def _read_train_losses(self) -> None:
        """The step losses since the last boundary into `history`, read in one transfer; the first that
        is not finite stops the run with its step (before a checkpoint could keep its weights). Every
        process reads at the same boundaries: a step's loss is the mean over all their micro-batches."""
        steps = sorted({step for step, _ in self._train_losses})
        losses = [self._step_loss(step) for step in steps]
        self._train_losses.clear()
        if losses and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            losses = list(self.all_gather(torch.stack(losses)).mean(0))
        values = read_losses(losses, steps)
        self.history += [{"step": s, "train_loss": v} for s, v in zip(steps, values, strict=True)]

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # a boundary: the end of an optimizer step (not of a micro-batch within one) at a log step
        step, previous = self.global_step, self._ended_step
        self._ended_step = step
        if step == previous or step % self.trainer.log_every_n_steps:
            return
        # reading the losses waits for the device's queue to drain: the time since the last boundary is
        # the time the device took for those steps (a host clock per step would time the CPU's queueing)
        self._read_train_losses()
        now = time.perf_counter()
        if self._last_log is not None:
            elapsed = now - self._last_log[0]
            micro_batches = (step - self._last_log[1]) * self.cfg.accumulate
            tokens = micro_batches * batch["input_ids"].numel()
            self.log("train/tokens_per_s", tokens / elapsed * self.trainer.world_size)
            if self.step_flops:
                flops_per_s = micro_batches * self.step_flops / elapsed  # this device's
                self.log("train/flops_per_s", flops_per_s * self.trainer.world_size)
                if self.peak_flops:
                    self.log("train/mfu", flops_per_s / self.peak_flops)
        self._last_log = (now, step)

    def on_train_start(self) -> None:
        self._ended_step = self.global_step  # a resumed run's, restored

    def padded_positions(self) -> int:
        """Input positions trained on that were padding, summed over the processes (every one calls it)."""
        counts = torch.as_tensor(self._padding, device=self.device).reshape(1)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            counts = self.all_gather(counts)
        return self._padding_restored + int(counts.sum())

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._read_train_losses()
        checkpoint["loss_history"] = self.history
        checkpoint["padded_positions"] = self.padded_positions()
        if self.model_cfg.mem_len:  # the next step's memories: a resumed run continues every stream
            checkpoint["memory"] = self.memory_state()

    def memory_state(self) -> dict[int, list[Tensor]]:
        """Every process's memories by lane, on the host (every process calls it)."""
        lanes = sorted(self.memory)
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        if world == 1 or not lanes:
            return {lane: [states.cpu() for states in self.memory[lane]] for lane in lanes}
        stacked = torch.stack([torch.stack(self.memory[lane]) for lane in lanes])
        gathered = self.all_gather(stacked).cpu()  # [processes, lanes, layers, B, M, d]
        # a process's lanes are its rank, then every world-th (stream_segments' index mod lanes)
        return {rank + world * i: list(gathered[rank, i]) for rank in range(world) for i in range(len(lanes))}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.history = list(checkpoint.get("loss_history", []))
        self._padding, self._padding_restored = 0, checkpoint.get("padded_positions", 0)
        world, rank = (self.trainer.world_size, self.global_rank) if self._trainer is not None else (1, 0)
        memory = checkpoint.get("memory", {})
        self.memory = {lane: memory[lane] for lane in memory if lane % world == rank}  # this process's

    def on_train_end(self) -> None:
        self._read_train_losses()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # once per step, after its micro-batches' backward passes: their mean, as the curve has it
        self.log("train/loss", self._step_loss(self.global_step), prog_bar=True, sync_dist=True)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads, 2.0))  # on the device

    def on_validation_epoch_start(self) -> None:
        self._read_train_losses()  # the curve stays in step order
        self._val_memory = {}  # validation streams start afresh
        # loss * tokens, correct, tokens: summed on the device, read once at the end
        self._val_sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        self._val_logged_sums: dict[str, Tensor] = {}  # the terms' other metrics summed, and batches

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        terms = self.terms(batch)
        loss, count = terms.loss, terms.count
        tokens = torch.full((), count, dtype=torch.float64, device=loss.device)  # a fill, not a copy
        self._val_sums += torch.stack([loss.double() * count, terms.correct.double(), tokens])
        for name, value in terms.logged().items():
            summed = torch.stack([value.double(), torch.ones_like(tokens)])
            self._val_logged_sums[name] = self._val_logged_sums.get(name, 0) + summed

    def on_validation_epoch_end(self) -> None:
        sums = self.all_gather(self._val_sums).reshape(-1, 3).sum(0)
        loss = float(sums[0] / sums[2])
        self.log("val/loss", loss)
        self.log(f"val/{self.cfg.objective}_accuracy", float(sums[1] / sums[2]))
        # perplexities of different objectives are different quantities: named by objective
        self.log(f"val/{self.cfg.objective}_perplexity", math.exp(loss))
        for name, summed in self._val_logged_sums.items():  # beside the token loss: a pair head's
            summed = self.all_gather(summed).reshape(-1, 2).sum(0)
            self.log(f"val/{name}", float(summed[0] / summed[1]))
        self.history.append({"step": self.global_step, "val_loss": loss})

    def configure_optimizers(self) -> dict[str, Any]:
        groups = weight_decay_groups(self.model, self.cfg.weight_decay)
        for head in (self.pair_head, self.objective_head):
            if head is not None:
                groups += weight_decay_groups(head, self.cfg.weight_decay)
        # Lightning refuses to clip the gradients of a fused optimizer under mixed precision
        mixed = str(self.trainer.precision).endswith("mixed")
        kwargs = {"foreach": True} if mixed or self.device.type not in ("cuda", "cpu") else {"fused": True}
        optimizer = torch.optim.AdamW(
            groups, lr=self.cfg.lr, betas=(self.cfg.beta1, self.cfg.beta2), **kwargs
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, self.cfg))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
