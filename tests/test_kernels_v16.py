"""The 16-row Q4_0 layout and its kernels (kestrel_lab.kernels.v16): the layout is what its
docstring says, the VNNI kernels' integer sums equal the portable kernels' bit for bit, and both give
the row-interleaved kernels' results exactly."""
import numpy as np
import pytest

from kestrel_lab import quant as Q
from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import asm as A
from kestrel_lab.kernels import v16 as V
from kestrel_lab.kernels import registry

VNNI = "avx512_vnni" in registry.host_features()
needs_vnni = pytest.mark.skipif(not VNNI, reason="the host has no AVX-512 VNNI (vpdpbusd): only the portable "
                                                 "Q4_0_V16 kernels can run here")
AVX2 = "avx2" in registry.host_features()
needs_avx2 = pytest.mark.skipif(not AVX2, reason="the host has no AVX2 (vpmaddubsw): not an x86 CPU of this decade")


def _q4(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    return Q.quantize(w, Q.Q4_0).reshape(rows, -1)


def _act(T, cols, seed=1):
    x = np.random.default_rng(seed).standard_normal((T, cols)).astype(np.float32)
    xq = np.empty((T, cols), np.int8)
    xd = np.empty((T, cols // K.QK), np.float32)
    K.quantize_act(x, xq, xd)
    xc = np.empty(xd.shape, np.int16)
    K.act_block_sums(xq, xc)
    return xq, xc, xd


def _v16(src):
    rows, nb = src.shape[0], src.shape[1] // K.Q4_BYTES
    nib = np.empty((rows // V.QV, nb * V.BLOCK_BYTES), np.uint8)
    sc = np.empty((rows // V.QV, nb * V.QV), np.uint16)
    V.repack_q4_0_to_v16(src, nib, sc, 3)
    return nib, sc


def _r32(src):
    rows, nb = src.shape[0], src.shape[1] // K.Q4_BYTES
    nib = np.empty((rows // K.QR, nb * 16 * K.QR), np.uint8)
    sc = np.empty((rows // K.QR, nb * K.QR), np.uint16)
    K.repack_q4_0_to_r32(src, nib, sc, 3)
    return nib, sc


def test_the_layout_is_the_documented_one():
    src = _q4(48, 96)
    nib, sc = _v16(src)
    blocks = src.reshape(3, 16, 3, 18)                                 # (group, row, block, byte)
    for g, r, b, k, i in [(0, 0, 0, 0, 0), (1, 5, 2, 3, 1), (2, 15, 1, 2, 3), (0, 9, 2, 1, 2)]:
        assert nib[g, b * 256 + 64 * k + 4 * r + i] == blocks[g, r, b, 2 + 4 * k + i]
    assert (sc.reshape(3, 3, 16).transpose(0, 2, 1) ==
            blocks[..., :2].copy().view(np.uint16)[..., 0]).all()
    assert nib.nbytes + sc.nbytes == src.nbytes                      # the same bytes, another order


def _block_sums(fn, nib, xw, nb):
    out = np.empty((nib.shape[0], nb, V.QV), np.int32)
    c = np.int32(-1234)
    for g in range(nib.shape[0]):
        for b in range(nb):
            fn(nib[g], b * V.BLOCK_BYTES, xw, b * 8, c, out[g, b])
    return out


def _by_definition(src, xq, c):
    """c + Σ_j q_j·x_j per row and block, q the unsigned nibbles: from the plain Q4_0 bytes."""
    rows, nb = src.shape[0], src.shape[1] // K.Q4_BYTES
    q = src.reshape(rows, nb, 18)[..., 2:].astype(np.int64)
    vals = np.concatenate([q & 15, q >> 4], axis=2)                   # weight j and j + 16 of each block
    x = xq[0].reshape(nb, 32).astype(np.int64)
    return (c + (vals * x).sum(axis=2)).reshape(rows // V.QV, V.QV, nb).transpose(0, 2, 1)


def test_portable_block_sums_are_exact():
    src = _q4(32, 128)
    nib, _ = _v16(src)
    xq, _, _ = _act(1, 128)
    got = _block_sums(V.block16_sums_portable, nib, xq[0].view(np.int32), 4)
    assert np.array_equal(got, _by_definition(src, xq, -1234))


@pytest.mark.parametrize("block_sums", [pytest.param(V.block16_sums_vnni, marks=needs_vnni, id="vnni"),
                                        pytest.param(V.block16_sums_avx2, marks=needs_avx2, id="avx2")])
def test_x86_block_sums_equal_the_portable_ones_bit_for_bit(block_sums):
    src = _q4(64, 256, seed=3)
    nib, _ = _v16(src)
    xq, _, _ = _act(1, 256, seed=4)
    # The int8 extremes against nibble 15 over whole blocks: AVX2 adds the 8 words' vpmaddubsw pair sums
    # in int16 before widening, and here each int16 lane reaches its largest magnitude (8·2·15·(−128) =
    # −30,720 and 8·2·15·127 = 30,480, within ±32,767); a row holds two such lanes.
    nib[0, :2 * V.BLOCK_BYTES] = 0xFF
    xq[0, :32] = -128
    xq[0, 32:64] = 127
    xw = xq[0].view(np.int32)
    want = _block_sums(V.block16_sums_portable, nib, xw, 8)
    assert want[0, 0, 0] == -1234 - 2 * 30720 and want[0, 1, 0] == -1234 + 2 * 30480
    assert np.array_equal(_block_sums(block_sums, nib, xw, 8), want)


KERNELS = [("portable", V.matvec_q4_v16, V.matvec3_q4_v16, V.matvec_swiglu_q4_v16, V.matmul_q4_v16),
           pytest.param("vnni", V.matvec_q4_v16_vnni, V.matvec3_q4_v16_vnni, V.matvec_swiglu_q4_v16_vnni,
                        V.matmul_q4_v16_vnni, marks=needs_vnni),
           pytest.param("avx2", V.matvec_q4_v16_avx2, V.matvec3_q4_v16_avx2, V.matvec_swiglu_q4_v16_avx2,
                        V.matmul_q4_v16_avx2, marks=needs_avx2)]


@pytest.mark.parametrize("isa, matvec, matvec3, swiglu, matmul", KERNELS)
def test_v16_kernels_equal_the_row_interleaved_ones(isa, matvec, matvec3, swiglu, matmul):
    """Same integer sums and the same float operations in the same order: the same float32 bits."""
    rows, cols = 96, 320
    a, b, c = _q4(rows, cols, 5), _q4(32, cols, 6), _q4(64, cols, 7)
    (na, sa), (nb_, sb), (nc, scc) = _v16(a), _v16(b), _v16(c)
    (ra, qa), (rb, qb), (rc, qc) = _r32(a), _r32(b), _r32(c)
    xq, xc, xd = _act(1, cols)
    got, want = np.empty(rows, np.float32), np.empty(rows, np.float32)
    matvec(na, sa, xq, xc, xd, got, 2)
    K.matvec_q4_r32(ra, qa, xq, xc, xd, want, 2)
    assert np.array_equal(got, want)
    outs = [np.empty(n, np.float32) for n in (96, 32, 64)]
    refs = [np.empty(n, np.float32) for n in (96, 32, 64)]
    matvec3(na, sa, nb_, sb, nc, scc, xq, xc, xd, *outs, 3)
    K.matvec3_q4_r32(ra, qa, rb, qb, rc, qc, xq, xc, xd, *refs, 3)
    assert all(np.array_equal(o, r) for o, r in zip(outs, refs))
    g = np.empty(32, np.float32)
    gr = np.empty(32, np.float32)
    swiglu(nb_, sb, nb_, sb, xq, xc, xd, g, 1)
    K.matvec_swiglu_q4_r32(rb, qb, rb, qb, xq, xc, xd, gr, 1)
    assert np.array_equal(g, gr)
    # prefill: four tokens per block load (block16x4_fma) and the T % 4 left over one by one
    for T in (1, 3, 5, 8, 9, 64):
        xqT, xcT, xdT = _act(T, cols, seed=9 + T)
        m, mr = np.empty((T, rows), np.float32), np.empty((T, rows), np.float32)
        matmul(na, sa, xqT, xcT, xdT, m, 2)
        K.matmul_q4_r32(ra, qa, xqT, xcT, xdT, mr, 2)
        assert np.array_equal(m, mr), T


def _engine_run(path, monkeypatch, layout, features=None):
    """Prefill and three decode steps with the Q4 layout forced and, when given, the host's features."""
    from kestrel_lab.engine import Qwen3Engine
    from kestrel_lab.kernels import linear as M

    monkeypatch.setenv("KESTREL_Q4_LAYOUT", layout)
    if features is not None:
        monkeypatch.setattr(registry, "host_features", lambda: features)
    M.kernel_for.cache_clear()                       # the engine caches its registry choices per process
    before = registry.used()
    try:
        eng = Qwen3Engine.from_vqf(path, max_context=64)
        first = eng.prefill([151644, 872, 198, 100, 200, 300])
        steps = [eng.decode(t) for t in (400, 500, 600)]
    finally:
        M.kernel_for.cache_clear()
    ran = {k for k, n in registry.used().items() if n > before.get(k, 0)}
    return eng.q4_layout, np.stack([first, *steps]), ran


def test_the_engine_gives_the_same_logits_on_either_layout(monkeypatch):
    from kestrel_lab.models import vqf

    path = vqf(model="qwen3-tiny-poem", quant="q4_0")
    lay_r, r32, _ = _engine_run(path, monkeypatch, "r32")
    lay_v, v16, _ = _engine_run(path, monkeypatch, "v16")
    assert lay_r == "Q4_0_R32" and lay_v == "Q4_0_V16"
    assert np.array_equal(r32, v16)


@needs_avx2
def test_the_engine_on_an_avx2_host_runs_the_avx2_kernels_with_the_same_logits(monkeypatch):
    """The host's features without VNNI (what an AVX2-only CPU reports): the registry picks the AVX2 V16
    kernels for the layers and the prefill, and the logits keep R32's bits."""
    from kestrel_lab.models import vqf

    path = vqf(model="qwen3-tiny-poem", quant="q4_0")
    avx2_only = frozenset(f for f in registry.host_features() if "vnni" not in f and not f.startswith("avx512"))
    monkeypatch.setenv("KESTREL_Q4_LAYOUT", "")
    assert registry.q4_load_layout(avx2_only) == "Q4_0_V16"
    _, r32, _ = _engine_run(path, monkeypatch, "r32")
    lay, v16, ran = _engine_run(path, monkeypatch, "v16", avx2_only)
    assert lay == "Q4_0_V16" and np.array_equal(r32, v16)
    assert {"decode_layers_v16_avx2", "matmul_q4_v16_avx2"} <= ran and not any("vnni" in k for k in ran), ran


_COMPILE_VNNI = r'''
from numba import njit, types as T
from kestrel_lab.kernels import asm as A, v16 as V
a2 = lambda dt: T.Array(dt, 2, "C")
sig = (a2(T.uint8), a2(T.uint16), a2(T.int8), a2(T.int16), a2(T.float32), a2(T.float32), T.int64)
f = njit(parallel=True, fastmath=True)(V.matmul_q4_v16_vnni.py_func)
f.compile(sig)
print(A.parse_asm(f.inspect_asm(sig), "x86_64")["packed"].get("vpdpbusd", 0))
'''
AVX512_VNNI_CPU = {"NUMBA_CPU_NAME": "icelake-server",
                   "NUMBA_CPU_FEATURES": "+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512cd,+avx512vnni,+avx2,+avx,"
                                         "+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+lzcnt,+movbe"}


@pytest.mark.skipif(A.host_isa() != "x86_64", reason="the VNNI kernels are x86 code")
def test_the_vnni_prefill_kernel_compiles_to_vpdpbusd_for_an_avx512_vnni_cpu(tmp_path):
    """Where the host cannot run VNNI, still compile (never run) the prefill kernel for an AVX-512 VNNI
    CPU: 8 ``vpdpbusd`` per token and block, 4 tokens in ``block16x4_fma`` + 1 for the remainder."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), **AVX512_VNNI_CPU)
    n = subprocess.run([sys.executable, "-c", _COMPILE_VNNI], env=env, capture_output=True, text=True, check=True)
    assert int(n.stdout.split()[-1]) >= 40, n.stdout



_COMPILE_AVX2 = r'''
from numba import njit, types as T
from kestrel_lab.kernels import asm as A, v16 as V
a2 = lambda dt: T.Array(dt, 2, "C")
sig = (a2(T.uint8), a2(T.uint16), a2(T.int8), a2(T.int16), a2(T.float32), a2(T.float32), T.int64)
f = njit(parallel=True, fastmath=True)(V.matmul_q4_v16_avx2.py_func)
f.compile(sig)
s = A.parse_asm(f.inspect_asm(sig), "x86_64")
print(s["packed"].get("vpmaddubsw", 0), s["packed"].get("vpmaddwd", 0), s["registers"]["zmm"],
      s["packed"].get("vpdpbusd", 0))
'''
AVX2_CPU = {"NUMBA_CPU_NAME": "haswell",
            "NUMBA_CPU_FEATURES": "+avx2,+avx,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+lzcnt,+movbe"}


@pytest.mark.skipif(A.host_isa() != "x86_64", reason="the AVX2 kernels are x86 code")
def test_the_avx2_prefill_kernel_compiles_to_vpmaddubsw_on_ymm_for_an_avx2_cpu(tmp_path):
    """Compiled for an AVX2-only CPU (Haswell; AMD Zen 2/3 are the same ISA), each 512-bit vector is two
    ymm halves: 16 ``vpmaddubsw`` and 2 ``vpmaddwd`` per token and block, 4 tokens in ``block16x4_fma``
    plus 1 for the remainder — and no zmm register, no ``vpdpbusd``. (On an AVX-512 host LLVM keeps the
    same code in zmm registers: half as many ``vpmaddubsw``.)"""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), **AVX2_CPU)
    out = subprocess.run([sys.executable, "-c", _COMPILE_AVX2], env=env, capture_output=True, text=True, check=True)
    maddubs, maddwd, zmm, dpbusd = map(int, out.stdout.split()[-4:])
    assert maddubs >= 16 * 5 and maddwd >= 2 * 5 and zmm == 0 and dpbusd == 0, out.stdout


_DECODE_LLVM = r'''
from numba import njit, types as T
from kestrel_lab.kernels import v16 as V
a1, a2 = (lambda dt: T.Array(dt, 1, "C")), (lambda dt: T.Array(dt, 2, "C"))
plane = (a2(T.uint8), a2(T.uint16))
act = (a2(T.int8), a2(T.int16), a2(T.float32))
for name, sig in (("matvec_q4_v16", plane + act + (a1(T.float32), T.int64, T.int64)),
                  ("matvec_swiglu_q4_v16", plane + plane + act + (a1(T.float32), T.int64, T.int64)),
                  ("matvec_q4_v16_vnni", plane + act + (a1(T.float32), T.int64, T.int64))):
    f = njit(parallel=True, fastmath=True)(getattr(V, name).py_func)
    f.compile(sig)
    ir = f.inspect_llvm(sig)
    print(name, ir.count("llvm.x86.avx"), ir.count("llvm.x86.avx512.vpdpbusd"))   # the vector ISA's intrinsics
'''


def test_the_decode_kernels_keep_only_their_own_isa(tmp_path):
    """numba prunes the ``isa == …`` branches of ``_make_kernels`` before typing: the portable matvec and
    SwiGLU hold no AVX/AVX-512 intrinsic (so they compile on the board's aarch64), the VNNI matvec calls
    ``vpdpbusd``."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", _DECODE_LLVM], env=env, capture_output=True, text=True, check=True)
    counts = {line.split()[0]: tuple(map(int, line.split()[1:])) for line in out.stdout.splitlines()}
    assert counts["matvec_q4_v16"] == (0, 0) and counts["matvec_swiglu_q4_v16"] == (0, 0), counts
    assert counts["matvec_q4_v16_vnni"][1] > 0, counts
