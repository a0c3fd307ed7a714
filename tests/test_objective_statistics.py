"""The objectives' noise against their references over thousands of rows, within sampling error
(4 standard errors): BERT's 80/10/10 and whole-word masking beside transformers'
DataCollatorForLanguageModeling on the same rows; T5's span corruption against its stated arithmetic;
BART's Poisson(3) infilling beside fairseq's span sampler and SpanBERT's geometric spans beside
SpanBERT's masking loop, each transcribed here from the papers' code (neither installs from pip)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmpipe.params.pretrain import objectives_params, section_params
from models import implementations
from models.objectives.bart import poisson_span_lengths
from models.objectives.base import batch_generator
from models.objectives.mlm import mask_tokens
from models.objectives.spanbert import geometric_lengths, mask_spans
from models.special import SPECIAL
from models.specs.objectives import OBJECTIVES
from models.specs.objectives.noise import noise_count

VOCAB = 1000


def rows(n: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(SPECIAL.n_special, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


def agree(ours: float, theirs: float, error: float, k: float = 4.0) -> bool:
    return abs(ours - theirs) <= k * error


def shares(
    original: torch.Tensor, inputs: torch.Tensor, selected: torch.Tensor
) -> dict[str, tuple[float, int]]:
    """The selected share of the tokens, and [MASK], random and kept among the selected: (share, n)."""
    picked = inputs[selected]
    kept = picked == original[selected]
    masked = picked == SPECIAL.mask
    n = int(selected.sum())
    return {
        "selected": (float(selected.float().mean()), selected.numel()),
        "mask": (float(masked.float().mean()), n),
        "random": (float((~masked & ~kept).float().mean()), n),
        "kept": (float(kept.float().mean()), n),
    }


def tokenizer(transformers):
    """A fast tokenizer over the test's ids (t0 … t999) with BERT's [MASK] and [UNK] at ours: what
    transformers' collators read the mask id and the vocabulary's size from."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"t{i}": i for i in range(VOCAB)} | {"[MASK]": SPECIAL.mask, "[UNK]": SPECIAL.unk}
    vocab.pop(f"t{SPECIAL.mask}"), vocab.pop(f"t{SPECIAL.unk}")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")),
        mask_token="[MASK]",
        unk_token="[UNK]",
    )


def test_bert_masking_is_the_stated_split_and_transformers_collators() -> None:
    """15 % of the tokens selected, each independently; of those 80 % [MASK], 10 % a random token,
    10 % kept (a random token equal to the original counts as kept), as BERT states and transformers'
    collator draws it, on the same 10,000 rows of 128 tokens."""
    transformers = pytest.importorskip("transformers", reason="transformers, a dependency: pip install -e .")
    collator = transformers.DataCollatorForLanguageModeling(
        tokenizer(transformers), mlm_probability=0.15, seed=1
    )
    tokens = rows(10_000, 128)
    ours = mask_tokens(tokens, torch.Generator().manual_seed(0), VOCAB)
    theirs, labels = collator.torch_mask_tokens(tokens.clone(), special_tokens_mask=torch.zeros_like(tokens))
    # a random draw equal to the original is kept: ours draws from the 893 ordinary ids, transformers'
    # from all 1,000 (its specials too)
    stated = {"selected": 0.15, "mask": 0.8, "random": 0.1 * (1 - 1 / (VOCAB - SPECIAL.n_special))}
    stated["kept"] = 1 - stated["mask"] - stated["random"]
    for name, ((mine, n), (other, m)) in zip(
        stated,
        zip(
            shares(tokens, ours.input_ids, ours.selected).values(),
            shares(tokens, theirs, labels != -100).values(),
            strict=True,
        ),
        strict=True,
    ):
        p = stated[name]
        assert agree(mine, p, math.sqrt(p * (1 - p) / n)), (name, mine, p)
        assert agree(mine, other, math.sqrt(p * (1 - p) * (1 / n + 1 / m))), (name, mine, other)


def test_t5_span_corruption_is_its_stated_arithmetic() -> None:
    """T5's span corruption at noise density 0.15 and mean span length 3: 141 raw tokens give 128
    inputs and 29 targets, 21 noise tokens in 7 spans (mean length exactly 3), the spans numbered by
    sentinels from <extra_id_0> in order in both, each noise span's tokens after its sentinel."""
    objective = OBJECTIVES["span"]
    args = section_params(objectives_params(), "span")
    raw = objective.row_length(128, args)
    assert raw == 141
    tokens = rows(10_000, raw, 1)
    pair = implementations.objective("span").pair(tokens, args, batch_generator(0, 0), VOCAB)
    assert pair.inputs.shape == (10_000, 128) and pair.targets.shape == (10_000, 29)
    sentinels = [SPECIAL.sentinel(i) for i in range(7)]
    is_sentinel = (pair.inputs >= SPECIAL.first_sentinel) & (pair.inputs < SPECIAL.n_special)
    assert (is_sentinel.sum(1) == 7).all()
    assert (pair.inputs[is_sentinel].reshape(-1, 7) == torch.tensor(sentinels)).all()
    targets = pair.targets
    target_sentinels = (targets >= SPECIAL.first_sentinel) & (targets < SPECIAL.n_special)
    assert (targets[target_sentinels].reshape(-1, 7) == torch.tensor(sentinels)).all()
    assert (targets[:, 0] == sentinels[0]).all() and (targets[:, -1] == SPECIAL.eos).all()
    noise = ~target_sentinels & (targets != SPECIAL.eos)
    assert noise_count(raw, 0.15) == 21 and (noise.sum(1) == 21).all()
    # the spans' lengths vary (a random composition of 21 into 7), their mean is 3
    lengths = torch.diff(target_sentinels.nonzero()[:, 1].reshape(-1, 7), dim=1) - 1
    assert lengths.float().std() > 1.0 and lengths.min() >= 1


def fairseq_poisson_lengths(num_to_mask: int, lam: float, rng: np.random.Generator) -> np.ndarray:
    """fairseq's `DenoisingDataset.add_whole_word_mask` span lengths (span-poisson): Poisson(λ) draws,
    drawn again until they cover the budget, trimmed to it."""
    lengths = rng.poisson(lam, num_to_mask)
    cum_length = np.cumsum(lengths)
    while cum_length[-1] < num_to_mask:
        lengths = np.concatenate([lengths, rng.poisson(lam, num_to_mask)])
        cum_length = np.cumsum(lengths)
    i = 0
    while cum_length[i] < num_to_mask:
        i += 1
    lengths[i] = num_to_mask - (0 if i == 0 else cum_length[i - 1])
    return lengths[: i + 1]


def test_text_infilling_spans_are_fairseqs_poisson_spans() -> None:
    """BART's text infilling covers 30 % of the row with Poisson(3) spans: the number of spans, the
    mean length of the uncut ones and the share of zero-length spans (insertions) as fairseq's
    sampler gives them, over 10,000 rows of 127 tokens. (Stopping at the budget leaves the uncut
    spans 5.5 % zeros, not Poisson(3)'s e^-3 = 5.0 %, in both.)"""
    budget = noise_count(127, 0.3)
    generator, rng = torch.Generator().manual_seed(0), np.random.default_rng(0)
    ours = [poisson_span_lengths(budget, budget, 3.0, generator).numpy() for _ in range(10_000)]
    theirs = [fairseq_poisson_lengths(budget, 3.0, rng) for _ in range(10_000)]
    assert all(int(lengths.sum()) == budget for lengths in ours)
    for measure in (
        len,
        lambda lengths: float(np.mean(lengths[:-1])),
        lambda lengths: float(np.mean(lengths == 0)),
    ):
        a, b = np.array([measure(x) for x in ours]), np.array([measure(x) for x in theirs])
        assert agree(a.mean(), b.mean(), math.sqrt(a.var() / len(a) + b.var() / len(b))), (a.mean(), b.mean())


def spanbert_spans(length: int, rng: np.random.Generator) -> list[int]:
    """SpanBERT's `PairWithSpanMaskingScheme.mask` (facebookresearch/SpanBERT), every token a word:
    a span's length in words from the clipped geometric, an anchor anywhere not yet masked, words
    added until the span's length or the budget (ceil of 15 %); overlapping spans are not stopped.
    The spans' lengths in tokens."""
    lens, weights = list(range(1, 11)), geometric_lengths(0.2, 10)
    mask_num = math.ceil(length * 0.15)
    mask: set[int] = set()
    spans = []
    while len(mask) < mask_num:
        span_len = int(rng.choice(lens, p=weights))
        anchor = int(rng.integers(length))
        if anchor in mask:
            continue
        added = 0
        for i in range(anchor, min(anchor + span_len, length)):
            if len(mask) >= mask_num:
                break
            mask.add(i)
            added += 1
        spans.append(added)
    return spans


def test_spanbert_spans_are_spanberts_geometric_spans() -> None:
    """SpanBERT's spans: lengths in words from a geometric distribution (p 0.2) clipped at 10, mean
    3.8, until 15 % of the row is masked, a span running over words already masked; their mean
    length as SpanBERT's own loop gives it, over 2,000 rows of 512 one-token words (a span that later
    ones cover whole is not seen in ours, so the count of spans is not compared)."""
    tokens, table = rows(2_000, 512, 2), torch.ones(VOCAB, dtype=torch.bool)
    lengths = geometric_lengths(0.2, 10)
    masked = mask_spans(tokens, table, torch.Generator().manual_seed(0), VOCAB, 0.15, lengths, 0.8, 0.1)
    starts = torch.stack([masked.span_left, masked.span_right], 1).unique(dim=0)
    ours = (starts[:, 1] - starts[:, 0] - 1).numpy()
    rng = np.random.default_rng(0)
    theirs = np.array([n for _ in range(2_000) for n in spanbert_spans(512, rng)])
    assert sum(p * k for k, p in enumerate(lengths, 1)) == pytest.approx(3.8, abs=0.01)
    error = math.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
    assert agree(ours.mean(), theirs.mean(), error), (ours.mean(), theirs.mean())
    # each row's budget met: SpanBERT's ceil of 15 % (77 of 512), the spans overlapping where they meet
    assert (masked.selected.sum(1) == math.ceil(512 * 0.15)).all()


def test_whole_word_masking_masks_words_as_transformers_collator_does() -> None:
    """Whole-word masking (`mask_unit: word`) on 2,000 rows of 128 pieces in words of 1-4 pieces,
    beside transformers' DataCollatorForLanguageModeling(whole_word_mask=True) on the same rows, its
    words read from offsets with a gap before each word: both select 15 % of the pieces, every piece of
    a selected word but where ours cuts its row's last word at the budget, and pick words of every
    length alike (the selected words' mean length is the text's). Ours then masks, replaces or keeps
    each word whole 80/10/10 as SpanBERT does; transformers' collator masks every selected piece."""
    transformers = pytest.importorskip("transformers", reason="transformers, a dependency: pip install -e .")
    generator = np.random.default_rng(3)
    n_rows, width = 2_000, 128
    # even ids begin a word, odd ones continue it: the tokenizer's word-start table
    table = torch.zeros(VOCAB, dtype=torch.bool)
    table[SPECIAL.n_special + (SPECIAL.n_special % 2) :: 2] = True
    starts_ids = table.nonzero().squeeze(1).numpy()
    inner_ids = (~table).nonzero().squeeze(1).numpy()
    inner_ids = inner_ids[inner_ids >= SPECIAL.n_special]
    lengths = generator.choice([1, 2, 3, 4], size=(n_rows, width), p=[0.6, 0.25, 0.1, 0.05])
    begins = np.zeros((n_rows, width), dtype=bool)
    for row, row_lengths in zip(begins, lengths, strict=True):
        row[np.cumsum(row_lengths)[np.cumsum(row_lengths) < width]] = True
        row[0] = True
    ids = np.where(
        begins, generator.choice(starts_ids, begins.shape), generator.choice(inner_ids, begins.shape)
    )
    tokens = torch.from_numpy(ids)
    word_ids = np.cumsum(begins, axis=1)

    ours = mask_spans(tokens, table, torch.Generator().manual_seed(0), VOCAB, 0.15, [1.0], 0.8, 0.1)
    collator = transformers.DataCollatorForLanguageModeling(
        tokenizer(transformers), mlm_probability=0.15, whole_word_mask=True, seed=1
    )
    ends = np.cumsum(1 + begins, axis=1)  # each piece one character, a space before each word
    offsets = np.stack([ends - 1, ends], axis=-1)
    _, labels = collator.torch_mask_tokens(
        tokens.clone(), special_tokens_mask=torch.zeros_like(tokens), offset_mapping=offsets
    )
    theirs = (labels != -100).numpy()

    # each (row, word) one index: its pieces' counts are the words' lengths
    keys = np.arange(n_rows)[:, None] * (width + 1) + word_ids
    unique, index = np.unique(keys.reshape(-1), return_inverse=True)
    row_of_word, word_length = unique // (width + 1), np.bincount(index)

    def words(selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per (row, word): whether any of its pieces is selected, and whether all are."""
        any_, all_ = np.zeros(len(unique), dtype=bool), np.ones(len(unique), dtype=bool)
        np.logical_or.at(any_, index, selected.reshape(-1))
        np.logical_and.at(all_, index, selected.reshape(-1))
        return any_, all_

    # ours: each row's budget met exactly (19 of 128); transformers': 15 % of the words, so of the pieces
    assert (ours.selected.sum(1) == round(0.15 * width)).all()
    row_shares = theirs.mean(1)
    assert agree(row_shares.mean(), 0.15, row_shares.std() / math.sqrt(n_rows)), row_shares.mean()
    for name, selected, cut_at_most in (("ours", ours.selected.numpy(), 1), ("transformers", theirs, 0)):
        touched, whole = words(selected)
        cut_per_row = np.bincount(row_of_word[touched & ~whole], minlength=n_rows)
        assert cut_per_row.max() <= cut_at_most, name  # ours: the row's last word, at the budget
        picked = word_length[touched]
        error = math.sqrt(picked.var() / len(picked) + word_length.var() / len(word_length))
        assert agree(picked.mean(), word_length.mean(), error), (name, picked.mean(), word_length.mean())
