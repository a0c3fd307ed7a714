"""BERT's encoder: bidirectional self-attention; it predicts in place, so it trains on aligned pairs
(the masked LM), scored at the corrupted positions only."""

from __future__ import annotations

from models.pair import PairKind
from models.specs.architectures.base import ArchitectureSpec, register


class EncoderSpec(ArchitectureSpec):
    name, encoder, decoder = "encoder", True, False
    fits = frozenset({"aligned"})
    # [CLS] (position 0), or the masked mean or max of the states (BERT's pooling table): a masked LM
    # never shows [CLS], so its state starts untrained; the mean and max pool states pretraining trained
    poolings = ("cls", "mean", "max")
    paper_objective, lm_auto_class = "mlm", "AutoModelForMaskedLM"
    export_classes = ("BertModel", "BertForMaskedLM", "XLMRobertaXLModel", "XLNetLMHeadModel")
    implementation = "models.architectures.encoder"

    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        return inputs, 0, predicted


ARCHITECTURE = register(EncoderSpec())
