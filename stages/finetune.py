"""Stage `finetune@<model>`: fine-tune a pretrained model on every task of `glue.tasks`, once per seed,
and beside it a randomly initialised copy of the same architecture with the same recipe (`scratch`): the
baseline that says what pretraining bought. Reads `checkpoints/<model>/final`, `data/tokenizer` and
`data/glue`; writes `data/finetune/<model>/<init>/<task>/`: `seed<k>/<split>.parquet` predictions
(`idx, label, prediction`) for every evaluation split and `summary.json`. One MLflow run per (task,
init, seed).

Each (task, init, seed) is a job whose finished result is kept by its digest
(`lmpipe.layout.finetune_cache`): a change to one task's recipe or a seed added re-runs only those, a
new pretraining only the pretrained ones (not the baselines), and an interrupted stage resumes. On
the CPU the jobs run in as many worker processes as the stage's cores hold, at
`finetune.common.threads` threads each.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from lmpipe.finetuning import (
    FinetuneJob,
    cached_result,
    check_tokenizer,
    device,
    job_workers,
    planned_jobs,
    run_jobs,
    tokenizer_meta,
    write_finetunes,
)
from lmpipe.layout import final_weights, finetune_stage
from lmpipe.params.finetune import FinetuneSections
from lmpipe.params.project import load_stage_params
from lmpipe.runtime import StageError, log, run_main, sha256_file
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
    name = parser.parse_args(argv).model
    params = load_stage_params(FinetuneSections)
    params.check_model(name)
    tok = tokenizer_meta()
    check_tokenizer(name, tok["sha256"])
    weights_sha = sha256_file(final_weights(name))

    from models.training import resolve_precision

    # `auto` resolved here, so that the digests and MLflow hold the precision that trains
    target = device(params.finetune.common.accelerator)
    common = params.finetune.common
    common = common.model_copy(update={"precision": resolve_precision(common.precision, target)})
    jobs, outs = planned_jobs(params, name, common, tok, weights_sha)
    # the longest first (by epochs and length), so that no worker is left with a long one at the end
    todo = [i for i, out in enumerate(outs) if cached_result(out) is None]
    todo.sort(key=lambda i: -jobs[i].recipe.epochs * jobs[i].recipe.max_len)
    workers = job_workers(len(todo), common.threads, target.type == "cuda")
    log.info(
        "%s: %d fine-tunes (%d tasks x %d seeds, pretrained and from scratch), %d done before; %d at once",
        finetune_stage(name),
        len(jobs),
        len(params.glue.tasks),
        len(params.finetune.seeds),
        len(jobs) - len(todo),
        workers,
    )
    if todo:
        finished = run_jobs([jobs[i] for i in todo], [outs[i] for i in todo], workers)
        log_runs(params, name, weights_sha, tok["sha256"], finished)
    write_finetunes(params, name, jobs, outs, tok["sha256"], weights_sha)


def log_runs(
    params: FinetuneSections,
    name: str,
    weights_sha: str,
    tokenizer_sha: str,
    finished: Iterator[tuple[FinetuneJob, dict[str, Any]]],
) -> None:
    """One MLflow run per fine-tune as it finishes, from the time it started, a pretrained one linked to
    the pretrain run of the weights it loaded; a diverged loss stops the stage with the key to change."""
    variant, stage = params.models[name], finetune_stage(name)
    tags = {
        "arch": variant.arch,
        "objective": variant.objective,
        "tokenizer_sha256": tokenizer_sha,
        "data.synthetic": params.glue.synthetic,
    }
    for i, (job, result) in enumerate(finished):
        if "error" in result:
            raise StageError(f"{stage} {job.task} seed {job.seed}: {result['error']}")
        if i == 0:  # looked up once the jobs run: MLflow's import takes seconds
            pretrain_run = find_run(tracking_experiment(), {"stage": "pretrain", WEIGHTS_TAG: weights_sha})
        # a baseline's run links to no pretraining
        linked = {"pretrain_run_id": pretrain_run} if job.init == "pretrained" and pretrain_run else {}
        logged_params = {
            f"models.{name}": variant.model_dump(exclude_none=True),
            # the recipe as it trains: the task's, with this model's own values (also logged) on top
            f"finetune.tasks.{job.task}": job.recipe.model_dump(),
            **{f"finetune.models.{name}.{k}": v for k, v in params.finetune.models.get(name, {}).items()},
            "finetune.common": job.common.model_dump(),
            "finetune.method": job.method,
            **({f"finetune.methods.{job.method}": job.method_params} if job.method_params else {}),
            "init": job.init,
            "train_rows": result["train_rows"],
            "seed": job.seed,
        }
        with stage_run(
            "finetune",
            tracking_experiment(),
            logged_params,
            {**tags, **linked, **finetune_run_key(name, job.task, job.init, job.seed)},
            run_name=f"{stage}/{job.task}/{job.init}/seed{job.seed}",
            started_at=result["started"],
        ) as run:
            run.log_series("train_loss", result["losses"])
            # the GLUE metrics come from `evaluate`, which scores the predictions and logs them here
            run.set_tags({PREDICTIONS_TAG: result["predictions_sha256"]})
            metrics = {"loss": result["eval_loss"], "steps": result["steps"]}
            metrics |= {k: result[k] for k in ("trained_parameters", "total_parameters")}
            run.log_metrics({**metrics, "train_seconds": result["seconds"]})
        log.info(
            "%s %s %s seed %d: %d steps in %.1f s, train loss %.3f, %s",
            stage,
            job.task,
            job.init,
            job.seed,
            result["steps"],
            result["seconds"],
            result["train_loss"],
            ", ".join(f"{split} loss {loss:.3f}" for split, loss in result["eval_loss"].items()),
        )


if __name__ == "__main__":
    run_main(main)
