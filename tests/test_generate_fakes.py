"""The stand-in engine of the generation and chat tests (``helpers.fake_engine.FakeEngine``) checks itself."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.fake_engine import FakeEngine


def test_fake_engine_cache_semantics():
    e = FakeEngine(max_context=8, vocab=50)
    a = e.prefill([1, 2, 3])
    e.truncate(2)
    b = e.prefill([3])
    assert np.array_equal(a, b) and e.pos == 3
    with pytest.raises(ValueError):
        e.prefill(list(range(6)))
