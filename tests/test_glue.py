"""The GLUE registry and the reader of the original TSV layout, on the real files in GLUE_DIR."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmpipe.glue.prepare import read_tsv
from lmpipe.glue.tasks import TASKS, task
from lmpipe.runtime import StageError

OFFICIAL_ROWS = {
    ("cola", "train"): 8551,
    ("cola", "validation"): 1043,
    ("sst2", "train"): 67349,
    ("sst2", "validation"): 872,
    ("mrpc", "train"): 3668,
    ("mrpc", "validation"): 408,
    ("stsb", "train"): 5749,
    ("stsb", "validation"): 1500,
    ("rte", "train"): 2490,
    ("rte", "validation"): 277,
    ("wnli", "train"): 635,
    ("wnli", "validation"): 71,
}


@pytest.mark.parametrize(("name", "split"), list(OFFICIAL_ROWS))
def test_real_files_have_the_official_row_counts(glue_dir: Path, name: str, split: str) -> None:
    spec = TASKS[name]
    frame = read_tsv(glue_dir / spec.folder / spec.splits[split], spec)
    assert len(frame) == OFFICIAL_ROWS[(name, split)]
    assert list(frame.columns) == ["idx", *spec.text_columns, "label"]
    if spec.is_regression:
        assert frame["label"].between(0, 5).all()
    else:
        assert set(frame["label"]) == set(range(len(spec.labels)))


def test_exact_rows(glue_dir: Path) -> None:
    mrpc = read_tsv(glue_dir / "MRPC/dev.tsv", TASKS["mrpc"])  # BOM header, unbalanced quotes
    assert (
        mrpc.iloc[0]["sentence2"]
        == '"The foodservice pie business does not fit our long-term growth strategy.'
    )
    assert mrpc.iloc[0]["label"] == 1 and mrpc.iloc[1]["label"] == 0
    cola = read_tsv(glue_dir / "CoLA/dev.tsv", TASKS["cola"])  # no header, no final newline
    assert cola.iloc[0]["sentence"] == "The sailors rode the breeze clear of the rocks."
    assert cola.iloc[-1]["idx"] == 1042
    rte = read_tsv(glue_dir / "RTE/dev.tsv", TASKS["rte"])
    assert rte.iloc[0]["label"] == TASKS["rte"].labels.index("not_entailment") == 1
    stsb = read_tsv(glue_dir / "STS-B/dev.tsv", TASKS["stsb"])
    assert stsb.iloc[1]["label"] == pytest.approx(4.75)
    sst2 = read_tsv(glue_dir / "SST-2/dev.tsv", TASKS["sst2"])
    assert sst2.iloc[0]["sentence"] == "it 's a charming and often affecting journey . "


def test_registry() -> None:
    assert len(TASKS) == 9
    assert TASKS["mnli"].eval_splits == ["validation_matched", "validation_mismatched"]
    assert TASKS["stsb"].is_regression and TASKS["stsb"].metrics == ("pearson", "spearmanr")
    assert TASKS["cola"].metrics == ("matthews_correlation",)
    with pytest.raises(
        StageError, match="glue.tasks\\[0\\]: unknown GLUE task 'sst-5'; the tasks are: cola, sst2"
    ):
        task("sst-5", "glue.tasks[0]")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_bad_tsv_input_is_named(tmp_path: Path) -> None:
    rte = TASKS["rte"]
    with pytest.raises(
        StageError, match=r"missing column\(s\) sentence2, label; the header has: index, sentence1"
    ):
        read_tsv(write(tmp_path / "a.tsv", "index\tsentence1\n0\tA.\n"), rte)
    with pytest.raises(StageError, match=r"b.tsv:3: label 'maybe' is not one of rte's labels"):
        read_tsv(
            write(
                tmp_path / "b.tsv",
                "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n1\tA.\tB.\tmaybe\n",
            ),
            rte,
        )
    with pytest.raises(StageError, match=r"c.tsv: no rows \(an empty split\)"):
        read_tsv(write(tmp_path / "c.tsv", "index\tsentence1\tsentence2\tlabel\n"), rte)
    with pytest.raises(StageError, match=r"d.tsv:2: 2 tab-separated fields, expected at least 4"):
        read_tsv(write(tmp_path / "d.tsv", "gj04\t1\t\tFine.\ngj04\t1\n"), TASKS["cola"])
    with pytest.raises(StageError, match=r"e.tsv:2: label 'high' is not a number"):
        read_tsv(write(tmp_path / "e.tsv", "sentence1\tsentence2\tscore\nA.\tB.\thigh\n"), TASKS["stsb"])
    with pytest.raises(StageError, match=r"missing \(expected the RTE folder"):
        read_tsv(tmp_path / "nope.tsv", rte)


def prepare(workdir, **glue) -> dict:
    import json

    from stages import glue_prepare

    workdir.set("glue", glue)
    glue_prepare.main()
    return json.loads((workdir.path / "data/glue/manifest.json").read_text())


def test_prepare_from_the_real_tsv_folder(workdir, glue_dir: Path) -> None:
    import pandas as pd

    manifest = prepare(workdir, source="tsv", path=str(glue_dir), tasks=["cola", "mrpc", "stsb"])
    assert manifest["rows"] == {
        "cola": {"train": 8551, "validation": 1043},
        "mrpc": {"train": 3668, "validation": 408},
        "stsb": {"train": 5749, "validation": 1500},
    }
    assert manifest["synthetic"] is False
    stsb = pd.read_parquet(workdir.path / "data/glue/stsb/validation.parquet")
    assert (
        list(stsb.columns) == ["idx", "sentence1", "sentence2", "label"] and stsb["label"].dtype == "float64"
    )


def test_prepare_from_a_save_to_disk_folder_as_the_hub_gives_it(workdir) -> None:
    import datasets

    rows = {
        "sentence1": ["A man sleeps.", "It rains."],
        "sentence2": ["Someone sleeps.", "It is dry."],
        "label": [0, 1],
        "idx": [0, 1],
    }
    features = datasets.Features(
        {
            "sentence1": datasets.Value("string"),
            "sentence2": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["entailment", "not_entailment"]),
            "idx": datasets.Value("int32"),
        }
    )
    split = datasets.Dataset.from_dict(rows, features=features)
    datasets.DatasetDict({"train": split, "validation": split}).save_to_disk(str(workdir.path / "hub/rte"))
    manifest = prepare(workdir, source="disk", path="hub", tasks=["rte"])
    assert manifest["rows"] == {"rte": {"train": 2, "validation": 2}}

    bad = datasets.Dataset.from_dict({**rows, "label": [0, 7]})
    datasets.DatasetDict({"train": bad, "validation": bad}).save_to_disk(str(workdir.path / "bad/rte"))
    before = (workdir.path / "data/glue/rte/train.parquet").read_bytes()
    with pytest.raises(StageError, match=r"rte/train from disk bad: row 1: label=7 fails isin\(\[0, 1\]\)"):
        prepare(workdir, source="disk", path="bad", tasks=["rte"])
    assert (workdir.path / "data/glue/rte/train.parquet").read_bytes() == before  # no partial output


def test_unknown_task_in_params_is_one_line(workdir) -> None:
    workdir.set("glue", {"source": "tsv", "path": "x", "tasks": ["rte", "sts"]})
    result = workdir.run("glue_prepare")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: params.yaml: glue.tasks: item 1, 'sts', is not a GLUE task; the tasks are: "
        "cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli"
    )


def test_synthetic_tasks_go_through_the_same_reader(workdir) -> None:
    import json

    import pandas as pd

    from stages import glue_prepare, sample

    sample.main()
    workdir.set("glue.tasks", ["sst2", "cola", "rte", "stsb", "mrpc"])  # every task sample writes
    glue_prepare.main()  # the default source: tsv, path data/sample/glue
    manifest = json.loads((workdir.path / "data/glue/manifest.json").read_text())
    assert manifest["synthetic"] is True
    assert manifest["rows"] == {
        t: {"train": 400, "validation": 1000} for t in ["sst2", "cola", "rte", "stsb", "mrpc"]
    }
    raw = (workdir.path / "data/sample/glue/MRPC/train.tsv").read_bytes()
    assert raw.startswith("\ufeffQuality".encode())  # the same quirks as the real files
    assert not (workdir.path / "data/sample/glue/CoLA/dev.tsv").read_text().endswith("\n")
    for name in ["sst2", "cola", "rte", "mrpc"]:  # both classes present in every split
        for split in ["train", "validation"]:
            labels = pd.read_parquet(workdir.path / f"data/glue/{name}/{split}.parquet")["label"]
            assert labels.value_counts().min() > 0.3 * len(labels) / 2


def test_metrics_agree_with_their_definitions(glue_dir: Path) -> None:
    """Scores of a deterministic predictor on the real dev labels, against the formulas themselves."""
    import numpy as np
    import scipy.stats

    from lmpipe.glue.metrics import glue_average, scores

    rng = np.random.default_rng(0)
    results = {}
    for name in ["cola", "mrpc", "stsb", "rte"]:
        spec = TASKS[name]
        labels = read_tsv(glue_dir / spec.folder / spec.splits["validation"], spec)["label"].to_numpy()
        if spec.is_regression:
            predictions = labels + rng.normal(0, 1.0, len(labels))
        else:  # right 70 % of the time
            predictions = np.where(rng.random(len(labels)) < 0.7, labels, 1 - labels)
        got = scores(spec, predictions, labels)
        results[name] = got
        if name == "cola":
            tp = np.sum((predictions == 1) & (labels == 1))
            tn = np.sum((predictions == 0) & (labels == 0))
            fp = np.sum((predictions == 1) & (labels == 0))
            fn = np.sum((predictions == 0) & (labels == 1))
            mcc = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
            assert abs(got["matthews_correlation"] - mcc) < 1e-9
        elif name == "mrpc":
            tp = np.sum((predictions == 1) & (labels == 1))
            precision, recall = tp / np.sum(predictions == 1), tp / np.sum(labels == 1)
            assert abs(got["f1"] - 2 * precision * recall / (precision + recall)) < 1e-9
            assert abs(got["accuracy"] - np.mean(predictions == labels)) < 1e-9
        elif name == "stsb":
            assert abs(got["pearson"] - np.corrcoef(predictions, labels)[0, 1]) < 1e-9
            # the labels have ties: Spearman's rho is Pearson's r of the average ranks
            average = [scipy.stats.rankdata(x) for x in (predictions, labels)]
            assert abs(got["spearmanr"] - np.corrcoef(*average)[0, 1]) < 1e-9
        else:
            assert abs(got["accuracy"] - np.mean(predictions == labels)) < 1e-9
    # MNLI's matched and mismatched sets are two evaluations of the average, as on the leaderboard
    results["mnli_matched"], results["mnli_mismatched"] = {"accuracy": 0.5}, {"accuracy": 0.7}
    expected = np.mean([np.mean(list(r.values())) for r in results.values()])
    assert abs(glue_average(results) - expected) < 1e-12
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        scores(TASKS["rte"], np.array([0, 1, 1]), np.array([0, 1]))
