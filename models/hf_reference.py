"""Our pretraining models held by the transformers classes that implement their papers' own: ELECTRA's
discriminator and generator, for the equality test (tests/test_reference.py) and for training the
reference side by side with ours from the same weights (docs/results/electra_side_by_side.py).
Imports transformers (the `hf` extra); no stage imports this module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from models.hf import _embeddings, _encoder_layers
from models.special import SPECIAL

if TYPE_CHECKING:
    from models.config import ModelConfig
    from models.pretraining import PretrainModule


def electra_config(cfg: ModelConfig, hidden: int, heads: int, d_ff: int) -> Any:
    """transformers' ElectraConfig for a stack of ours `hidden` wide on embeddings E wide."""
    import transformers

    return transformers.ElectraConfig(
        vocab_size=cfg.vocab_size,
        embedding_size=cfg.embedding_size or cfg.d_model,
        hidden_size=hidden,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=heads,
        intermediate_size=d_ff,
        hidden_act="gelu",
        max_position_embeddings=cfg.max_len,
        type_vocab_size=1,
        layer_norm_eps=cfg.norm_eps,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout,
        pad_token_id=SPECIAL.pad,
    )


def electra_pair(module: PretrainModule, share: bool = False) -> tuple[Any, Any]:
    """transformers' ElectraForPreTraining (the discriminator) and ElectraForMaskedLM (the generator)
    holding the weights of an ELECTRA model of ours (post-LN, learned positions, no segments): both on
    the discriminator's embeddings and their LayerNorm, each with its own projection to its width, the
    generator with ELECTRA's prediction head and output bias. `share`: the generator's embeddings are
    the discriminator's module (ELECTRA's sharing, for training); else a copy of the same weights."""
    import transformers

    model, cfg, head = module.model, module.model_cfg, module.objective_head
    if cfg.norm_position != "post" or cfg.positions != "learned" or cfg.segment_embeddings:
        raise ValueError("ELECTRA's form: norm_position post, positions learned, no segment embeddings")
    if head.generator.transform is None:
        raise ValueError("ELECTRA's generator: objectives.electra.generator_head transform")
    generator, norm = head.generator, model.embedding_norm()
    width = cfg.embedding_size or cfg.d_model
    shared = _embeddings(model, model.positions.weight) | {
        "embeddings.token_type_embeddings.weight": torch.zeros(1, width),
        "embeddings.LayerNorm.weight": norm.weight,
        "embeddings.LayerNorm.bias": norm.bias,
    }
    config = electra_config(cfg, cfg.d_model, cfg.n_heads, cfg.d_ff)
    discriminator = transformers.ElectraForPreTraining(config)
    tensors = shared | _encoder_layers(model.encoder, pre_norm=False)
    if model.embed_projection is not None:
        tensors |= {f"embeddings_project.{k}": v for k, v in model.embed_projection.state_dict().items()}
    tensors = {f"electra.{key}": value for key, value in tensors.items()}
    dense, _, prediction = head.detector
    tensors |= {f"discriminator_predictions.dense.{k}": v for k, v in dense.state_dict().items()}
    tensors |= {
        f"discriminator_predictions.dense_prediction.{k}": v for k, v in prediction.state_dict().items()
    }
    missing, unexpected = discriminator.load_state_dict(tensors, strict=False)
    assert not missing and not unexpected, (missing, unexpected)

    gen = generator.cfg
    masked_lm = transformers.ElectraForMaskedLM(electra_config(cfg, gen.d_model, gen.n_heads, gen.d_ff))
    tensors = shared | _encoder_layers(generator.stack, pre_norm=False)
    tensors |= {f"embeddings_project.{k}": v for k, v in generator.projection.state_dict().items()}
    tensors = {f"electra.{key}": value for key, value in tensors.items()}
    dense, _, layer_norm = generator.transform
    tensors |= {f"generator_predictions.dense.{k}": v for k, v in dense.state_dict().items()}
    tensors |= {f"generator_predictions.LayerNorm.{k}": v for k, v in layer_norm.state_dict().items()}
    tensors["generator_lm_head.bias"] = generator.bias
    missing, unexpected = masked_lm.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"generator_lm_head.weight"}, (missing, unexpected)
    if share:
        masked_lm.electra.embeddings = discriminator.electra.embeddings
    masked_lm.tie_weights()
    return discriminator, masked_lm
