"""Stage `evaluate`: GLUE scores of every fine-tune, the pretrained-minus-scratch differences with
their noise verdicts, the report.

Scores are recomputed from the prediction files against the labels in `data/glue` (never trusted from
the fine-tune's own log). Per (model, init, evaluation, metric) the median over seeds; an evaluation's
score is the mean of its metrics; the average is the GLUE leaderboard's (the mean over evaluations,
MNLI matched and mismatched counted separately). Every difference (pretrained vs scratch, the best
model vs the others) gets a 95 % interval and a verdict from a paired bootstrap over the dev examples
(`lmpipe.report.significance`). Writes `metrics/glue.json` (DVC metrics, ×100), `reports/glue.md`,
`reports/glue.csv` (every seed and metric), `plots/glue.csv`, `reports/glue.png` and
`data/evaluate/predictions.parquet` (every prediction aligned with its label, for sweeps to compare).
"""

from __future__ import annotations

from lmpipe.layout import GLUE_CHART, GLUE_METRICS, GLUE_REPORT, GLUE_TABLE
from lmpipe.params.finetune import FinetuneSections
from lmpipe.params.project import load_stage_params
from lmpipe.report.glue import evaluate, log_to_finetune_runs, log_to_model_runs, verdict_cell, write_outputs
from lmpipe.runtime import log, run_main
from lmpipe.tracking import stage_run, tracking_experiment


def main() -> None:
    params = load_stage_params(FinetuneSections)
    logged = {"glue.tasks": params.glue.tasks, "finetune.seeds": params.finetune.seeds}
    logged["models"] = list(params.models)
    tags = {"data.synthetic": params.glue.synthetic}
    with stage_run("evaluate", tracking_experiment(), logged, tags) as run:
        evaluation = evaluate(params)
        write_outputs(evaluation)
        summary, versus_scratch = evaluation.summary, evaluation.versus_scratch
        run.log_metrics(summary)
        run.set_tags(
            {
                f"verdict.{model}.{key}": d.verdict
                for model, found in versus_scratch.items()
                for key, d in found.items()
            }
        )
        log_to_finetune_runs(evaluation.scored.table, tracking_experiment())
        log_to_model_runs(params, summary, versus_scratch, run.parent_id)
        for path in (GLUE_METRICS, GLUE_REPORT, GLUE_TABLE, GLUE_CHART):
            run.log_artifact(str(path))
        for model, found in versus_scratch.items():
            log.info(
                "evaluate: %s average %.1f pretrained, %.1f scratch: %s",
                model,
                summary[model]["pretrained"]["average"],
                summary[model]["scratch"]["average"],
                verdict_cell(found["average"]).replace("**", ""),
            )
        log.info("evaluate: report in %s", GLUE_REPORT)


if __name__ == "__main__":
    run_main(main)
