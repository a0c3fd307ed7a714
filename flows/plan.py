"""What a sweep will run, before it runs: `python -m flows.ablation <preset> --plan` prints the preset's
card, each row's params against the baseline's, its parameters, steps and training FLOPs, and an
estimate of its wall time on this machine. It starts no flow, DVC experiment or MLflow run.

The estimate divides FLOPs by a rate measured here: a few training steps of a decoder of the baseline
model's size, timed after a warm-up (about as many seconds as the model is large). Fine-tuning is
estimated the same way, from 6·N FLOPs per token over every fine-tune's training rows, each padded to
its task's `max_len` (an upper bound: batches are grouped by length). Both are estimates; the research
log sets the measured times beside them."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flows.presets import Card, Row, card_lines
from lmpipe.params.project import Params


def here(params: Params, model: str, equal_flops: bool) -> dict[str, str]:
    """Our side of the card's setup: the baseline point's model, data, steps, tokenizer and evaluation."""
    variant, run = params.models[model], params.pretrain_of(model)
    config = variant.config(params.tokenizer.vocab_size)
    shape = f"{config.n_layers} layers × {config.d_model}, {config.n_heads} heads"
    steps = f"{run.max_steps} steps of {run.batch_size * run.accumulate} × {run.seq_len}, lr {run.lr:g}"
    if equal_flops:
        steps += "; the other rows at its FLOPs"
    tasks = ", ".join(params.glue.tasks)
    glue = "synthetic tasks" if params.glue.synthetic else f"GLUE dev ({tasks})"
    seeds = len(params.finetune.seeds)
    return {
        "model": f"`{model}`, preset {variant.preset}: {shape}, {config.norm_position}-LN",
        "data": ", ".join(f"{name}: {source.path}" for name, source in params.ingest.sources.items()),
        "steps": steps,
        "tokenizer": f"SentencePiece {params.tokenizer.model_type}, {params.tokenizer.vocab_size} pieces",
        "evaluation": f"{glue}, {seeds} seed(s), pretrained and from scratch alike",
    }


def flat(params: Params) -> dict[str, Any]:
    """params as dotted keys; a point's one model as `model.…` (and its fine-tuning values as
    `finetune.model.…`), so that rows made under other names compare field by field."""
    dump = params.model_dump(mode="json")
    students = dump["distill"].pop("students")
    # a student's entry of `models` is its teacher's, made from its own in distill.students
    models = {name: fields for name, fields in dump.pop("models").items() if name not in students}
    own = (dump.get("finetune") or {}).pop("models", {})
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            out[prefix] = node

    walk("", dump)
    one = len(models) == 1
    for name, fields in models.items():
        walk("model" if one else f"models.{name}", fields)
    for name, fields in own.items():
        walk("finetune.model" if one else f"finetune.models.{name}", fields)
    for name, fields in students.items():
        walk("distill.student" if len(students) == 1 else f"distill.students.{name}", fields)
    return out


def against(params: Params, baseline: Params) -> str:
    """The keys whose values differ from the baseline's, `key: value`."""
    mine, theirs = flat(params), flat(baseline)
    changed = [key for key in mine if mine[key] != theirs.get(key)]
    changed += list(dict.fromkeys(absent(key, mine) for key in theirs if key not in mine))
    return "; ".join(f"{key}: {mine.get(key, '—')}" for key in changed) or "(the baseline)"


def absent(key: str, keys: Mapping[str, Any]) -> str:
    """The shortest prefix of `key` that `keys` has nothing under: a whole subtree the point lacks (a
    student, a model) is said once."""
    parts = key.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if not any(other == prefix or other.startswith(f"{prefix}.") for other in keys):
            return prefix
    return key


def train_counts(params: Params, name: str) -> tuple[int, int, int]:
    """(parameters, steps, training FLOPs) of `pretrain@<name>` as the params set it."""
    import torch

    from lmpipe.pretraining import budget
    from models.transformer import Transformer

    vocab = params.tokenizer.vocab_size
    with torch.device("meta"):
        parameters = Transformer(params.models[name].config(vocab)).num_parameters()
    planned = budget(params, name, vocab)
    steps, step = planned.steps, planned.step_flops
    return parameters, steps, steps * step


def training_rate(params: Params, name: str, steps: int = 4) -> float:
    """Training FLOP/s on this machine: fwd + bwd + AdamW of a decoder of `name`'s size at its batch,
    sequence and precision, the median of `steps` timed steps after one warm-up."""
    import torch

    from lmpipe.params.pretrain import PretrainParams
    from lmpipe.pretraining import train_config
    from lmpipe.runtime import training_threads
    from models.flops import count_step_flops
    from models.objectives.base import batch_generator
    from models.pretraining import PretrainModule, make_batch
    from models.training import resolve_precision

    vocab, run = params.tokenizer.vocab_size, params.pretrain_of(name)
    fields = params.models[name].config_fields()
    torch.set_num_threads(training_threads(run.threads))
    timed = PretrainParams(seq_len=run.seq_len, batch_size=run.batch_size)
    train = train_config("decoder", "clm", timed, params.objectives, params.seed)
    config = (
        params.models[name].config(vocab).with_(arch="decoder", max_len=max(fields["max_len"], run.seq_len))
    )
    module = PretrainModule(config, train)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    generator = batch_generator(params.seed, 0)
    rows = torch.randint(200, vocab, (run.batch_size, train.row_length()), generator=generator)
    batch = make_batch(rows, train, generator, vocab)
    bf16 = resolve_precision(run.precision, torch.device("cpu")) == "bf16-mixed"
    times = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _, _ = module.training_loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return count_step_flops(config, train) / statistics.median(times[1:])


def finetune_flops(params: Params, name: str, parameters: int, repo_dir: Path) -> tuple[int, float]:
    """(fine-tunes, their training FLOPs) for `finetune@<name>`: every task, seed and init, 6·N FLOPs per
    token, every training row padded to its task's max_len."""
    from lmpipe.glue.tasks import TASKS

    total, jobs = 0.0, 0
    fields = params.models[name].config_fields()
    width = fields.get("embedding_size") or fields["d_model"]  # ALBERT's: E wide
    weights = parameters - params.tokenizer.vocab_size * width  # the embedding table is a lookup
    for task in params.glue.tasks:
        recipe = params.recipe_of(name, task)
        rows = train_rows(params, TASKS[task].folder, repo_dir)
        if recipe.max_train_rows is not None:
            rows = min(rows, recipe.max_train_rows)
        runs = 2 * len(params.finetune.seeds)  # pretrained and scratch, each seed
        total += runs * 6 * weights * rows * recipe.epochs * recipe.max_len
        jobs += runs
    return jobs, total


def train_rows(params: Params, folder: str, repo_dir: Path) -> int:
    """A task's training rows: its train.tsv's lines less the header, or the synthetic tasks' size."""
    if params.glue.synthetic:
        return params.sample.glue_train_rows
    path = repo_dir / params.glue.path / folder / "train.tsv"
    if not path.is_file():
        return 0
    with path.open("rb") as lines:
        return max(0, sum(1 for _ in lines) - 1)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def plan_text(
    card: Card | None,
    all_rows: Sequence[Row],
    rows: Sequence[Row | None],
    validated: Sequence[Params],
    base: int,
    budget: float | None,
    repo_dir: Path,
) -> str:
    """The card, then a line per point: the paper's row, its params against the baseline, the models it
    trains with their parameters, steps and FLOPs, and the estimated wall time here."""
    baseline = validated[base]
    model = (rows[base].model if rows[base] is not None else None) or next(iter(baseline.models))
    lines = []
    if card is not None:
        lines += [
            f"# `{card.preset}`: {card.source}",
            "",
            *card_lines(card, all_rows, here(baseline, model, budget is not None)),
        ]
    if budget is not None:
        lines += ["", f"Equal FLOPs: {budget:.3g} training FLOPs a row (times its cost)."]
    rate = training_rate(baseline, model)
    header = "| point | the paper's row | against the baseline | model | parameters | steps | train FLOPs | "
    header += "est. pretrain | fine-tunes | est. fine-tune |"
    lines += ["", header, "|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    totals = [0.0, 0.0]
    for number, (row, params) in enumerate(zip(rows, validated, strict=True), start=1):
        for name in params.models:
            parameters, steps, flops = train_counts(params, name)
            jobs, tune = finetune_flops(params, name, parameters, repo_dir)
            pre_s, tune_s = flops / rate, tune / rate
            totals[0] += pre_s
            totals[1] += tune_s
            cells = [
                str(number),
                "" if row is None else (f"**{row.name}** ★" if row.star else row.name),
                against(params, baseline) if number - 1 != base else "(the baseline)",
                f"`{name}`",
                f"{parameters / 1e6:.2f} M",
                str(steps),
                f"{flops:.3g}",
                minutes(pre_s),
                str(jobs),
                minutes(tune_s),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Estimated on this machine ({cpu_name() or platform.machine()}, {threads()} threads): "
        f"{rate / 1e9:.1f} GFLOP/s "
        f"measured on a decoder of `{model}`'s size; pretraining {minutes(totals[0])}, fine-tuning "
        f"{minutes(totals[1])} (an upper bound: rows padded to max_len), in all "
        f"{minutes(sum(totals))}, one point at a time. Stages a point shares with another (its data, "
        "a scratch baseline) run once, so this counts them for every point.",
    ]
    return "\n".join(lines) + "\n"


def cpu_name() -> str | None:
    """The CPU's model name (Linux), what timings are named by."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def threads() -> int:
    import torch

    return torch.get_num_threads()
