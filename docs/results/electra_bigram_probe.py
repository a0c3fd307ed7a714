"""How far local context alone tells a unigram-sampled replacement from the original: a bigram model
counted on the first `--train-tokens` training tokens scores each position of 200,000 validation
tokens, 15 % of them replaced by unigram samples, by -log P(x_t | x_t-1) - log P(x_t+1 | x_t)
+ log P(x_t+1) (both neighbours, interpolated with the unigram); the ROC AUC of that score against
"replaced", and of the unigram surprisal alone. The research log (2026-12) says what it found.

    python -m docs.results.electra_bigram_probe --tokens data/tokens --train-tokens 2000000"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=Path, required=True)
    parser.add_argument("--train-tokens", type=int, default=2_000_000)
    args = parser.parse_args()
    meta = json.loads((args.tokens / "meta.json").read_text())
    vocab = meta["vocab_size"]
    train = np.memmap(args.tokens / "train.bin", dtype=meta["dtype"], mode="r")[: args.train_tokens]
    val = np.memmap(args.tokens / "val.bin", dtype=meta["dtype"], mode="r")[:200_000]
    train, val = np.asarray(train).astype(np.int64), np.asarray(val).astype(np.int64)
    counts = np.bincount(train, minlength=vocab)
    unigram = (counts + 0.5) / (counts + 0.5).sum()
    pairs, pair_counts = np.unique(train[:-1] * vocab + train[1:], return_counts=True)

    def log_bigram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        keys = a * vocab + b
        at = np.clip(np.searchsorted(pairs, keys), 0, len(pairs) - 1)
        seen = np.where(pairs[at] == keys, pair_counts[at], 0)
        weight = counts[a] / (counts[a] + 5.0)  # trust the pair's count as its first token is seen
        return np.log(weight * seen / np.maximum(counts[a], 1) + (1 - weight) * unigram[b])

    rng = np.random.default_rng(0)
    fake = val.copy()
    selected = rng.random(len(fake)) < 0.15
    fake[selected] = rng.choice(vocab, size=int(selected.sum()), p=unigram)
    inner = np.arange(1, len(fake) - 1)
    replaced = (fake != val)[inner]
    score = -log_bigram(fake[inner - 1], fake[inner]) - log_bigram(fake[inner], fake[inner + 1])
    score += np.log(unigram[fake[inner + 1]])
    surprisal = -np.log(unigram[fake[inner]])
    print(
        json.dumps(
            {
                "train_tokens": args.train_tokens,
                "replaced": float(replaced.mean()),
                "bigram_auc": round(float(roc_auc_score(replaced, score)), 3),
                "unigram_surprisal_auc": round(float(roc_auc_score(replaced, surprisal)), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
