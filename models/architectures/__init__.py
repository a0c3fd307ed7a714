"""The architectures, one module each (what it builds, its feature converter, its poolings for
fine-tuning, its FLOPs shape), registered here once: a new architecture is one module and one line
below (or a call of `register` from a module of its own)."""

from __future__ import annotations

from models.architectures.base import Architecture
from models.architectures.decoder import Decoder
from models.architectures.encoder import Encoder
from models.architectures.encoder_decoder import EncoderDecoder
from models.architectures.prefix_lm import PrefixLM

ARCHITECTURES: dict[str, Architecture] = {}


def register(architecture: Architecture) -> Architecture:
    """Add an architecture to the registry: params.yaml's `models.<name>.arch` may name it."""
    ARCHITECTURES[architecture.name] = architecture
    return architecture


for _architecture in (Encoder(), Decoder(), PrefixLM(), EncoderDecoder()):
    register(_architecture)
