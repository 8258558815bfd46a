"""The engine's kernels against plain numpy and against kestrel_lab.quant (llama.cpp-exact blocks)."""
from __future__ import annotations

import numpy as np
import pytest

from kestrel_lab import quant as Q
from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import asm as A
from kestrel_lab.kernels.attention import attend, attend_reference
from kestrel_lab.engine.kv import ContextFullError, KVCache
from kestrel_lab.kernels.rope import apply_rope, mrope_cos_sin, rope_cos_sin

LUT = K.F16_TO_F32


def ro(a):
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def test_f16_round_matches_numpy():
    rng = np.random.default_rng(0)
    vals = np.concatenate([rng.random(2000) * 10.0 ** rng.integers(-9, 4, 2000), [0.0, 6.1e-5, 5.96e-8, 1.0]])
    vals = vals.astype(np.float32)
    got = np.array([K.f16_round(v) for v in vals], np.float32)
    np.testing.assert_array_equal(got, vals.astype(np.float16).astype(np.float32))


def test_f16_widening_is_exact_for_every_finite_half():
    h = np.arange(65536, dtype=np.uint16)
    h = h[np.isfinite(h.view(np.float16))].copy()
    bits = np.empty(h.size, np.int32)
    K.f16_row_to_f32(h, bits, bits.view(np.float32))
    np.testing.assert_array_equal(bits.view(np.float32), h.view(np.float16).astype(np.float32))


def test_activation_quantization_is_quant_q8_0():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 256)) * rng.random((3, 1)) * 5).astype(np.float32)
    x[1, :32] = 0.0                                   # an all-zero block
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((3, 8), np.float32)
    K.quantize_act(x, xq, xd)
    ref = Q.quantize_q8_0(x).reshape(3, 8, 34)
    np.testing.assert_array_equal(xq.reshape(3, 8, 32), ref[..., 2:].view(np.int8))
    np.testing.assert_array_equal(xd, ref[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))


@pytest.fixture(scope="module")
def mat():
    rng = np.random.default_rng(2)
    rows, cols, T = 72, 256, 5
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((T, cols)).astype(np.float32)
    xq = np.empty((T, cols), np.int8)
    xd = np.empty((T, cols // 32), np.float32)
    K.quantize_act(x, xq, xd)
    xe = np.empty((T, cols // 32, 5, 64), np.int16)
    K.expand_act_8x8(xq, xe)
    xdeq = Q.dequantize_q8_0(Q.quantize_q8_0(x), T, cols).astype(np.float64)
    return w, x, xq, xd, xe, xdeq


def test_float_matvecs(mat):
    w, x, *_ = mat
    rows = w.shape[0]
    out = np.empty(rows, np.float32)
    K.matvec_f32(ro(w), x[0], out, 3)
    np.testing.assert_allclose(out, w.astype(np.float64) @ x[0], rtol=0, atol=1e-4)
    w16 = w.astype(np.float16)
    K.matvec_f16(ro(w16.view(np.uint16)), x[0], LUT, out, 3)
    ref16 = w16.astype(np.float64) @ x[0]
    np.testing.assert_allclose(out, ref16, rtol=0, atol=1e-4)
    outT = np.empty((x.shape[0], rows), np.float32)
    K.matmul_rows_f16(ro(w16.view(np.uint16)), x, LUT, outT, 3)
    np.testing.assert_allclose(outT, x.astype(np.float64) @ w16.astype(np.float64).T, rtol=0, atol=1e-4)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_0_naive", "q4_8x8l"])
def test_block_matvec_and_matmul_equal_dequantized_math(mat, fmt):
    w, x, xq, xd, xe, xdeq = mat
    rows, cols = w.shape
    T = x.shape[0]
    qbytes = Q.quantize_q8_0(w) if fmt == "q8_0" else Q.quantize_q4_0(w)
    wdeq = Q.dequantize(qbytes.reshape(-1), "q8_0" if fmt == "q8_0" else "q4_0", rows, cols).astype(np.float64)
    ref = xdeq @ wdeq.T                                   # (T, rows)
    tol = 1e-5 * np.abs(ref).max()
    out = np.empty(rows, np.float32)
    outT = np.empty((T, rows), np.float32)
    if fmt == "q8_0":
        w8 = ro(qbytes)
        K.matvec_q8_0(w8, w8.view(np.int8), xq[:1], xd[:1], LUT, out, 4)
        K.matmul_rows_q8_0(w8, w8.view(np.int8), xq, xd, LUT, outT, 4)
    elif fmt == "q4_0":
        K.matvec_q4_0(ro(qbytes), xq[:1], xd[:1], LUT, out, 4)
        K.matmul_rows_q4_0(ro(qbytes), xq, xd, LUT, outT, 4)
    elif fmt == "q4_0_naive":
        K.matvec_q4_0_naive(ro(qbytes), xq[:1], xd[:1], LUT, out, 4)
        K.matmul_rows_q4_0(ro(qbytes), xq, xd, LUT, outT, 4)
    else:
        packed = np.empty(qbytes.size, np.uint8)
        K.repack_q4_0_to_8x8l(ro(qbytes), packed, 3)
        np.testing.assert_array_equal(packed, Q.repack_q4_8x8l(qbytes, rows, cols))
        K.matvec_q4_8x8l(ro(packed), xe[:1], xd[:1], LUT, out, 4)
        K.matmul_q4_8x8l(ro(packed), xe, xd, LUT, outT, 4)
    assert np.abs(out - ref[0]).max() <= tol
    assert np.abs(outT - ref).max() <= tol


def _r32(qbytes, rows, cols):
    """Split + row-interleave plain Q4_0 bytes with the kernel; check the layout against numpy."""
    nb = cols // 32
    nib = np.empty((rows // K.QR, nb * 16 * K.QR), np.uint8)
    sc = np.empty((rows // K.QR, nb * K.QR), np.uint16)
    K.repack_q4_0_to_r32(ro(qbytes.reshape(rows, -1)), nib, sc, 3)
    blocks = qbytes.reshape(rows // K.QR, K.QR, nb, 18)                     # (group, row, block, byte)
    want_sc = blocks[..., :2].copy().view(np.uint16)[..., 0].transpose(0, 2, 1)  # (group, block, row)
    want_nib = blocks[..., 2:].transpose(0, 2, 3, 1)                           # (group, block, column, row)
    np.testing.assert_array_equal(sc, want_sc.reshape(sc.shape))
    np.testing.assert_array_equal(nib, want_nib.reshape(nib.shape))
    return ro(nib), ro(sc)


def test_row_interleaved_q4_0_kernels_equal_dequantized_math():
    """The decode layout: matvec, the fused Q/K/V and SwiGLU kernels and the batched matmul."""
    rng = np.random.default_rng(5)
    rows, cols, T = 96, 320, 4
    x = (rng.standard_normal((T, cols)) * 3).astype(np.float32)
    x[0, 64:96] = 0.0                                   # an all-zero activation block
    xq = np.empty((T, cols), np.int8)
    xd = np.empty((T, cols // 32), np.float32)
    K.quantize_act(x, xq, xd)
    xc = np.empty(xd.shape, np.int16)
    K.act_block_sums(xq, xc)
    np.testing.assert_array_equal(xc, -8 * xq.reshape(T, -1, 32).astype(np.int32).sum(-1))
    xdeq = Q.dequantize_q8_0(Q.quantize_q8_0(x), T, cols).astype(np.float64)
    mats, planes, refs = [], [], []
    for i in range(3):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        w[5, :] = 0.0                                   # an all-zero row (scale 0)
        w[7, 32:64] = 100.0                             # a block at the extremes of the nibble range
        w[7, 40] = -120.0
        qb = Q.quantize_q4_0(w)
        mats.append(qb)
        planes.append(_r32(qb, rows, cols))
        refs.append(xdeq @ Q.dequantize(qb.reshape(-1), "q4_0", rows, cols).astype(np.float64).T)
    tol = [1e-5 * np.abs(r).max() for r in refs]
    out = np.empty(rows, np.float32)
    outT = np.empty((T, rows), np.float32)
    for (nib, sc), ref, t in zip(planes, refs, tol):
        for nch in (1, 2, 5):
            K.matvec_q4_r32(nib, sc, xq[:1], xc[:1], xd[:1], out, nch)
            assert np.abs(out - ref[0]).max() <= t
        K.matmul_q4_r32(nib, sc, xq, xc, xd, outT, 3)
        assert np.abs(outT - ref).max() <= t
    # Integer dots are exact, so the row-interleaved kernel and the plain 16-lane one differ only by
    # the order of the float additions over blocks.
    plain = np.empty(rows, np.float32)
    K.matvec_q4_0(ro(mats[0]), xq[:1], xd[:1], LUT, plain, 2)
    K.matvec_q4_r32(*planes[0], xq[:1], xc[:1], xd[:1], out, 2)
    np.testing.assert_allclose(out, plain, rtol=1e-5, atol=1e-6 * np.abs(plain).max())
    qo, ko, vo = (np.empty(rows, np.float32) for _ in range(3))
    (na, sa), (nb_, sb), (nc, scc) = planes
    K.matvec3_q4_r32(na, sa, nb_, sb, nc, scc, xq[:1], xc[:1], xd[:1], qo, ko, vo, 4)
    for o, ref, t in zip((qo, ko, vo), refs, tol):
        assert np.abs(o - ref[0]).max() <= t
    K.matvec_swiglu_q4_r32(na, sa, nb_, sb, xq[:1], xc[:1], xd[:1], out, 4)
    with np.errstate(over="ignore"):                   # e^-gate overflows to inf for very negative gates: silu → -0
        want = qo / (np.float32(1) + np.exp(-qo)) * ko    # the same float32 math on the same dots
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_result_does_not_depend_on_thread_chunks(mat):
    w, x, xq, xd, xe, _ = mat
    packed = ro(Q.repack_q4_8x8l(Q.quantize_q4_0(w), *w.shape))
    outs = []
    for nch in (1, 2, 9):
        o = np.empty(w.shape[0], np.float32)
        K.matvec_q4_8x8l(packed, xe[:1], xd[:1], LUT, o, nch)
        outs.append(o)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_rmsnorm_silu_softmax():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    out = np.empty_like(x)
    K.rmsnorm(x, w, np.float32(1e-6), out)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    heads = x.reshape(4, 4, 16).copy()
    K.rmsnorm_heads(heads, w[:16], np.float32(1e-6))
    hx = x.reshape(4, 4, 16).astype(np.float64)
    np.testing.assert_allclose(heads, hx / np.sqrt((hx ** 2).mean(-1, keepdims=True) + 1e-6) * w[:16],
                               rtol=1e-5, atol=1e-6)
    g, u = x, x[::-1].copy()
    s = np.empty_like(g)
    K.silu_mul(g, u, s)
    np.testing.assert_allclose(s, g / (1 + np.exp(-g.astype(np.float64))) * u, rtol=1e-5, atol=1e-6)
    big = np.array([1000.0, 999.0, -5.0], np.float32)
    p = K.softmax(big)
    assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-6 and p[0] > p[1] > p[2]


def test_rope_rotate_half_and_mrope_text_positions():
    rng = np.random.default_rng(4)
    T, H, D = 6, 3, 16
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    pos = np.arange(10, 10 + T)
    cos, sin = rope_cos_sin(pos, D, 1e6)
    y = x.copy()
    apply_rope(y, cos, sin)
    c2 = np.concatenate([cos, cos], -1)[:, None]
    s2 = np.concatenate([sin, sin], -1)[:, None]
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    np.testing.assert_allclose(y, x * c2 + rot * s2, rtol=1e-6, atol=1e-6)
    # rotation keeps norms, and q·k depends only on the distance
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    q = np.ones((1, 1, D), np.float32)
    k = np.ones((1, 1, D), np.float32)

    def dot_at(pq, pk):
        a, b = q.copy(), k.copy()
        apply_rope(a, *rope_cos_sin([pq], D, 1e6))
        apply_rope(b, *rope_cos_sin([pk], D, 1e6))
        return float((a * b).sum())

    assert abs(dot_at(7, 3) - dot_at(104, 100)) < 1e-4
    for interleaved, sec in ((True, [4, 2, 2]), (False, [4, 2, 2])):
        mc, ms = mrope_cos_sin(np.stack([pos, pos, pos]), D, 1e6, sec, interleaved)
        np.testing.assert_array_equal(mc, cos)
        np.testing.assert_array_equal(ms, sin)
    mc, _ = mrope_cos_sin(np.stack([pos, pos + 1, pos]), D, 1e6, [4, 2, 2], True)
    assert not np.array_equal(mc, cos)


def test_attention_gqa_causal_matches_reference():
    rng = np.random.default_rng(5)
    T, H, KVH, D, ctx, pos0 = 5, 4, 2, 8, 16, 3
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    kc = np.zeros((KVH, ctx, D), np.float32)
    vc = np.zeros((KVH, ctx, D), np.float32)
    kc[:, :pos0 + T] = rng.standard_normal((KVH, pos0 + T, D))
    vc[:, :pos0 + T] = rng.standard_normal((KVH, pos0 + T, D))
    out = np.empty_like(q)
    attend(q, kc, vc, pos0, out)
    np.testing.assert_allclose(out, attend_reference(q, kc, vc, pos0), rtol=1e-5, atol=1e-5)


def test_kv_cache_limits():
    kv = KVCache(layers=2, kv_heads=2, head_dim=8, max_context=4)
    assert kv.bytes_per_token == 2 * 2 * 2 * 8 * 4
    assert KVCache.bytes_per_token_for(28, 8, 128) == 229_376       # Qwen3-0.6B: 224 KiB per token
    kv.check_room(4)
    kv.pos = 3
    with pytest.raises(ContextFullError, match="max_context=4"):
        kv.check_room(2)
    kv.truncate(1)
    assert kv.pos == 1
    with pytest.raises(ValueError):
        kv.truncate(2)


@pytest.mark.slow  # inspect_asm recompiles the kernel (~20 s)
def test_asm_summary_sees_packed_integer_code(mat):
    w, x, xq, xd, xe, _ = mat
    packed = ro(Q.repack_q4_8x8l(Q.quantize_q4_0(w), *w.shape))
    K.matvec_q4_8x8l(packed, xe[:1], xd[:1], LUT, np.empty(w.shape[0], np.float32), 2)
    s = A.asm_summary(K.matvec_q4_8x8l)
    assert s["isa"] == A.host_isa() and s["instructions"] > 100 and s["vector"] > 0
    if s["isa"] == "x86_64":
        mnemonics = dict(s["top"])
        assert s["ymm"] + s["zmm"] > 0
        assert any(m.startswith("vp") for m in mnemonics) or s["ymm"] + s["zmm"] > 20
    else:  # aarch64 (the board): NEON v-registers and packed multiply-adds
        assert s["registers"]["v"] > 20 and s["packed"], s


@pytest.mark.slow  # inspect_asm recompiles the kernel (~20 s)
def test_row_interleaved_kernel_is_packed_int16_code():
    """The rows-as-lanes loop must stay vectorized: packed int16 multiplies, no byte-by-byte gathers."""
    rng = np.random.default_rng(3)
    rows, cols = 64, 256
    nib, sc = _r32(Q.quantize_q4_0(rng.standard_normal((rows, cols)).astype(np.float32)), rows, cols)
    xq = np.zeros((1, cols), np.int8)
    K.matvec_q4_r32(nib, sc, xq, np.zeros((1, cols // 32), np.int16), np.ones((1, cols // 32), np.float32),
                    np.empty(rows, np.float32), 2)
    s = A.asm_summary(K.matvec_q4_r32)
    mnemonics = s["ops"]  # every mnemonic: in a threaded kernel the scalar set-up code fills the top 12
    if s["isa"] == "x86_64":
        assert s["packed"].get("vpmullw", 0) >= 16, s["packed"]
        assert mnemonics.get("vpinsrb", 0) == 0, mnemonics
    else:  # aarch64: packed int16 multiply-adds on v-registers, no lane-by-lane inserts
        assert sum(s["packed"].get(op, 0) for op in ("mla", "mul", "smlal", "smlal2", "sdot")) >= 8, s
        assert mnemonics.get("ins", 0) < 16, mnemonics


ARM_ASM = """
.LBB0_4:
	ldr	q0, [x8], #16
	sdot	v1.4s, v0.16b, v2.16b
	mla	v3.8h, v4.8h, v5.8h
	mul	x9, x10, x11
	fadd	s0, s0, s1
	// a comment
	b.ne	.LBB0_4
"""
X86_ASM = """
	vpmullw	%ymm1, %ymm2, %ymm3
	vpmaddwd	%zmm0, %zmm1, %zmm2
	vaddss	%xmm0, %xmm1, %xmm1
	imull	%eax, %ecx
"""


def test_parse_asm_knows_both_isas():
    """The assembly inspection is architecture-aware, so the lesson and the tests mean the same on the board."""
    arm = A.parse_asm(ARM_ASM, "aarch64")
    assert arm["instructions"] == 6 and arm["vector"] == 3 and arm["registers"] == {"v": 3}
    assert arm["packed"] == {"sdot": 1, "mla": 1}  # the scalar mul on x-registers is not packed
    x86 = A.parse_asm(X86_ASM, "x86_64")
    assert x86["registers"] == {"zmm": 1, "ymm": 1, "xmm": 1} and x86["vector"] == 3
    assert x86["packed"] == {"vpmullw": 1, "vpmaddwd": 1}
    with pytest.raises(ValueError, match="riscv"):
        A.parse_asm("add a0, a0, a1", "riscv64")


def test_half_to_float_is_quiet_for_every_bit_pattern():
    """Signalling-NaN halves set the FPU's invalid flag on aarch64; converting them must not warn."""
    from kestrel_lab import quant

    with np.errstate(all="raise"):
        table = quant.half_bits_to_f32(np.arange(65536, dtype=np.uint16))
    assert np.isfinite(table).sum() == 65536 - 2048  # exponent 31: 2 infinities and 2,046 NaNs
    assert np.isnan(table).sum() == 2046 and np.isinf(table).sum() == 2
    np.testing.assert_array_equal(table, K.F16_TO_F32)


def test_quantize_act_rounds_like_c_roundf_just_below_one_half():
    from kestrel_lab import quant
    from kestrel_lab.kernels import ops as K

    below_half = np.nextafter(np.float32(0.5), np.float32(0))
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 127, below_half, -below_half
    xq = np.empty((1, 32), dtype=np.int8)
    xd = np.empty((1, 1), dtype=np.float32)
    K.quantize_act(x, xq, xd)
    assert xq[0, 1] == 0 and xq[0, 2] == 0
    assert np.array_equal(xq[0], quant.quantize_q8_0(x)[0, 2:].view(np.int8))


def test_softmax_over_a_vocabulary_sums_to_one():
    from kestrel_lab.kernels import ops as K

    rng = np.random.default_rng(0)
    # a few dominant tokens first, then a long tail of tiny terms (~4e-8 each), as after training:
    # a float32 running sum would drop the whole tail (0.6 % of the mass)
    logits = (rng.standard_normal(151_936) * 0.1 - 17).astype(np.float32)
    logits[:10] = 0
    p = logits.copy()
    K.softmax_inplace(p, p.size)
    ref = np.exp(logits.astype(np.float64) - logits.max())
    ref /= ref.sum()
    assert abs(float(p.astype(np.float64).sum()) - 1.0) < 1e-5
    assert np.abs(p - ref).max() < 1e-6
