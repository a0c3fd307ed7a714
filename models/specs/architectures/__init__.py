"""The architectures' declarations (models/specs/architectures/base.py), each registered as its module is
imported here: a new architecture is its declaration, its implementation (models/architectures/, a
subclass of the declaration) and one line below."""

from __future__ import annotations

from models.specs.architectures.base import ARCHITECTURES as ARCHITECTURES
from models.specs.architectures.base import ArchitectureSpec as ArchitectureSpec
from models.specs.architectures.base import register as register

# the registry's order is the docs' and the params' order
# isort: off
from models.specs.architectures import encoder as encoder
from models.specs.architectures import decoder as decoder
from models.specs.architectures import prefix_lm as prefix_lm
from models.specs.architectures import encoder_decoder as encoder_decoder
from models.specs.architectures import lstm as lstm
from models.specs.architectures import cbow as cbow
from models.specs.architectures import elmo as elmo
# isort: on
