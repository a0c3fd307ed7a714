"""Every script of bench/ runs to its end at a toy size, in seconds, so that `make bench` cannot rot:
its JSON lines are the measures docs/benchmarks.md quotes, with the same keys. No timing is asserted;
what is asserted is what each benchmark checks of itself (ours and the reference packed the same
tokens, the cluster wrote the same bytes, both runners left the same dvc.lock). The GPU benchmark's
run on the CPU is tests/test_gpu_bench.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmpipe.data.synthetic import corpus as synthetic_corpus
from tests.workdir import ROOT


def bench(script: str, *args: str, cwd: Path, **env: str | None) -> list[dict]:
    """`python bench/<script> args` to its end (`env` adds variables, None removes one); the JSON lines
    it printed."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=cwd,
        env={key: value for key, value in full_env.items() if value is not None},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{script}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def by_measure(lines: list[dict], measure: str) -> list[dict]:
    return [line for line in lines if line.get("measure") == measure]


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of generated English-like text (the offline profile's language): 250 kB in 4 files,
    the layout the data benchmarks read from CORPUS_DIR."""
    folder = tmp_path_factory.mktemp("bench-corpus")
    documents = synthetic_corpus(seed=1, documents=400, lexicon_size=500, min_sentences=5, max_sentences=14)
    for part in range(4):
        (folder / f"part{part}.txt").write_text("\n\n".join(documents[part::4]) + "\n", encoding="utf-8")
    return folder


def test_data_throughput_packs_as_many_tokens_as_the_reference(text_folder: Path, tmp_path: Path) -> None:
    lines = bench(
        "data_throughput.py", "--repeats", "1", "--copies", "1", "--vocab-size", "600",
        cwd=tmp_path, CORPUS_DIR=str(text_folder), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db",
    )  # fmt: skip
    [clean] = by_measure(lines, "clean")
    assert clean["mb"] > 0.2 and clean["mb_per_s"] > 0 and clean["near_dedup"]
    [pack] = by_measure(lines, "pack")  # the script itself asserts both packed the same tokens
    assert pack["tokens"] > 50_000 and pack["ours_tokens_per_s"] > 0 and pack["ratio"] > 0
    [sentences] = by_measure(lines, "pack_sentences")  # split apart differently: nearly the same tokens
    assert abs(sentences["tokens"] / sentences["ref_tokens"] - 1) < 0.02 and sentences["ratio"] > 0


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_data_scale_measures_every_stage_its_growth_and_the_cluster(text_folder: Path, tmp_path: Path):
    sizes = ["--sizes-mb", "0.1", "0.2", "--vocab-size", "600", "--cluster", "--work", str(tmp_path)]
    lines = bench("data_scale.py", *sizes, cwd=tmp_path, CORPUS_DIR=str(text_folder))
    rows = by_measure(lines, "data_scale")
    assert [r["stage"] for r in rows] == ["ingest", "clean", "tokenizer", "pack"] * 2
    assert 0 < rows[0]["mb"] < rows[-1]["mb"]
    assert all(r["seconds"] > 0 and r["peak_rss_mb"] > 0 for r in rows)
    growth = by_measure(lines, "growth")
    assert [g["stage"] for g in growth] == ["ingest", "clean", "tokenizer", "pack"]
    assert all(math.isfinite(g["time_exponent_a"]) and math.isfinite(g["rss_exponent_b"]) for g in growth)
    [cluster] = by_measure(lines, "clean_dask_cluster")
    assert cluster["same_bytes"] is True


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_data_incremental_adds_a_book_and_writes_the_bytes_of_a_run_from_scratch(
    text_folder: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    for path in text_folder.iterdir():
        (folder / path.name).symlink_to(path)
    book = "\n\n".join(
        synthetic_corpus(seed=2, documents=60, lexicon_size=500, min_sentences=5, max_sentences=14)
    )
    (folder / "gutenberg_1_a_book.txt").write_text(book, encoding="utf-8")
    args = ["--folder", str(folder), "--sizes-mb", "0.2", "--vocab-size", "600", "--work", str(tmp_path)]
    lines = bench("data_incremental.py", *args, cwd=tmp_path)
    runs = by_measure(lines, "data_incremental")
    assert [r["run"] for r in runs] == [
        "first",
        "one_file_added",
        "from_scratch_grown",
        "tokenizer_trained_again",
    ]
    assert runs[1]["book"] == "gutenberg_1_a_book.txt" and all(r["seconds"] > 0 for r in runs)
    assert runs[2]["same_bytes"] is True
    [log] = by_measure(lines, "data_incremental_log")
    assert any(line.startswith("ingest corpus: read 1 of ") for line in log["lines"])
    [ratio] = by_measure(lines, "data_incremental_ratio")
    assert ratio["added_over_first"] > 0


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_clean_reference_runs_datatrove_on_the_same_documents(text_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("datatrove", reason="the bench extra: pip install -e '.[bench]' (make test has it)")
    work = ["--work", str(tmp_path), "--rules", "same_definitions"]  # `all` is the same code, other values
    lines = bench("clean_reference.py", *work, cwd=tmp_path, CORPUS_DIR=str(text_folder))
    [corpus] = by_measure(lines, "corpus")
    assert corpus["exact"] > 0 and corpus["near"] > 0
    compared = by_measure(lines, "clean_vs_datatrove")
    assert [c["rules"] for c in compared] == ["same_definitions"]
    for row in compared:
        assert row["ours_seconds"] > 0 and row["datatrove_seconds"] > 0
        assert row["ours_kept"] > 0 and row["datatrove_kept"] > 0 and 0 < row["kept_jaccard"] <= 1
    removed = by_measure(lines, "planted_copies_removed")
    assert [r["kind"] for r in removed] == ["exact", "near"]
    assert all(r["ours"] == 1.0 for r in removed if r["kind"] == "exact")  # every exact copy goes


def test_train_throughput_steps_ours_and_the_transformers_models(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers, a dependency: pip install -e .")
    tiny = ["--size", "tiny", "--steps", "1", "--warmup", "1"]
    lines = bench("train_throughput.py", *tiny, "--no-memory", cwd=tmp_path)
    assert [line["objective"] for line in lines] == ["mlm", "clm", "span"]
    assert all(line["ours_tokens_per_s"] > 0 and line["ratio"] > 0 for line in lines)
    # peak memory: a child process per model; one objective's
    [line] = bench("train_throughput.py", *tiny, "--objectives", "span", cwd=tmp_path)
    assert line["ours_peak_mb"] > 0 and line["ref_peak_mb"] > 0


def test_finetune_methods_steps_every_method_beside_full_fine_tuning(tmp_path: Path) -> None:
    tiny = ["--size", "tiny", "--steps", "1", "--warmup", "0"]
    lines = bench("finetune_methods.py", *tiny, "--no-memory", cwd=tmp_path)
    assert [line["method"] for line in lines] == [
        "frozen", "lora", "houlsby", "pfeiffer", "adamix", "prefix", "prompt"
    ]  # fmt: skip
    assert all(0 < line["trained"] < line["total"] and line["time_ratio"] > 0 for line in lines)
    assert all(line["training_state_mb"] < line["full_training_state_mb"] for line in lines[:-2])
    [line] = bench("finetune_methods.py", *tiny, "--methods", "lora", cwd=tmp_path)  # a process each
    assert line["peak_mb"] > 0 and line["full_peak_mb"] > 0


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_pipeline_flow_and_dvc_repro_leave_the_same_lock(tmp_path: Path) -> None:
    """Both runners in fresh clones of HEAD, stage `sample` alone: the benchmark exits non-zero when
    the two dvc.lock files differ."""
    lines = bench(
        "pipeline_flow.py", "--target", "sample", cwd=tmp_path,
        PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=None,
    )  # fmt: skip
    assert [line["runner"] for line in lines[:2]] == ["dvc repro", "flows.pipeline"]
    assert lines[2]["same_dvc_lock"] is True and lines[2]["stages"] == 1


def test_threads_runs_both_settings(tmp_path: Path) -> None:
    lines = bench("threads.py", "--steps", "2", cwd=tmp_path)
    assert [line.get("setting") for line in lines[:2]] == ["torch default", "ours"]
    assert lines[1]["threads_each"] == max(1, len(os.sched_getaffinity(0)) // 2)
    assert lines[2]["speedup"] > 0
