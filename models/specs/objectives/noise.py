"""T5's noise arithmetic (t5.data.preprocessors): how many tokens of a row are noise and in how many
spans, what the widths of the denoising objectives' pairs follow from (models/objectives/noise.py draws
the masks)."""

from __future__ import annotations

from typing import Literal

NoiseMask = Literal["random_spans", "iid"]


def noise_count(length: int, noise_density: float) -> int:
    """Noise tokens of a row: round(length · density), at least one, and one token left (T5's)."""
    return min(max(int(round(length * noise_density)), 1), length - 1)


def span_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row, as T5's random_spans_noise_mask counts them."""
    num_noise = noise_count(length, noise_density)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    return num_noise, min(num_spans, num_noise, length - num_noise)
