"""kestrel_lab.quant against gguf-py (llama.cpp's reference block formats) and against the spec."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from kestrel_lab import quant as Q

gguf = pytest.importorskip("gguf")
from gguf import quants as gq  # noqa: E402  (after importorskip)

GQ = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
OURS = {"q8_0": Q.quantize_q8_0, "q4_0": Q.quantize_q4_0}


def _cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    cases = {
        "normal": rng.standard_normal((16, 256)).astype(np.float32),
        "uniform_wide": rng.uniform(-1e3, 1e3, (8, 128)).astype(np.float32),
        "tiny": (rng.standard_normal((4, 64)) * 1e-6).astype(np.float32),   # subnormal fp16 scales
        "zeros": np.zeros((3, 96), np.float32),
    }
    mixed = rng.standard_normal((4, 128)).astype(np.float32)
    mixed[1, 32:64] = 0          # one all-zero block among normal ones
    mixed[2, :32] = -0.0
    cases["zero_blocks"] = mixed
    # Ties: values that land exactly on .5 after scaling. Q8_0 scale 1 (max 127): x = k + 0.5.
    t8 = np.tile(np.arange(32, dtype=np.float32) - 16 + 0.5, (2, 1))
    t8[:, 0] = 127.0
    t8[1] *= -1
    cases["ties_q8"] = t8
    # Q4_0 with max -8 → d = 1: x / d + 8.5 hits integers for half-integer x.
    t4 = np.tile(np.arange(32, dtype=np.float32) / 4 - 4, (2, 1))
    t4[:, 5] = -8.0
    t4[1, 5] = 8.0               # positive max: d = -1, values flip
    cases["ties_q4"] = t4
    # ±max of equal magnitude in one block: the first one wins the argmax (sign matters for Q4_0).
    pm = rng.standard_normal((4, 64)).astype(np.float32)
    pm[0, 3], pm[0, 9] = 5.0, -5.0
    pm[1, 3], pm[1, 9] = -5.0, 5.0
    pm[2, :32] = 7.0             # a constant block
    pm[3, 32:] = -7.0
    cases["plus_minus_max"] = pm
    return cases


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("case", list(_cases()))
def test_bytes_equal_gguf(fmt, case):
    x = _cases()[case]
    ours = OURS[fmt](x)
    ref = gq.quantize(x, GQ[fmt])
    assert ours.dtype == np.uint8 and ours.shape == ref.shape
    np.testing.assert_array_equal(ours, ref)
    # the one entry point gives the same bytes, flat
    np.testing.assert_array_equal(Q.quantize(x, fmt), ref.reshape(-1))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_dequantize_equals_gguf(fmt):
    x = _cases()["normal"]
    raw = gq.quantize(x, GQ[fmt])
    np.testing.assert_array_equal(Q.dequantize(raw, fmt, *x.shape), gq.dequantize(raw, GQ[fmt]))


# Blocks whose largest value is tiny give a subnormal fp16 scale whose reciprocal overflows to inf;
# llama.cpp and gguf-py do the same (``id = d ? 1/d : 0``), so the bytes still agree; numpy warns.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 3), st.sampled_from([32, 64, 96])),
              elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False)),
       st.sampled_from(["q8_0", "q4_0"]))
def test_bytes_equal_gguf_hypothesis(x, fmt):
    np.testing.assert_array_equal(OURS[fmt](x), gq.quantize(x, GQ[fmt]))


@pytest.mark.parametrize("fmt, steps, half", [("q8_0", 127, 0.5), ("q4_0", 8, 1.0)])
def test_error_bound(fmt, steps, half):
    """Error per value <= half a step (Q4_0: a whole step, the +8 end clips to 7), plus the fp16
    rounding of the scale (relative 2^-11, times at most ``steps`` steps)."""
    x = _cases()["normal"]
    y = Q.dequantize(Q.quantize(x, fmt), fmt, *x.shape)
    amax = np.abs(x.reshape(x.shape[0], -1, 32)).max(-1, keepdims=True)
    d = amax / steps
    err = np.abs((y - x).reshape(amax.shape[0], -1, 32))
    assert (err <= d * (half + steps * 2.0 ** -11) + 1e-7).all()
    assert err.max() > d.min() * 0.25  # the bound is not vacuous: quantization does lose something


def _repack_reference(q4: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_8X8L written from its definition with loops (quant.py's docstring)."""
    nb = cols // 32
    blocks = q4.reshape(rows, nb, 18)
    out = bytearray()
    for g in range(rows // 8):
        for b in range(nb):
            for r in range(8):
                out += bytes(blocks[8 * g + r, b, :2])
            for t in range(2):
                for r in range(8):
                    out += bytes(blocks[8 * g + r, b, 2 + 8 * t:2 + 8 * t + 8])
    return np.frombuffer(bytes(out), dtype=np.uint8)


@pytest.mark.parametrize("rows, cols", [(8, 32), (16, 64), (24, 96), (64, 256)])
def test_q4_8x8l_definition_and_roundtrip(rows, cols):
    x = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32)
    q4 = Q.quantize_q4_0(x)
    packed = Q.repack_q4_8x8l(q4, rows, cols)
    np.testing.assert_array_equal(packed, _repack_reference(q4, rows, cols))
    assert packed.size == Q.tensor_bytes("q4_8x8l", rows, cols) == q4.size
    np.testing.assert_array_equal(Q.unpack_q4_8x8l(packed, rows, cols), q4)
    np.testing.assert_array_equal(Q.quantize(x, "q4_8x8l"), packed)
    np.testing.assert_array_equal(Q.dequantize(packed, "q4_8x8l", rows, cols),
                                  Q.dequantize(q4, "q4_0", rows, cols))


def test_q4_8x8l_needs_rows_multiple_of_8():
    with pytest.raises(ValueError, match="multiple of 8"):
        Q.tensor_bytes("q4_8x8l", 12, 32)


def test_float_formats_and_bytes_formula():
    x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_array_equal(Q.quantize(x, "f32").view("<f4").reshape(5, 7), x)
    np.testing.assert_array_equal(Q.quantize(x, "f16").view("<f2").reshape(5, 7), x.astype(np.float16))
    np.testing.assert_array_equal(Q.dequantize(Q.quantize(x, "f32"), "f32", 5, 7), x)
    assert Q.tensor_bytes(5, 151936, 2048) == 622_329_856               # token_embed (article)
    assert Q.tensor_bytes(3, 151936, 2048) == 175_030_272               # q4_lm
    assert Q.tensor_bytes(2, 24 * 3072, 1024) == 80_216_064             # v_q8_qkv
    assert Q.tensor_bytes(1, 28, 2048) == 229_376                       # attn_norm
    with pytest.raises(ValueError, match="multiple of the block size"):
        Q.tensor_bytes("q8_0", 1, 33)
    with pytest.raises(ValueError, match="unknown qtype"):
        Q.qtype(9)


def test_bf16_against_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(5).standard_normal(1000).astype(np.float32) * 100
    x[:4] = [0.0, -0.0, np.inf, -np.inf]
    t = torch.from_numpy(x).to(torch.bfloat16)
    bits = t.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(Q.f32_to_bf16(x), bits)
    np.testing.assert_array_equal(Q.bf16_to_f32(bits), t.to(torch.float32).numpy())


def test_q8_0_rounds_just_below_one_half_down_like_c_roundf():
    """0.49999997 + 0.5 is 1.0 in float32: a floor(|x| + 0.5) rounding would give 1, C's roundf 0."""
    from gguf import GGMLQuantizationType, quants

    below_half = np.nextafter(np.float32(0.5), np.float32(0))
    block = np.zeros((1, 32), dtype=np.float32)
    block[0, 0], block[0, 1], block[0, 2] = 127, below_half, -below_half
    ours = Q.quantize_q8_0(block)
    assert np.array_equal(ours, quants.quantize(block, GGMLQuantizationType.Q8_0))
    assert ours[0, 3] == 0 and ours[0, 4] == 0
