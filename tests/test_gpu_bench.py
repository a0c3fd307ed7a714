"""bench/gpu_throughput.py runs on the CPU (the GPU is where it matters) and on a machine that has torch,
Lightning and transformers but none of the pipeline's services."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from tests.workdir import ROOT

# what the GPU machine lacks: the benchmark must not import them
PIPELINE_ONLY = ["dvc", "mlflow", "prefect", "pandera", "pydantic", "stages", "flows"]
RUN = f"""
import runpy, sys
sys.argv = ["gpu_throughput.py", *sys.argv[1:]]
runpy.run_path("bench/gpu_throughput.py", run_name="__main__")
imported = sorted({{name.split(".")[0] for name in sys.modules}} & set({PIPELINE_ONLY!r}))
assert not imported, f"the benchmark imported {{imported}}"
"""


def test_the_gpu_benchmark_prints_a_line_per_configuration_on_the_cpu() -> None:
    args = ["--preset", "tiny", "--seq-lens", "16", "32", "--batch-tokens", "64", "--steps", "1"]
    result = subprocess.run(
        [sys.executable, "-c", RUN, *args, "--warmup", "1", "--compile", "off"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(line["arch"], line["seq_len"]) for line in lines] == [
        (arch, seq) for arch in ("encoder", "decoder", "encoder_decoder") for seq in (16, 32)
    ]
    references = {"encoder": "BertForMaskedLM", "decoder": "GPT2LMHeadModel"}
    for line in lines:
        assert line["batch_size"] == 64 // line["seq_len"] and line["precision"] == "bf16-mixed"
        assert line["reference"]["model"] == references.get(line["arch"], "T5ForConditionalGeneration")
        assert line["reference"]["attention"] == "sdpa" and line["step_flops"] > 0
        for side in (line["ours"], line["reference"]):
            assert side["step_ms"] > 0 and side["tokens_per_s"] > 0 and math.isfinite(side["loss"])
            assert side["mfu"] is None and side["peak_memory_gib"] is None  # no bf16 peak for a CPU
        assert line["ratio"] == round(line["reference"]["step_ms"] / line["ours"]["step_ms"], 2)
        assert "threads" in line["device"]
