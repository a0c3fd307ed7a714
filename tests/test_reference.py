"""Each system against the transformers class that implements its pretraining model: the same weights
in both, the same batch, and the logits and every loss term equal to float32 tolerance. Ours is
configured to the reference's form where ours differs by default (docs/models.md: what remains).
Needs the `hf` extra (transformers), which `make test` installs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models import implementations
from models.config import ModelConfig
from models.hf import _embeddings, _encoder_layers, _gpt2, lm_transform_tensors
from models.hf_reference import electra_pair
from models.objectives.base import batch_generator
from models.objectives.electra import replace_tokens
from models.pretraining import PretrainModule
from models.special import SPECIAL
from models.specs.objectives import ObjectiveParams
from models.transformer import Transformer, segment_ids

transformers = pytest.importorskip("transformers", reason="transformers, a dependency: pip install -e .")

VOCAB, LENGTH, ROWS = 300, 32, 6
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def segment_pairs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of [CLS] A [SEP] B [SEP] with A and B of different lengths, and next-sentence labels."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(SPECIAL.n_special, VOCAB, (ROWS, LENGTH), generator=generator)
    ids[:, 0] = SPECIAL.cls
    for row, split in enumerate(torch.randint(6, LENGTH - 6, (ROWS,), generator=generator).tolist()):
        ids[row, split] = SPECIAL.sep
    ids[:, -1] = SPECIAL.sep
    return ids, torch.randint(0, 2, (ROWS,), generator=generator)


def post_ln_encoder(**changes) -> ModelConfig:
    """A small encoder in BERT's form (post-LN, its LayerNorm ε), with `changes`."""
    base = dict(arch="encoder", vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=LENGTH)
    return ModelConfig(**(base | {"norm_position": "post", "norm_eps": 1e-12} | changes))


def pretrain_module(cfg: ModelConfig, train) -> PretrainModule:
    """Ours, seeded, in evaluation mode, every weight drawn wider than the initialisation: at its std
    0.02 the attention is near uniform whatever its logits, and biases and norms start at 0 and 1,
    where a misplaced one would not show."""
    torch.manual_seed(0)
    module = PretrainModule(cfg, train).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(1.0 if parameter.ndim == 1 else 0.0, 0.2)
    return module


def masked_pairs(module: PretrainModule, train, ids: torch.Tensor, pair_labels: torch.Tensor):
    """The masked LM's batch of segment pairs with their NSP or SOP labels, and its targets in the
    reference's form: the original token where masked, -100 elsewhere."""
    pair = implementations.objective("mlm").pair(ids, train.objective_params, batch_generator(0, 0), VOCAB)
    batch = module.model.arch.batch(pair) | {"pair_labels": pair_labels}
    labels = torch.full_like(ids, -100).reshape(-1)
    labels[batch["positions"]] = batch["labels"]
    return batch, labels.reshape(ids.shape)


def bert_for_pretraining(module: PretrainModule) -> torch.nn.Module:
    """transformers' BertForPreTraining holding our encoder's weights, its pooler and NSP classifier
    our pair head's."""
    model, cfg = module.model, module.model_cfg
    config = transformers.BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff,
        hidden_act="gelu",
        max_position_embeddings=cfg.max_len,
        type_vocab_size=2,
        layer_norm_eps=cfg.norm_eps,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=SPECIAL.pad,
    )
    reference = transformers.BertForPreTraining(config).eval()
    state = model.state_dict()
    tensors = _embeddings(model, state["positions.weight"]) | _encoder_layers(model.encoder, pre_norm=False)
    tensors["embeddings.token_type_embeddings.weight"] = state["segments.weight"]
    tensors["embeddings.LayerNorm.weight"] = state["encoder.edge_norm.weight"]
    tensors["embeddings.LayerNorm.bias"] = state["encoder.edge_norm.bias"]
    tensors = {f"bert.{key}": value for key, value in tensors.items()}
    tensors |= lm_transform_tensors(model, "cls.predictions")
    pooler, _, classifier = module.pair_head
    tensors |= {"bert.pooler.dense.weight": pooler.weight, "bert.pooler.dense.bias": pooler.bias}
    tensors |= {
        "cls.seq_relationship.weight": classifier.weight,
        "cls.seq_relationship.bias": classifier.bias,
    }
    missing, unexpected = reference.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias",
    }
    reference.tie_weights()
    return reference


def test_bert_computes_what_bert_for_pretraining_does() -> None:
    """BERT's masked LM with next-sentence prediction on segment pairs: post-LN blocks, segment
    embeddings, the prediction head's transform and bias, the pooler and the NSP classifier."""
    cfg = post_ln_encoder(segment_embeddings=True, lm_head="transform")
    objectives = objectives_params({"mlm": {"pair_loss": "nsp"}})
    params = PretrainParams(seq_len=LENGTH, batch_size=ROWS, input_format="segment_pair")
    train = train_config("encoder", "mlm", params, objectives, 0)
    module = pretrain_module(cfg, train)
    reference = bert_for_pretraining(module)

    ids, next_sentence = segment_pairs()
    batch, labels = masked_pairs(module, train, ids, next_sentence)
    with torch.no_grad():
        ours = module.terms(batch)
        hidden = module.model.encode(batch["input_ids"])
        theirs = reference(
            input_ids=batch["input_ids"],
            token_type_ids=segment_ids(batch["input_ids"]),
            labels=labels,
            next_sentence_label=next_sentence,
        )
        logits = module.model.lm_logits(hidden)
        pair_logits = module.pair_head(hidden[:, 0])

    torch.testing.assert_close(logits, theirs.prediction_logits, **TOLERANCE)
    torch.testing.assert_close(pair_logits, theirs.seq_relationship_logits, **TOLERANCE)
    masked_lm = F.cross_entropy(theirs.prediction_logits.reshape(-1, VOCAB), labels.reshape(-1))
    next_sentence_loss = F.cross_entropy(theirs.seq_relationship_logits, next_sentence)
    torch.testing.assert_close(ours.loss, masked_lm, **TOLERANCE)
    torch.testing.assert_close(ours.extra["nsp"][0], next_sentence_loss, **TOLERANCE)
    torch.testing.assert_close(ours.total(), theirs.loss, **TOLERANCE)


def albert_for_pretraining(module: PretrainModule) -> torch.nn.Module:
    """transformers' AlbertForPreTraining holding ours: one shared layer, the factorized embeddings
    normalised at E and projected, the pooler and the sentence-order classifier our pair head's."""
    model, cfg = module.model, module.model_cfg
    config = transformers.AlbertConfig(
        vocab_size=cfg.vocab_size,
        embedding_size=cfg.embedding_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_hidden_groups=1,
        inner_group_num=1,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff,
        hidden_act="gelu",  # ALBERT's own is gelu_new, the tanh approximation
        max_position_embeddings=cfg.max_len,
        type_vocab_size=2,
        layer_norm_eps=cfg.norm_eps,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0,
        pad_token_id=SPECIAL.pad,
    )
    reference = transformers.AlbertForPreTraining(config).eval()
    state = model.state_dict()
    embeddings = {
        "word_embeddings": "embed",
        "position_embeddings": "positions",
        "token_type_embeddings": "segments",
    }
    tensors = {
        f"albert.embeddings.{theirs}.weight": state[f"{ours}.weight"] for theirs, ours in embeddings.items()
    }
    layer = "albert.encoder.albert_layer_groups.0.albert_layers.0"
    for kind in ("weight", "bias"):
        tensors[f"albert.embeddings.LayerNorm.{kind}"] = state[f"embed_norm.{kind}"]
        tensors[f"albert.encoder.embedding_hidden_mapping_in.{kind}"] = state[f"embed_projection.{kind}"]
        parts = state[f"encoder.blocks.0.self_attn.qkv.{kind}"].chunk(3)
        tensors |= {
            f"{layer}.attention.{name}.{kind}": w
            for name, w in zip(("query", "key", "value"), parts, strict=True)
        }
        ours = {
            "attention.dense": "self_attn.out",
            "attention.LayerNorm": "norm1",
            "ffn": "mlp.up",
            "ffn_output": "mlp.down",
            "full_layer_layer_norm": "norm2",
        }
        tensors |= {
            f"{layer}.{theirs}.{kind}": state[f"encoder.blocks.0.{name}.{kind}"]
            for theirs, name in ours.items()
        }
        tensors[f"predictions.dense.{kind}"] = module.model.lm_transform[0].state_dict()[kind]
        tensors[f"predictions.LayerNorm.{kind}"] = module.model.lm_transform[2].state_dict()[kind]
        tensors[f"albert.pooler.{kind}"] = module.pair_head[0].state_dict()[kind]
        tensors[f"sop_classifier.classifier.{kind}"] = module.pair_head[2].state_dict()[kind]
    tensors["predictions.bias"] = state["lm_bias"]
    missing, unexpected = reference.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"predictions.decoder.weight", "predictions.decoder.bias"}
    reference.tie_weights()
    return reference


def test_albert_computes_what_albert_for_pretraining_does() -> None:
    """ALBERT's masked LM with sentence-order prediction: factorized embeddings (E 32 of H 64), every
    layer one shared block, post-LN, its prediction head at E, the pooler and the SOP classifier."""
    cfg = post_ln_encoder(
        n_layers=3, segment_embeddings=True, embedding_size=32, share_layers="all", lm_head="transform"
    )
    objectives = objectives_params({"mlm": {"pair_loss": "sop"}})
    params = PretrainParams(seq_len=LENGTH, batch_size=ROWS, input_format="segment_pair")
    train = train_config("encoder", "mlm", params, objectives, 0)
    module = pretrain_module(cfg, train)
    reference = albert_for_pretraining(module)

    ids, sentence_order = segment_pairs(4)
    batch, labels = masked_pairs(module, train, ids, sentence_order)
    with torch.no_grad():
        ours = module.terms(batch)
        hidden = module.model.encode(batch["input_ids"])
        theirs = reference(
            input_ids=batch["input_ids"],
            token_type_ids=segment_ids(batch["input_ids"]),
            labels=labels,
            sentence_order_label=sentence_order,
        )
    torch.testing.assert_close(module.model.lm_logits(hidden), theirs.prediction_logits, **TOLERANCE)
    torch.testing.assert_close(module.pair_head(hidden[:, 0]), theirs.sop_logits, **TOLERANCE)
    torch.testing.assert_close(
        ours.extra["sop"][0], F.cross_entropy(theirs.sop_logits, sentence_order), **TOLERANCE
    )
    torch.testing.assert_close(ours.total(), theirs.loss, **TOLERANCE)


def test_gpt_computes_what_gpt2_lm_head_model_does() -> None:
    """The decoder's left-to-right LM: pre-LN blocks, learned positions, the tied head; its weights
    through the export's GPT-2 layout, the loss transformers computes from the labels it shifts."""
    cfg = ModelConfig(
        arch="decoder", vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=LENGTH
    )
    train = train_config(
        "decoder", "clm", PretrainParams(seq_len=LENGTH - 1, batch_size=ROWS), objectives_params(), 0
    )
    module = pretrain_module(cfg, train)
    layout = _gpt2(module.model)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(**layout.config)).eval()
    missing, unexpected = reference.load_state_dict(layout.tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    reference.tie_weights()

    rows = torch.randint(SPECIAL.n_special, VOCAB, (ROWS, LENGTH), generator=torch.Generator().manual_seed(1))
    batch = module.model.arch.batch(
        implementations.objective("clm").pair(rows, ObjectiveParams(), batch_generator(0, 0), VOCAB)
    )
    with torch.no_grad():
        ours = module.terms(batch)
        logits = module.model.lm_logits(module.model.decode(batch["input_ids"]))
        theirs = reference(input_ids=rows, labels=rows)
    torch.testing.assert_close(logits, theirs.logits[:, :-1], **TOLERANCE)
    torch.testing.assert_close(ours.loss, theirs.loss, **TOLERANCE)


def t5_tensors(model: Transformer, scale: float) -> dict[str, torch.Tensor]:
    """Our encoder-decoder in T5's names. T5 does not scale its attention logits (its initialisation
    does): our queries times `scale`, 1/√(head size), are its queries."""
    state, cfg = model.state_dict(), model.cfg
    tensors = {"shared.weight": state["embed.weight"], "lm_head.weight": state["embed.weight"]}
    for stack, layers in (("encoder", cfg.n_layers), ("decoder", cfg.decoder_layers)):
        tensors[f"{stack}.final_layer_norm.weight"] = state[f"{stack}.edge_norm.weight"]
        bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        tensors[bias] = state[f"{stack}.position_bias.table.weight"]
        for i in range(layers):
            ours, theirs = f"{stack}.blocks.{i}", f"{stack}.block.{i}.layer"
            q, k, v = state[f"{ours}.self_attn.qkv.weight"].chunk(3)
            attention = {"q": q * scale, "k": k, "v": v, "o": state[f"{ours}.self_attn.out.weight"]}
            tensors |= {f"{theirs}.0.SelfAttention.{name}.weight": w for name, w in attention.items()}
            tensors[f"{theirs}.0.layer_norm.weight"] = state[f"{ours}.norm1.weight"]
            mlp = 1
            if stack == "decoder":
                k, v = state[f"{ours}.cross_attn.kv.weight"].chunk(2)
                cross = {"q": state[f"{ours}.cross_attn.q.weight"] * scale, "k": k, "v": v}
                cross["o"] = state[f"{ours}.cross_attn.out.weight"]
                tensors |= {f"{theirs}.1.EncDecAttention.{name}.weight": w for name, w in cross.items()}
                tensors[f"{theirs}.1.layer_norm.weight"] = state[f"{ours}.norm_cross.weight"]
                mlp = 2
            tensors[f"{theirs}.{mlp}.DenseReluDense.wi.weight"] = state[f"{ours}.mlp.up.weight"]
            tensors[f"{theirs}.{mlp}.DenseReluDense.wo.weight"] = state[f"{ours}.mlp.down.weight"]
            tensors[f"{theirs}.{mlp}.layer_norm.weight"] = state[f"{ours}.norm2.weight"]
    return tensors


@pytest.mark.parametrize("scale", [None, 1.0], ids=["mapped", "unscaled"])
def test_t5_computes_what_t5_for_conditional_generation_does(scale: float | None) -> None:
    """T5's span corruption on the encoder-decoder: pre-LN blocks with RMSNorm and no biases, its
    relative position bias (one table per stack, 32 buckets to distance 128), cross-attention, the
    decoder reading <s> and the targets shifted right. Unscaled queries (T5's form taken for ours)
    must not agree: the comparison sees the attention's logits."""
    cfg = ModelConfig(
        arch="encoder_decoder",
        vocab_size=VOCAB,
        d_model=64,
        n_layers=2,
        n_decoder_layers=3,
        n_heads=4,
        d_ff=128,
        max_len=64,
        norm="rmsnorm",
        bias=False,
        positions="relative",
        norm_eps=1e-6,
    )
    params = PretrainParams(seq_len=LENGTH, batch_size=ROWS)
    train = train_config("encoder_decoder", "span", params, objectives_params(), 0)
    module = pretrain_module(cfg, train)
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=cfg.d_model,
        d_kv=cfg.head_dim,
        d_ff=cfg.d_ff,
        num_layers=cfg.n_layers,
        num_decoder_layers=cfg.decoder_layers,
        num_heads=cfg.n_heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        layer_norm_epsilon=cfg.norm_eps,
        feed_forward_proj="gelu",
        tie_word_embeddings=False,  # tied, T5 scales the decoder's states by d_model^-0.5 first; ours not
        pad_token_id=SPECIAL.pad,
        eos_token_id=SPECIAL.eos,
        decoder_start_token_id=SPECIAL.bos,
    )
    reference = transformers.T5ForConditionalGeneration(config).eval()
    tensors = t5_tensors(module.model, cfg.head_dim**-0.5 if scale is None else scale)
    missing, unexpected = reference.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) == {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    reference.tie_weights()  # the stacks' embeddings are `shared`

    generator = torch.Generator().manual_seed(2)
    rows = torch.randint(SPECIAL.n_special, VOCAB, (ROWS, train.row_length()), generator=generator)
    batch = module.model.arch.batch(
        implementations.objective("span").pair(rows, train.objective_params, batch_generator(0, 0), VOCAB)
    )
    with torch.no_grad():
        ours = module.terms(batch)
        logits = module.model.lm_logits(module.model(batch["input_ids"], decoder_ids=batch["decoder_ids"]))
        theirs = reference(
            input_ids=batch["input_ids"], decoder_input_ids=batch["decoder_ids"], labels=batch["labels"]
        )
    if scale is not None:
        assert not torch.allclose(logits, theirs.logits, **TOLERANCE)
        return
    torch.testing.assert_close(logits, theirs.logits, **TOLERANCE)
    torch.testing.assert_close(ours.loss, theirs.loss, **TOLERANCE)


def bart_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """Our post-LN encoder-decoder in BART's names: BART numbers positions from 2 and has a table per
    stack, ours one table for both; its embedding LayerNorms are our stacks' edge norms."""
    state, cfg = model.state_dict(), model.cfg
    positions = torch.cat([torch.zeros(2, cfg.d_model), state["positions.weight"]])
    tensors = {
        "model.shared.weight": state["embed.weight"],
        "final_logits_bias": torch.zeros(1, cfg.vocab_size),
    }
    for stack, layers in (("encoder", cfg.n_layers), ("decoder", cfg.decoder_layers)):
        tensors[f"model.{stack}.embed_positions.weight"] = positions
        for kind in ("weight", "bias"):
            tensors[f"model.{stack}.layernorm_embedding.{kind}"] = state[f"{stack}.edge_norm.{kind}"]
        for i in range(layers):
            ours, theirs = f"{stack}.blocks.{i}", f"model.{stack}.layers.{i}"
            for kind in ("weight", "bias"):
                q, k, v = state[f"{ours}.self_attn.qkv.{kind}"].chunk(3)
                attention = {
                    "q_proj": q,
                    "k_proj": k,
                    "v_proj": v,
                    "out_proj": state[f"{ours}.self_attn.out.{kind}"],
                }
                tensors |= {f"{theirs}.self_attn.{name}.{kind}": w for name, w in attention.items()}
                tensors[f"{theirs}.self_attn_layer_norm.{kind}"] = state[f"{ours}.norm1.{kind}"]
                if stack == "decoder":
                    k, v = state[f"{ours}.cross_attn.kv.{kind}"].chunk(2)
                    cross = {"q_proj": state[f"{ours}.cross_attn.q.{kind}"], "k_proj": k, "v_proj": v}
                    cross["out_proj"] = state[f"{ours}.cross_attn.out.{kind}"]
                    tensors |= {f"{theirs}.encoder_attn.{name}.{kind}": w for name, w in cross.items()}
                    tensors[f"{theirs}.encoder_attn_layer_norm.{kind}"] = state[f"{ours}.norm_cross.{kind}"]
                tensors[f"{theirs}.fc1.{kind}"] = state[f"{ours}.mlp.up.{kind}"]
                tensors[f"{theirs}.fc2.{kind}"] = state[f"{ours}.mlp.down.{kind}"]
                tensors[f"{theirs}.final_layer_norm.{kind}"] = state[f"{ours}.norm2.{kind}"]
    return tensors


def test_bart_computes_what_bart_for_conditional_generation_does() -> None:
    """BART's text infilling on a post-LN encoder-decoder with learned positions, a LayerNorm on each
    stack's embeddings and the tied head; inputs of different lengths, padded and masked."""
    cfg = ModelConfig(
        arch="encoder_decoder",
        vocab_size=VOCAB,
        d_model=64,
        n_layers=2,
        n_heads=4,
        d_ff=128,
        max_len=64,
        norm_position="post",
    )
    train = train_config(
        "encoder_decoder", "bart", PretrainParams(seq_len=LENGTH, batch_size=ROWS), objectives_params(), 0
    )
    module = pretrain_module(cfg, train)
    config = transformers.BartConfig(
        vocab_size=VOCAB,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        max_position_embeddings=cfg.max_len,
        activation_function="gelu",
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=False,
        pad_token_id=SPECIAL.pad,
        bos_token_id=SPECIAL.bos,
        eos_token_id=SPECIAL.eos,
        decoder_start_token_id=SPECIAL.bos,
    )
    reference = transformers.BartForConditionalGeneration(config).eval()
    missing, unexpected = reference.load_state_dict(bart_tensors(module.model), strict=False)
    tied = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"}
    assert not unexpected and set(missing) <= tied
    reference.tie_weights()

    rows = torch.randint(
        SPECIAL.n_special, VOCAB, (ROWS, train.row_length()), generator=torch.Generator().manual_seed(3)
    )
    batch = module.model.arch.batch(
        implementations.objective("bart").pair(rows, train.objective_params, batch_generator(0, 0), VOCAB)
    )
    assert not batch["pad_mask"].all()  # text infilling's inputs differ in length: padding compared too
    with torch.no_grad():
        ours = module.terms(batch)
        hidden = module.model(batch["input_ids"], batch["pad_mask"], decoder_ids=batch["decoder_ids"])
        theirs = reference(
            input_ids=batch["input_ids"],
            attention_mask=batch["pad_mask"].long(),
            decoder_input_ids=batch["decoder_ids"],
            labels=batch["labels"],
        )
    torch.testing.assert_close(module.model.lm_logits(hidden), theirs.logits, **TOLERANCE)
    torch.testing.assert_close(ours.loss, theirs.loss, **TOLERANCE)


@pytest.mark.parametrize("embedding_size", [None, 32], ids=["E=H", "factorized"])
def test_electra_computes_what_electra_for_pretraining_does(embedding_size: int | None) -> None:
    """ELECTRA's replaced-token detection in its own form: post-LN, the generator a quarter of the
    discriminator's width on its embeddings and their LayerNorm, ELECTRA's generator head; the
    generator's masked-LM loss, its samples (the same uniforms on the reference's logits), the
    discriminator's logits and detection loss, and their sum with λ 50."""
    cfg = post_ln_encoder(embedding_size=embedding_size)
    params = PretrainParams(seq_len=LENGTH, batch_size=ROWS)
    train = train_config("encoder", "electra", params, objectives_params(), 0)
    module = pretrain_module(cfg, train)
    # rows of four ids the generator favours: some of its samples are the original token
    few = torch.arange(SPECIAL.n_special, SPECIAL.n_special + 4)
    with torch.no_grad():
        module.objective_head.generator.bias[few] += 8.0
    discriminator, masked_lm = (model.eval() for model in electra_pair(module))

    rows = few[torch.randint(0, len(few), (ROWS, LENGTH), generator=torch.Generator().manual_seed(2))]
    pair = implementations.objective("electra").pair(
        rows, train.objective_params, batch_generator(0, 0), VOCAB
    )
    batch = module.model.arch.batch(pair)
    ids, positions, labels = batch["input_ids"], batch["positions"], batch["labels"]
    masked = torch.full_like(ids, -100).reshape(-1)
    masked[positions] = labels
    with torch.no_grad():
        ours = module.terms(batch)
        generated = masked_lm(input_ids=ids, labels=masked.reshape(ids.shape))
        logits = generated.logits.reshape(-1, VOCAB)[positions]
        fake, replaced = replace_tokens(ids, positions, labels, logits, batch["sample_uniforms"])
        detected = discriminator(input_ids=fake, labels=replaced.reshape(ids.shape))
        head = module.objective_head
        torch.testing.assert_close(head.generator(module.model, ids, None, positions), logits, **TOLERANCE)
        scores = head.detector(module.model.encode(fake)).squeeze(-1)
    assert 0 < replaced.sum() < positions.numel()  # some samples differ, some hit the original
    torch.testing.assert_close(scores, detected.logits, **TOLERANCE)
    torch.testing.assert_close(ours.loss, generated.loss, **TOLERANCE)
    torch.testing.assert_close(ours.extra["replaced"][0], detected.loss, **TOLERANCE)
    torch.testing.assert_close(ours.total(), generated.loss + 50.0 * detected.loss, **TOLERANCE)


def random_tokens(folder: Path) -> None:
    """A pack stage's output of random pieces (meta.json, train.bin, val.bin), for the side-by-side runs."""
    import json

    import numpy as np

    tokens = np.random.default_rng(0).integers(SPECIAL.n_special, VOCAB, 20_000).astype(np.uint16)
    for split in ("train", "val"):
        tokens.tofile(folder / f"{split}.bin")
    (folder / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": VOCAB}))


def test_electra_side_by_side_trains_the_reference_as_ours(tmp_path) -> None:
    """The research log's side-by-side runs (docs/results/electra_side_by_side.py): transformers'
    ELECTRA starts from our weights and, on the same batches with the same optimizer, takes the same
    steps: the two agree on every measure at the start and on the loss after three steps."""
    import csv

    from docs.results.electra_side_by_side import Recipe, run

    random_tokens(tmp_path)
    recipe = Recipe(batch_size=4, seq_len=LENGTH, warmup=2)
    run(recipe, tmp_path, steps=3, every=3, reference=True, out=tmp_path / "side.csv")
    with (tmp_path / "side.csv").open() as handle:
        rows = {(row["model"], int(row["step"])): row for row in csv.DictReader(handle)}
    for measure in ("detection_loss", "generator_accuracy", "auc", "cosine"):
        ours, theirs = float(rows["ours", 0][measure]), float(rows["transformers", 0][measure])
        assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-5), measure
    assert float(rows["ours", 3]["loss"]) == pytest.approx(float(rows["transformers", 3]["loss"]), rel=1e-4)


def test_electra_side_by_side_can_hold_the_generator_still(tmp_path) -> None:
    """`freeze_generator_at`: from that step the discriminator learns against fixed samples, the
    generator's own layers exactly as they were."""
    from docs.results.electra_side_by_side import Recipe, run

    random_tokens(tmp_path)
    recipe = Recipe(batch_size=4, seq_len=LENGTH, warmup=2, freeze_generator_at=2)
    trained = {
        steps: run(recipe, tmp_path, steps, every=10, reference=False, out=tmp_path / f"{steps}.csv")["ours"]
        for steps in (2, 4)
    }
    before, after = (trained[steps].module.objective_head for steps in (2, 4))
    for (name, held), moved in zip(
        before.generator.named_parameters(), after.generator.parameters(), strict=True
    ):
        assert torch.equal(held, moved), name
    assert not torch.equal(before.detector[-1].weight, after.detector[-1].weight)
