"""Fine-tuning heads: pooled positions, padding invariance, regression shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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
        ("encoder", "max"),
        ("decoder", None),
        ("prefix_lm", "last"),
        ("prefix_lm", "mean"),
        ("prefix_lm", "max"),
        ("encoder_decoder", "mean_encoder"),
        ("encoder_decoder", "first_decoder"),
        ("encoder_decoder", "max_encoder"),
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


def test_max_pooling_takes_each_feature_over_the_real_tokens() -> None:
    model = head("encoder", pooling="max")
    ids, mask = padded([3, 7])
    states = model.backbone.encode(ids, mask)
    pooled = model.pooled(ids, mask)
    assert torch.equal(pooled[0], states[0, :3].amax(0)) and torch.equal(pooled[1], states[1, :7].amax(0))


def test_the_auxiliary_lm_loss_is_the_decoders_next_token_loss_on_the_input() -> None:
    """GPT-1's fine-tuning: the same logits as without it, and the LM loss over the real tokens only."""
    plain, aux = head("decoder"), head("decoder", lm_loss_weight=0.5)
    ids, mask = padded([5, 9])
    logits, lm_loss = aux.forward_and_lm_loss(ids, mask)
    assert torch.allclose(logits, plain(ids, mask)) and plain.forward_and_lm_loss(ids, mask)[1] is None
    states = aux.backbone.decode(ids, mask)
    expected = torch.cat(
        [
            F.cross_entropy(aux.backbone.lm_logits(states[r, : n - 1]), ids[r, 1:n], reduction="none")
            for r, n in enumerate([5, 9])
        ]
    ).mean()
    assert torch.allclose(lm_loss, expected, atol=1e-6)
    junk = ids.masked_fill(~mask, 250)  # padding is never a target
    assert torch.allclose(aux.forward_and_lm_loss(junk, mask)[1], lm_loss, atol=1e-6)
    with pytest.raises(ValueError, match="arch 'encoder' has no causal LM over its fine-tuning input"):
        head("encoder", lm_loss_weight=0.5)


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


def test_an_auxiliary_lm_loss_on_an_encoder_is_one_line() -> None:
    from lmpipe.params.finetune import FinetuneSections
    from lmpipe.params.schema import parse
    from lmpipe.runtime import StageError

    def sections(arch: str) -> dict:
        objective = {"encoder": "mlm", "decoder": "clm"}[arch]
        models = {"m": {"arch": arch, "objective": objective, "preset": "tiny"}}
        finetune = {"tasks": {"rte": {}}, "common": {"lm_loss_weight": 0.5}}
        return {"models": models, "glue": {"path": "glue", "tasks": ["rte"]}, "finetune": finetune}

    assert parse(FinetuneSections, sections("decoder")).finetune.common.lm_loss_weight == 0.5
    with pytest.raises(StageError) as error:
        parse(FinetuneSections, sections("encoder"))
    assert str(error.value).endswith(
        "finetune.common.lm_loss_weight (0.5): models.m (arch 'encoder') has no causal LM over its "
        "fine-tuning input; the auxiliary LM loss fits arch decoder or lstm"
    )
