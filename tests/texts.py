"""Text the tests make themselves: prose that passes every quality rule of `clean`."""

from __future__ import annotations

import random

WORDS = [
    "river",
    "stone",
    "garden",
    "market",
    "window",
    "letter",
    "morning",
    "village",
    "teacher",
    "summer",
    "question",
    "silver",
]


def prose(seed: int, words: int = 80) -> str:
    rng = random.Random(seed)
    sentences, current = [], []
    for _ in range(words):
        current.append(rng.choice(WORDS))
        if len(current) == 8:
            sentences.append(" ".join(current).capitalize() + ".")
            current = []
    return " ".join(sentences + ([" ".join(current) + "."] if current else []))
