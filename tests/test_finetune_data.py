from __future__ import annotations

import pytest
import torch

from models.finetune_data import encode_pair, pad_batch
from models.special import SPECIAL

CLS, SEP = SPECIAL.cls, SPECIAL.sep


def test_single_and_pair_layouts() -> None:
    assert encode_pair([200, 201], None, 16) == [CLS, 200, 201, SEP]
    assert encode_pair([200], [300, 301], 16) == [CLS, 200, SEP, 300, 301, SEP]


def test_truncation_takes_from_the_longer_side_first() -> None:
    first, second = list(range(200, 220)), list(range(300, 305))
    ids = encode_pair(first, second, 16)
    assert len(ids) == 16
    assert ids == [CLS, *range(200, 208), SEP, *range(300, 305), SEP]
    assert encode_pair(list(range(200, 210)), list(range(300, 310)), 11) == [
        CLS,
        200,
        201,
        202,
        203,
        SEP,
        300,
        301,
        302,
        303,
        SEP,
    ]
    assert encode_pair(list(range(200, 300)), None, 8) == [CLS, *range(200, 206), SEP]
    with pytest.raises(ValueError, match="no room for text"):
        encode_pair([200], [300], 3)


def test_pad_batch() -> None:
    ids, mask = pad_batch([[CLS, 200, SEP], [CLS, SEP]])
    assert ids.tolist() == [[CLS, 200, SEP], [CLS, SEP, SPECIAL.pad]]
    assert mask.tolist() == [[True, True, True], [True, True, False]]
    assert ids.dtype == torch.long and mask.dtype == torch.bool
