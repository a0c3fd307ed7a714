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

import pandas as pd

from lmpipe.layout import (
    GLUE_CHART,
    GLUE_METRICS,
    GLUE_PLOT,
    GLUE_REPORT,
    GLUE_TABLE,
    INITS,
    PREDICTIONS,
)
from lmpipe.params.finetune import FinetuneSections
from lmpipe.params.project import load_stage_params
from lmpipe.report.glue import (
    aligned_predictions,
    bar_chart,
    collect,
    differences,
    glue_metrics,
    log_to_finetune_runs,
    log_to_model_runs,
    report,
    seed_spread,
    summarize,
    title,
    verdict_cell,
)
from lmpipe.runtime import StageError, atomic_file, log, run_main, write_json
from lmpipe.tracking import stage_run, tracking_experiment


def main() -> None:
    params = load_stage_params(FinetuneSections)
    with stage_run(
        "evaluate",
        tracking_experiment(),
        {
            "glue.tasks": params.glue.tasks,
            "finetune.seeds": params.finetune.seeds,
            "models": list(params.models),
        },
        {"data.synthetic": params.glue.synthetic},
    ) as run:
        if not params.models:
            raise StageError("params.yaml: models: no models to evaluate")
        scored = collect(params)
        medians = summarize(scored.table)
        versus_scratch = {
            model: differences(scored, (model, "pretrained"), (model, "scratch"), params.seed)
            for model in params.models
        }
        summary = glue_metrics(medians, seed_spread(scored.table), versus_scratch)
        best = max(summary, key=lambda m: summary[m]["pretrained"]["average"])
        versus_best = {
            other: differences(scored, (best, "pretrained"), (other, "pretrained"), params.seed)["average"]
            for other in summary
            if other != best
        }
        text = report(params, scored, medians, summary, versus_scratch, best, versus_best)
        png = bar_chart(summary, params.glue.synthetic)
        plot_rows = [
            {"run": f"{model}/{init}/{title(k)}", "score": v}
            for model, inits in summary.items()
            for init in INITS
            for k, v in inits[init].items()
        ]
        aligned = aligned_predictions(scored, params.finetune.seeds)
        # everything is computed before the first file is written: a failure leaves no partial outputs
        with atomic_file(GLUE_TABLE) as handle:
            scored.table.to_csv(handle, index=False)
        with atomic_file(GLUE_REPORT) as handle:
            handle.write(text)
        with atomic_file(GLUE_CHART, "wb") as handle:
            handle.write(png)
        with atomic_file(GLUE_PLOT) as handle:
            pd.DataFrame(plot_rows).to_csv(handle, index=False)
        with atomic_file(PREDICTIONS, "wb") as handle:
            aligned.to_parquet(handle, index=False)
        write_json(GLUE_METRICS, summary)
        run.log_metrics(summary)
        run.set_tags(
            {
                f"verdict.{model}.{key}": d.verdict
                for model, found in versus_scratch.items()
                for key, d in found.items()
            }
        )
        log_to_finetune_runs(scored.table, tracking_experiment())
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
