"""Stage `finetune@<model>-<task>`: fine-tune a pretrained model on one GLUE task, once per seed.

`--init scratch` (stage `finetune_scratch@<model>-<task>`) fine-tunes a randomly initialised copy of the
same architecture with the same recipe: the baseline that says what pretraining bought. Reads
`checkpoints/<model>/final` (pretrained only), `data/tokenizer` and `data/glue/<task>`; writes
`data/finetune/<model>/<task>/<init>/`: `seed<k>/<split>.parquet` predictions (`idx, label,
prediction`) for every evaluation split and `summary.json`. One MLflow run per seed.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from lmpipe.finetuning import (
    backbone,
    check_tokenizer,
    device,
    examples,
    finetune_config,
    predict_splits,
    tokenizer_meta,
)
from lmpipe.glue.tasks import TASKS
from lmpipe.layout import final_weights, finetune_dir, finetune_stage, predictions_sha256
from lmpipe.params.finetune import FinetuneSections
from lmpipe.params.project import load_stage_params
from lmpipe.runtime import (
    StageError,
    atomic_dir,
    log,
    run_main,
    sha256_file,
    write_json,
)
from lmpipe.tracking import (
    PREDICTIONS_TAG,
    WEIGHTS_TAG,
    find_run,
    finetune_run_key,
    stage_run,
    tracking_experiment,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.finetune")
    parser.add_argument("model", help="a key of params.yaml: models")
    parser.add_argument("task", help="a task of params.yaml: glue.tasks")
    parser.add_argument("--init", choices=["pretrained", "scratch"], default="pretrained")
    args = parser.parse_args(argv)
    name, init = args.model, args.init
    params = load_stage_params(FinetuneSections)
    params.check_model(name)
    if args.task not in params.glue.tasks:
        raise StageError(
            f"params.yaml: glue.tasks: '{args.task}' is not among them ({', '.join(params.glue.tasks)})"
        )
    task, variant = TASKS[args.task], params.models[name]
    recipe, common = params.recipe_of(name, task.name), params.finetune.common
    stage = finetune_stage(name, task.name, init)
    tok = tokenizer_meta()
    if init == "pretrained":
        check_tokenizer(name, tok["sha256"])
    data = examples(task, recipe, params.seed)
    train_labels = data.train["label"].to_numpy()

    from models.finetune import finetune
    from models.heads import SequenceHead
    from models.training import NonFiniteLoss, resolve_precision

    # tracking: one run per seed, linked to the pretrain run of the weights it starts from
    tags = {
        "arch": variant.arch,
        "objective": variant.objective,
        "tokenizer_sha256": tok["sha256"],
        "data.synthetic": params.glue.synthetic,
    }
    weights_sha = None
    if init == "pretrained":
        weights_sha = sha256_file(final_weights(name))
        found = find_run(tracking_experiment(), {"stage": "pretrain", WEIGHTS_TAG: weights_sha})
        if found:
            tags["pretrain_run_id"] = found
    # `auto` resolved here, so MLflow holds the precision that trains
    target = device(common.accelerator)
    common = common.model_copy(update={"precision": resolve_precision(common.precision, target)})
    logged_params = {
        f"models.{name}": variant.model_dump(exclude_none=True),
        # the recipe as it trains: the task's, with this model's own values (also logged) on top
        f"finetune.tasks.{task.name}": recipe.model_dump(),
        **{f"finetune.models.{name}.{k}": v for k, v in params.finetune.models.get(name, {}).items()},
        "finetune.common": common.model_dump(),
        "init": init,
        "train_rows": len(data.train),
    }

    pooling = {"encoder": common.encoder_pooling, "encoder_decoder": common.encdec_pooling}
    num_labels = 1 if task.is_regression else len(task.labels or ())
    results: dict[str, Any] = {}
    with atomic_dir(finetune_dir(name, task.name, init)) as tmp:
        for seed in params.finetune.seeds:
            cfg = finetune_config(recipe, common, seed)
            with stage_run(
                "finetune",
                tracking_experiment(),
                {**logged_params, "seed": seed},
                {**tags, **finetune_run_key(name, task.name, init, seed)},
                run_name=f"{stage}/seed{seed}",
            ) as run:
                started = time.perf_counter()
                head = SequenceHead(
                    backbone(params, name, init, tok["vocab_size"], seed),
                    num_labels,
                    pooling=pooling.get(variant.arch),
                    dropout=common.dropout,
                    start_id=tok["bos_id"],
                ).to(target)
                try:
                    losses = finetune(head, data.train_ids, train_labels, cfg)
                except NonFiniteLoss as exc:
                    raise StageError(
                        f"{stage} seed {seed}: {exc}; lower {params.recipe_key(name, task.name, 'lr')}"
                    ) from None
                run.log_series("train_loss", losses)
                eval_losses = predict_splits(head, data, common, tmp / f"seed{seed}")
                seconds = time.perf_counter() - started
                digest = predictions_sha256(tmp / f"seed{seed}")
                # the GLUE metrics come from `evaluate`, which scores the predictions and logs them here
                run.set_tags({PREDICTIONS_TAG: digest})
                run.log_metrics({"loss": eval_losses, "steps": len(losses), "train_seconds": seconds})
            # no run id or timing here: the same params give the same bytes
            results[str(seed)] = {
                "steps": len(losses),
                "train_loss": losses[-1],
                "eval_loss": eval_losses,
                "predictions_sha256": digest,
            }
            log.info(
                "%s seed %d: %d steps in %.1f s, train loss %.3f, %s",
                stage,
                seed,
                len(losses),
                seconds,
                losses[-1],
                ", ".join(f"{split} loss {loss:.3f}" for split, loss in eval_losses.items()),
            )
        summary = {
            "model": name,
            "task": task.name,
            "init": init,
            "arch": variant.arch,
            "objective": variant.objective,
            "train_rows": len(data.train),
            "eval_rows": {s: len(f) for s, f in data.evaluations.items()},
            "steps": cfg.total_steps(len(data.train)),
            "synthetic": params.glue.synthetic,
            "tokenizer_sha256": tok["sha256"],
            "weights_sha256": weights_sha,  # of the pretrained checkpoint; None from scratch
            "seeds": results,
        }
        write_json(tmp / "summary.json", summary)


if __name__ == "__main__":
    run_main(main)
