"""Fine-tuning heads: pooled positions, padding invariance, regression shapes."""

from __future__ import annotations

import pytest
import torch

from models.config import ModelConfig
from models.heads import SequenceHead
from models.transformer import Transformer

CFG = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=24)


def head(arch: str, num_labels: int = 3, **kwargs) -> SequenceHead:
    torch.manual_seed(0)
    return SequenceHead(Transformer(CFG.with_(arch=arch)), num_labels, dropout=0.0, **kwargs).eval()


def padded(lengths: list[int], width: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(107, 300, (len(lengths), width), generator=torch.Generator().manual_seed(seed))
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, 0), mask


@pytest.mark.parametrize(
    ("arch", "pooling"),
    [
        ("encoder", None),
        ("encoder", "mean"),
        ("decoder", None),
        ("prefix_lm", "last"),
        ("prefix_lm", "mean"),
        ("encoder_decoder", "mean_encoder"),
        ("encoder_decoder", "first_decoder"),
    ],
)
def test_padding_never_changes_the_output(arch: str, pooling: str | None) -> None:
    model = head(arch, pooling=pooling)
    ids, mask = padded([5, 9, 12])
    out = model(ids, mask)
    assert out.shape == (3, 3)
    wider_ids = torch.cat([ids, torch.zeros(3, 6, dtype=ids.dtype)], dim=1)
    wider_mask = torch.cat([mask, torch.zeros(3, 6, dtype=torch.bool)], dim=1)
    assert torch.allclose(model(wider_ids, wider_mask), out, atol=1e-5)
    junk = ids.masked_fill(~mask, 250)  # whatever sits under the padding
    assert torch.allclose(model(junk, mask), out, atol=1e-5)


def test_decoder_pools_the_last_real_token() -> None:
    model = head("decoder")
    ids, mask = padded([5, 9])
    out = model(ids, mask)
    changed = ids.clone()
    changed[0, 4] = 111  # the last real token of row 0
    assert not torch.allclose(model(changed, mask)[0], out[0])
    assert torch.allclose(model(changed, mask)[1], out[1])


def test_regression_shapes_never_broadcast() -> None:
    model = head("encoder", num_labels=1)
    ids, mask = padded([4, 7, 8, 3])
    out = model(ids, mask)
    assert out.shape == (4,)
    labels = torch.tensor([0.5, 4.0, 2.25, 1.0], dtype=torch.float64)
    loss = model.loss(out, labels)
    assert loss.shape == () and torch.isclose(loss, ((out - labels.float()) ** 2).mean())
    with pytest.raises(ValueError, match="pooling 'cls' does not fit arch 'decoder'"):
        head("decoder", pooling="cls")


@pytest.mark.parametrize(
    ("pooling", "message"),
    [
        ({"prefix_lm": "cls"}, "finetune.common.pooling: pooling 'cls' does not fit arch 'prefix_lm'"),
        ({"rnn": "last"}, "finetune.common.pooling: 'rnn' is not an architecture"),
    ],
)
def test_a_pooling_the_architecture_lacks_is_one_line(pooling: dict, message: str) -> None:
    from lmpipe.params.finetune import FinetuneSections
    from lmpipe.params.schema import parse
    from lmpipe.runtime import StageError

    def sections(pooling: dict) -> dict:
        finetune = {"tasks": {"rte": {}}, "common": {"pooling": pooling}}
        return {"glue": {"path": "glue", "tasks": ["rte"]}, "finetune": finetune}

    with pytest.raises(StageError) as error:
        parse(FinetuneSections, sections(pooling))
    assert message in str(error.value) and "\n" not in str(error.value)
    common = parse(FinetuneSections, sections({"prefix_lm": "mean"})).finetune.common
    assert (common.pooling_of("prefix_lm"), common.pooling_of("encoder")) == ("mean", "cls")
