"""kestrel_lab.diagrams.quant_block: the block pictures are read from the quantizer's real bytes."""
import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.figure import Figure

from kestrel_lab import quant
from kestrel_lab.diagrams import quant_block


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]


def _block(seed=0):
    return np.random.default_rng(seed).standard_normal(32).astype(np.float32)


def test_q4_0_block_shows_scale_and_nibbles_from_the_bytes():
    x = _block()
    raw = bytes(quant.quantize_q4_0(x[None, :]).reshape(-1))
    assert len(raw) == 18
    fig = quant_block.draw_q4_0_block(raw, x)
    assert isinstance(fig, Figure)
    texts = _texts(fig)
    d = float(np.frombuffer(raw[:2], dtype=np.float16)[0])
    assert any(f"d = {d:.4g}" in t for t in texts)
    for j in range(16):
        b = raw[2 + j]
        assert f"{b:02x}" in texts
    # the nibble labels are exactly the bytes' low then high nibbles, in order
    d2, low, high = quant_block.q4_0_fields(raw)
    assert d2 == d
    assert list(low) == [b & 15 for b in raw[2:]] and list(high) == [b >> 4 for b in raw[2:]]
    strip = [t.get_text() for t in fig.axes[0].texts]
    for j in range(16):
        assert str(int(low[j])) in strip and str(int(high[j])) in strip
    # the decoded values in the picture are the package's dequantization
    np.testing.assert_allclose(d * (np.concatenate([low, high]) - 8.0),
                               quant.dequantize_q4_0(np.frombuffer(raw, np.uint8), 1, 32)[0], rtol=1e-6)
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_q8_0_block_shows_scale_and_int8_from_the_bytes():
    x = _block(1)
    raw = bytes(quant.quantize_q8_0(x[None, :]).reshape(-1))
    fig = quant_block.draw_q8_0_block(raw, x)
    assert isinstance(fig, Figure)
    texts = _texts(fig)
    d, q = quant_block.q8_0_fields(raw)
    assert any(f"d = {d:.4g}" in t for t in texts)
    assert all(str(int(v)) in texts for v in q)
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_wrong_sizes_are_refused():
    with pytest.raises(ValueError):
        quant_block.draw_q4_0_block(b"\0" * 17, np.zeros(32))
    with pytest.raises(ValueError):
        quant_block.draw_q8_0_block(b"\0" * 34, np.zeros(31))
