"""The vision tower's kernels: the int8 Q8_0 GEMM (``kernels.q8gemm``) and the tiled attention
(``kernels.vit_attention``) — layout, exactness of every ISA form against the portable one, the fused
epilogue, odd sizes, and that the x86 forms really compile to ``vpdpbusd`` / ``vpmaddubsw``."""
import numpy as np
import pytest

from kestrel_lab import quant as Q
from kestrel_lab.kernels import asm as A
from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import q8gemm as G
from kestrel_lab.kernels import registry
from kestrel_lab.kernels import vision as VK
from kestrel_lab.kernels import vit_attention as VA
from kestrel_lab.kernels.linear import Activation, Linear

VNNI = "avx512_vnni" in registry.host_features()
needs_vnni = pytest.mark.skipif(not VNNI, reason="the host has no AVX-512 VNNI (vpdpbusd): only the portable "
                                "and AVX2 forms can run here")
AVX2 = "avx2" in registry.host_features()
needs_avx2 = pytest.mark.skipif(not AVX2, reason="the host has no AVX2 (vpmaddubsw): not an x86 CPU of this decade")
FORMS = [pytest.param("vnni", marks=needs_vnni), pytest.param("avx2", marks=needs_avx2)]
#: (rows, cols, tokens): rows not a multiple of 16, tokens not a multiple of 8, more tokens than a chunk
SHAPES = [(37, 96, 21), (16, 32, 8), (50, 64, 133), (3, 32, 1)]


def _linear(rows, cols, seed=0, scale=0.05):
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(np.float32)
    data = Q.quantize(w, Q.Q8_0.id).reshape(-1)
    return Linear(Q.Q8_0.id, rows, cols, data, f"w{rows}x{cols}"), Q.dequantize(data, Q.Q8_0.id, rows, cols)


def _x(tokens, cols, seed=1):
    return np.random.default_rng(seed).standard_normal((tokens, cols)).astype(np.float32)


def test_the_layout_is_the_documented_one():
    lin, _ = _linear(20, 64)
    qs, sc = G.pack(lin)
    assert qs.shape == (2, 2 * 512) and sc.shape == (2, 2 * 16)
    raw = lin.w
    for row, b, j in [(0, 0, 0), (5, 1, 13), (17, 1, 31), (19, 0, 6)]:
        g, r = divmod(row, 16)
        assert qs[g, b * 512 + 64 * (j // 4) + 4 * r + j % 4] == raw[row, b * 34 + 2 + j] ^ 0x80
        assert sc[g, b * 16 + r] == K.F16_TO_F32[int(raw[row, b * 34]) | int(raw[row, b * 34 + 1]) << 8]
    assert (qs[1, :][np.arange(1024) % 64 // 4 >= 4] == 0x80).all()       # rows 20…31: zero weights
    assert (sc[1, 4:16] == 0).all() and (sc[1, 20:32] == 0).all()
    assert G.pack(lin)[0] is qs                                              # made once, kept on the Linear


@pytest.mark.parametrize("rows,cols,tokens", SHAPES)
def test_portable_gemm_is_the_exact_int8_product(rows, cols, tokens):
    """The portable form against float64 of the same integers: Σ_b (Σ_j w·x) · d_w · d_x."""
    lin, _ = _linear(rows, cols)
    x = _x(tokens, cols)
    xq, _, _, xd = G.quantize(x)
    ref = (xq[:tokens].astype(np.float64).reshape(tokens, 1, -1, 32)
           * lin.w.view(np.int8).reshape(rows, -1, 34)[None, :, :, 2:].astype(np.float64)).sum(-1)
    scales_w = np.array([[K.F16_TO_F32[int(r[b * 34]) | int(r[b * 34 + 1]) << 8] for b in range(cols // 32)]
                         for r in lin.w], np.float64)
    want = (ref * scales_w[None] * xd[:tokens, None, :]).sum(-1)
    out = np.empty((tokens, rows), np.float32)
    G.gemm("portable", lin, x, out)
    assert np.abs(out - want).max() <= 1e-5 * max(np.abs(want).max(), 1e-30)


@pytest.mark.parametrize("rows,cols,tokens", SHAPES)
def test_int8_gemm_is_close_to_float_matmul(rows, cols, tokens):
    """Quantizing the activations to Q8_0 (one scale per 32) moves the product by ≤ 1.5 % of its scale
    for unit-normal activations (per value ≤ half a step, amax/254; measured ≤ 0.6 %)."""
    lin, wf = _linear(rows, cols)
    x = _x(tokens, cols)
    out = np.empty((tokens, rows), np.float32)
    registry.select("Q8_0", "gemm")(lin, Activation(x), out)
    want = x @ wf.T
    assert np.abs(out - want).max() <= 0.015 * np.abs(want).max()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows,cols,tokens", SHAPES)
def test_x86_forms_equal_the_portable_one_bit_for_bit(form, rows, cols, tokens):
    lin, _ = _linear(rows, cols, seed=rows)
    x = _x(tokens, cols, seed=tokens)
    bias = np.random.default_rng(2).standard_normal(rows).astype(np.float32)
    for b, gelu in ((None, False), (bias, True)):
        want, got = (np.empty((tokens, rows), np.float32) for _ in range(2))
        G.gemm("portable", lin, x, want, b, gelu)
        G.gemm(form, lin, x, got, b, gelu)
        assert np.array_equal(got, want)


@pytest.mark.parametrize("form", ["portable"] + FORMS)
def test_fused_bias_and_gelu_equal_the_unfused_path(form):
    lin, _ = _linear(37, 96)
    x = _x(21, 96)
    bias = np.random.default_rng(3).standard_normal(37).astype(np.float32)
    fused, plain = (np.empty((21, 37), np.float32) for _ in range(2))
    G.gemm(form, lin, x, fused, bias, True)
    G.gemm(form, lin, x, plain)
    VK.add_bias(plain, bias)
    VK.gelu_tanh(plain)
    assert np.array_equal(fused, plain)


def test_the_registry_picks_by_isa_and_always_has_a_portable_gemm():
    assert registry.select("Q8_0", "gemm", frozenset()).name == "int8_gemm_q8_0_portable"
    assert registry.select("Q8_0", "gemm", frozenset({"avx2"})).name == "int8_gemm_q8_0_avx2"
    assert registry.select("Q8_0", "gemm", frozenset({"avx2", "avx512_vnni"})).name == "int8_gemm_q8_0_vnni"


def test_bad_shapes_are_refused():
    lin, _ = _linear(16, 64)
    with pytest.raises(ValueError, match="w16x64"):
        G.gemm("portable", lin, _x(4, 32), np.empty((4, 16), np.float32))
    with pytest.raises(ValueError, match="bias"):
        G.gemm("portable", lin, _x(4, 64), np.empty((4, 16), np.float32), np.zeros(15, np.float32))


_COMPILE = r'''
import sys
from numba import types as T, njit
from kestrel_lab.kernels import asm as A, q8gemm as G
a = lambda dt, n: T.Array(dt, n, "C")
form = sys.argv[1]
sig = (a(T.uint8, 2), a(T.float32, 2), a(T.int32, 1), T.int64, a(T.int32, 2), a(T.float32, 2), a(T.float32, 1),
       T.boolean, T.boolean, a(T.float32, 2))
f = njit(parallel=True)(G.GEMMS[form].py_func)
f.compile(sig)
s = A.parse_asm(f.inspect_asm(sig), "x86_64")
print(s["packed"].get("vpdpbusd", 0), s["packed"].get("vpmaddubsw", 0), s["registers"]["zmm"])
'''
AVX512_VNNI_CPU = {"NUMBA_CPU_NAME": "icelake-server",
                   "NUMBA_CPU_FEATURES": "+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512cd,+avx512vnni,+avx2,+avx,"
                                         "+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+lzcnt,+movbe"}
AVX2_CPU = {"NUMBA_CPU_NAME": "haswell",
            "NUMBA_CPU_FEATURES": "+avx2,+avx,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+lzcnt,+movbe"}


@pytest.mark.skipif(A.host_isa() != "x86_64", reason="the VNNI and AVX2 GEMMs are x86 code")
@pytest.mark.parametrize("form,cpu", [("vnni", AVX512_VNNI_CPU), ("avx2", AVX2_CPU)])
def test_the_x86_gemms_compile_to_their_instructions(form, cpu, tmp_path):
    """Compiled (never run) for an AVX-512 VNNI CPU: 8 ``vpdpbusd`` per token of a tile, 64 in all; for
    an AVX2 CPU (Haswell): ``vpmaddubsw`` on ymm halves (2 per word and token), no zmm, no ``vpdpbusd``."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), **cpu)
    out = subprocess.run([sys.executable, "-c", _COMPILE, form], env=env, capture_output=True, text=True,
                         check=True)
    dpbusd, maddubs, zmm = map(int, out.stdout.split()[-3:])
    if form == "vnni":
        assert dpbusd >= 8 * G.TT and zmm > 0, out.stdout
    else:
        assert maddubs >= 16 * G.TT and dpbusd == 0 and zmm == 0, out.stdout


# ------------------------------------------------------------------------------ attention
def _qkv(n, heads=2, d=64, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, heads, d)).astype(np.float32) for _ in range(3))


@pytest.mark.parametrize("cu", [[0, 16, 45], [0, 1], [0, 7, 8, 40], [0, 130]])
def test_tiled_attention_equals_the_plain_kernel(cu):
    """Segments of odd lengths (not multiples of the 8-query or 16-key tile, a single patch): the tiled
    kernel against ``attend_bidirectional`` (one query and one key at a time), and its portable twin."""
    cu = np.array(cu)
    q, k, v = _qkv(int(cu[-1]))
    N, H, D = q.shape
    lens = np.diff(cu)
    start, end = np.repeat(cu[:-1], lens), np.repeat(cu[1:], lens)
    ref = np.empty((H, N, D), np.float32)
    VK.attend_bidirectional(*(np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (q, k, v)), start, end, ref)
    ref = ref.transpose(1, 0, 2).reshape(N, H * D)
    got = VA.attend_segments_tiled(q, k, v, cu)
    assert np.abs(got - ref).max() <= 5e-6
    port = VA.attend_segments_tiled(q, k, v, cu, portable=True)
    assert np.abs(port - got).max() <= 1e-6 * np.abs(got).max()


def test_fast_exp_is_within_its_stated_error():
    x = np.concatenate([np.linspace(-30, 0, 4001), [-86.9, -87.0, -100.0]]).astype(np.float32)
    y = x.copy()
    VA.exp_rows(y, y.size, np.empty(y.size, np.int32))
    rel = np.abs(y[:4001] / np.exp(x[:4001].astype(np.float64)) - 1)
    assert rel.max() < 3e-6
    assert 0 <= y[-1] < 1e-37 and y[4000] == 1.0


def test_fma_tile_and_its_portable_twin_agree():
    rng = np.random.default_rng(5)
    a = rng.standard_normal(VA.QT * 40).astype(np.float32)
    b = rng.standard_normal(40 * 32).astype(np.float32)
    c1, c2 = np.zeros(VA.QT * 32, np.float32), np.zeros(VA.QT * 32, np.float32)
    VA.fma_tile_jit(a, 0, 40, 1, b, 16, 32, 40, c1, 16, 32)
    VA.fma_tile_portable(a, 0, 40, 1, b, 16, 32, 40, c2, 16, 32)
    want = a.reshape(VA.QT, 40).astype(np.float64) @ b.reshape(40, 32)[:, 16:].astype(np.float64)
    assert np.abs(c2.reshape(VA.QT, 32)[:, 16:] - want).max() < 1e-4
    assert np.abs(c1 - c2).max() < 1e-5 and (c1.reshape(VA.QT, 32)[:, :16] == 0).all()
