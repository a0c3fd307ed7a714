"""BART's noise functions, declared: its params and their bounds, the tokens a row reads and the widths of
its pair (models/objectives/bart.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register
from models.specs.objectives.noise import noise_count

Noise = Literal["token_masking", "token_deletion", "text_infilling", "document_rotation", "none"]


@dataclass(frozen=True)
class BartParams(ObjectiveParams):
    noise: Noise = field(
        default="text_infilling",
        metadata={"description": "BART's noise function, after any sentence permutation (none: that alone)"},
    )
    noise_density: float = field(
        default=0.3,
        metadata={"gt": 0.0, "lt": 1.0, "description": "the tokens masked, deleted or infilled (BART's 0.3)"},
    )
    poisson_lambda: float = field(
        default=3.0, metadata={"gt": 0.0, "description": "text_infilling: the mean span length"}
    )
    permute_sentences: float = field(
        default=0.0,
        metadata={
            "ge": 0.0,
            "le": 1.0,
            "description": "the share of a row's sentences permuted before the noise (fairseq's "
            "--permute-sentences; BART's own models 1.0); needs the tokenizer's sentence ends",
        },
    )

    def check(self) -> None:
        if self.noise == "none" and self.permute_sentences == 0:
            raise ValueError("noise none with permute_sentences 0 corrupts nothing: the decoder would copy")
        if self.noise == "text_infilling" and self.noise_density > 0.5:
            raise ValueError(
                "text_infilling places its spans between kept tokens: noise_density must be <= 0.5"
            )


class BartDenoising(ObjectiveSpec):
    name, kind, Params = "bart", "sequence", BartParams
    implementation = "models.objectives.bart"

    def row_length(self, seq_len: int, params: BartParams) -> int:
        return seq_len - 1  # and EOS

    def piece_tables(self, params: BartParams) -> tuple[str, ...]:
        return ("sentence_ends",) if params.permute_sentences > 0 else ()

    def widths(self, seq_len: int, params: BartParams) -> tuple[int, int, float]:
        raw = seq_len - 1
        num_noise = noise_count(raw, params.noise_density)
        if params.noise == "token_deletion":
            return raw - num_noise + 1, seq_len, seq_len
        if params.noise == "text_infilling":  # about num_noise / λ spans, one [MASK] each
            return round(raw - num_noise + num_noise / params.poisson_lambda + 1), seq_len, seq_len
        return seq_len, seq_len, seq_len

    def longest(self, seq_len: int, params: BartParams) -> list[tuple[int, int]]:
        # spans never outnumber the noise tokens they replace
        deleted = params.noise == "token_deletion"
        return [((self.widths(seq_len, params)[0] if deleted else seq_len), seq_len)]


OBJECTIVE = register(BartDenoising())
