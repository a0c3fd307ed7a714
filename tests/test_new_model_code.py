"""A new objective and a new architecture are two modules and one registry line each: written into a
copy of the reproduced project, regenerated (`python -m lmpipe.regenerate`), and trained by `dvc repro`
through pretraining, the export and fine-tuning, with no other file of the project touched by hand."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.project import ROOT, changed_deps, copy_project, dvc, sh, stages_ran

FILES = {
    "models/specs/objectives/reverse.py": '''
        """A toy objective: predict a row's first `keep` tokens reversed, from the row."""

        from __future__ import annotations

        from dataclasses import dataclass, field

        from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register


        @dataclass(frozen=True)
        class ReverseParams(ObjectiveParams):
            keep: int = field(default=4, metadata={"ge": 1, "description": "tokens to reverse"})


        class Reverse(ObjectiveSpec):
            name, kind, Params = "reverse", "sequence", ReverseParams
            implementation = "models.objectives.reverse"

            def widths(self, seq_len: int, params: ReverseParams) -> tuple[int, int, float]:
                return seq_len, params.keep, params.keep


        OBJECTIVE = register(Reverse())
    ''',
    "models/objectives/reverse.py": '''
        """What the toy objective computes."""

        from __future__ import annotations

        import torch
        from torch import Tensor

        from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
        from models.pair import Pair
        from models.specs.objectives.reverse import ReverseParams


        class Reverse(ObjectiveImplementation):
            def pair(
                self,
                rows: Tensor,
                params: ReverseParams,
                generator: torch.Generator,
                vocab_size: int,
                pieces: Pieces = NO_PIECES,
            ) -> Pair:
                return Pair(rows, rows[:, : params.keep].flip(1))


        IMPLEMENTATION = Reverse()
    ''',
    "models/specs/architectures/mean_decoder.py": '''
        """A toy architecture: GPT's decoder, fine-tuned on the mean of its states."""

        from __future__ import annotations

        from models.specs.architectures.base import register
        from models.specs.architectures.decoder import DecoderSpec


        class MeanDecoderSpec(DecoderSpec):
            name, poolings = "mean_decoder", ("mean",)
            finetune_lm_loss = False
            implementation = "models.architectures.mean_decoder"


        ARCHITECTURE = register(MeanDecoderSpec())
    ''',
    "models/architectures/mean_decoder.py": '''
        """What the toy architecture computes."""

        from __future__ import annotations

        from torch import Tensor

        from models.architectures.base import implemented
        from models.architectures.decoder import Decoder
        from models.architectures.encoder import pooled_states
        from models.specs.architectures.mean_decoder import MeanDecoderSpec
        from models.transformer import Transformer


        class MeanDecoder(MeanDecoderSpec, Decoder):
            def pooled(self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
                return pooled_states(model.decode(ids, pad_mask), pad_mask, "mean")


        ARCHITECTURE = implemented(MeanDecoder())
    ''',
}
REGISTRY_LINES = {
    "models/specs/objectives/__init__.py": "from models.specs.objectives import reverse as reverse\n",
    "models/specs/architectures/__init__.py": (
        "from models.specs.architectures import mean_decoder as mean_decoder\n"
    ),
}


def add_line(path: Path, line: str) -> None:
    """The registry's line, last among its own (before `# isort: on`)."""
    text = path.read_text()
    path.write_text(text.replace("# isort: on\n", line + "# isort: on\n"))


@pytest.mark.slow
def test_a_new_objective_and_architecture_are_their_modules_and_a_line_each(
    reproduced_template: Path, tmp_path: Path
) -> None:
    project = copy_project(reproduced_template, tmp_path / "project")  # its data stages already ran
    (project / "docs").mkdir()
    shutil.copy(ROOT / "docs/params.md", project / "docs/params.md")
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "reproduced, and the params reference")
    for name, source in FILES.items():
        (project / name).write_text(textwrap.dedent(source).lstrip())
    for name, line in REGISTRY_LINES.items():
        add_line(project / name, line)
    sh(project, "python", "-m", "lmpipe.regenerate")

    changed = sh(project, "git", "status", "--porcelain").stdout.splitlines()
    assert sorted(line[3:] for line in changed) == sorted(
        [*FILES, *REGISTRY_LINES, "dvc.yaml", "params.yaml", "docs/params.md"]
    )
    params = yaml.safe_load((project / "params.yaml").read_text())
    assert params["objectives"]["reverse"] == {"keep": 4}
    code_stage = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]["code"]
    assert "models/objectives/reverse.py" in code_stage["deps"]  # the toy model's own code
    # a decoder reads the row and the reversed tokens: 4 more than the row
    # rotary positions: no transformers class has them, so the export is remote code, the toy's in it
    toy = {
        "arch": "mean_decoder",
        "objective": "reverse",
        "preset": "tiny",
        "max_len": 160,
        "positions": "rope",
    }
    (encoder,) = params["models"]
    params["models"]["toy"] = toy
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ran = stages_ran(dvc(project, "repro", "export@toy", "finetune@toy"))
    assert sorted(ran) == ["code", "export@toy", "finetune@toy", "pretrain@toy"], ran
    config = json.loads((project / "checkpoints/toy/hf/config.json").read_text())
    assert config["lmpipe"]["arch"] == "mean_decoder"
    assert (
        "class MeanDecoder(MeanDecoderSpec, Decoder)"
        in (project / "checkpoints/toy/hf/modeling_lmpipe.py").read_text()
    )
    summary = json.loads((project / "data/finetune/toy/pretrained/stsb/summary.json").read_text())
    assert (summary["arch"], summary["objective"]) == ("mean_decoder", "reverse")

    # each model's own code: an edit to one objective or architecture re-runs only its models
    stale: set[str] = set()
    for edited, models_of_it in (
        ("models/objectives/reverse.py", {"pretrain@toy"}),
        ("models/objectives/mlm.py", {f"pretrain@{encoder}"}),
        ("models/architectures/mean_decoder.py", {"pretrain@toy", "finetune@toy"}),
    ):
        with (project / edited).open("a") as source:
            source.write("# edited\n")
        assert stages_ran(dvc(project, "repro", "--single-item", "code")) == ["code"]
        stale |= models_of_it
        assert {stage for stage, deps in changed_deps(project).items() if "code.yaml" in deps} == stale
