"""The int8-dot (A76 ``sdot``) kernels on the file's plain Q4_0 bytes (``kernels.ops._dot_q4_0_signed``):
the XOR-shift identity on every byte, bit-exactness of all five registered variants with
``matvec_q4_0_naive`` on any host, LLVM forming ``sdot`` from the loop for cortex-a76 (cross-compiled
here, natively on an aarch64 board), and the host-feature detection that picks them (the qemu-user
cpuinfo trap: an emulated A76 reads the x86 host's /proc/cpuinfo)."""
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from kestrel_lab import quant as Q
from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import asm as A
from kestrel_lab.kernels import host, registry

FIXTURES = Path(__file__).parent / "fixtures"
ARM = A.host_isa() == "aarch64"


def test_the_xor_shift_gives_sixteen_times_the_signed_nibbles_for_every_byte():
    b = np.arange(256, dtype=np.uint8)
    lo, hi = (b & 15).astype(np.int32), (b >> 4).astype(np.int32)
    f = b ^ np.uint8(0x88)
    assert np.array_equal(((f << 4) & 0xFF).astype(np.uint8).view(np.int8).astype(np.int32), 16 * (lo - 8))
    assert np.array_equal((f & 0xF0).astype(np.uint8).view(np.int8).astype(np.int32), 16 * (hi - 8))
    # the largest |16·Σ(q−8)·x| of a block fits int32 and >> 4 divides it exactly, negative sums too
    worst = 16 * 32 * 8 * 128
    assert worst < 2 ** 31 and all((16 * s) >> 4 == s for s in (-32768, -17, -1, 0, 1, 32767))


def _q4(rows, cols, seed):
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    return Q.quantize(w, Q.Q4_0).reshape(rows, -1)


def _act(T, cols, seed):
    x = np.random.default_rng(seed).standard_normal((T, cols)).astype(np.float32)
    xq = np.empty((T, cols), np.int8)
    xd = np.empty((T, cols // K.QK), np.float32)
    K.quantize_act(x, xq, xd)
    return xq, xd


def _naive(w, xq, xd, t=0):
    out = np.empty(w.shape[0], np.float32)
    K.matvec_q4_0_naive(w, np.ascontiguousarray(xq[t:t + 1]), np.ascontiguousarray(xd[t:t + 1]),
                        K.F16_TO_F32, out, 3)
    return out


@njit
def _silu_mul_plain(g, u):
    """silu(g)·u without fastmath, as the int8-dot SwiGLU kernel computes it."""
    out = np.empty_like(g)
    for i in range(g.shape[0]):
        out[i] = K.silu(g[i]) * u[i]
    return out


def test_the_int8_dot_kernels_are_bit_exact_with_the_naive_kernel():
    cols = 256
    a, b, c = _q4(40, cols, 1), _q4(24, cols, 2), _q4(8, cols, 3)
    a[0, 2:18] = 0x00          # every nibble 0 (q − 8 = −8) ...
    a[1, 2:18] = 0xFF          # ... and 15
    xq, xd = _act(5, cols, 4)
    xq[0, :32] = -127
    one = np.empty(40, np.float32)
    K.matvec_q4_0_sdot(a, xq[:1], xd[:1], K.F16_TO_F32, one, 3)
    assert np.array_equal(one, _naive(a, xq, xd))
    outs = [np.empty(n, np.float32) for n in (40, 24, 8)]
    K.matvec3_q4_0_sdot(a, b, c, xq[:1], xd[:1], K.F16_TO_F32, *outs, 4)
    assert all(np.array_equal(o, _naive(w, xq, xd)) for o, w in zip(outs, (a, b, c)))
    many = np.empty((5, 40), np.float32)
    K.matmul_rows_q4_0_sdot(a, xq, xd, K.F16_TO_F32, many, 3)
    assert all(np.array_equal(many[t], _naive(a, xq, xd, t)) for t in range(5))
    g = np.empty(24, np.float32)
    K.matvec_swiglu_q4_0_sdot(b, b[::-1].copy(), xq[:1], xd[:1], K.F16_TO_F32, g, 2)
    assert np.array_equal(g, _silu_mul_plain(_naive(b, xq, xd), _naive(b[::-1].copy(), xq, xd)))
    # MoE: 3 experts of 24×256 (gate/up) and 256×… (down); pairs of expert 2 then expert 0
    gate = np.stack([_q4(24, cols, 10 + e) for e in range(3)])
    up = np.stack([_q4(24, cols, 20 + e) for e in range(3)])
    ex, start, tok = np.array([2, 0], np.int64), np.array([0, 2, 5], np.int64), np.array([0, 3, 1, 2, 4], np.int64)
    gu = np.empty((5, 24), np.float32)
    K.experts_swiglu_q4_0_sdot(gate, up, ex, start, tok, xq, xd, K.F16_TO_F32, gu, 2)
    for p, e in enumerate([2, 2, 0, 0, 0]):
        want = _silu_mul_plain(_naive(gate[e], xq, xd, tok[p]), _naive(up[e], xq, xd, tok[p]))
        assert np.array_equal(gu[p], want)
    down = np.stack([_q4(16, 64, 30 + e) for e in range(3)])
    gq, gd = _act(5, 64, 5)
    dn = np.empty((5, 16), np.float32)
    K.experts_down_q4_0_sdot(down, ex, start, gq, gd, K.F16_TO_F32, dn, 2)
    assert all(np.array_equal(dn[p], _naive(down[e], gq, gd, p)) for p, e in enumerate([2, 2, 0, 0, 0]))


def test_the_registry_picks_the_int8_dot_kernels_on_a_dotprod_host():
    for call, name in (("one", "matvec_q4_0"), ("many", "matmul_rows_q4_0"), ("qkv", "matvec3_q4_0"),
                       ("swiglu", "matvec_swiglu_q4_0"), ("experts", "experts_q4_0")):
        assert registry.select("Q4_0", call, frozenset({"aarch64", "dotprod"})).name == name + "_sdot"
        assert registry.select("Q4_0", call, frozenset({"aarch64"})).name == name
    # the board keeps splitting plain Q4_0 into R32 at load; KESTREL_Q4_LAYOUT=plain keeps the file's bytes
    assert registry.q4_load_layout(frozenset({"aarch64", "dotprod"})) == "Q4_0_R32"


def test_forced_int8_dot_kernels_run_the_whole_engine(monkeypatch):
    """An engine on the file's bytes with the sdot kernels forced: the same logits as with the
    portable plain-Q4_0 kernels, to float-summation order (the integer sums are the same)."""
    from kestrel_lab.engine import Qwen3Engine
    from kestrel_lab.kernels import linear as M
    from kestrel_lab.models import vqf

    path = vqf(model="qwen3-tiny-poem", quant="q4_0")
    monkeypatch.setenv("KESTREL_Q4_LAYOUT", "plain")
    runs = {}
    for feats in (frozenset({"x86_64"}), frozenset({"aarch64", "dotprod"})):
        monkeypatch.setattr(registry, "host_features", lambda f=feats: f)
        M.kernel_for.cache_clear()
        eng = Qwen3Engine.from_vqf(path, max_context=32)
        logits = np.stack([eng.prefill([151644, 872, 198, 100]), eng.decode(200)])
        runs["dotprod" in feats] = (eng.kernel_paths()["matrices"]["Q4_0"], logits)
    M.kernel_for.cache_clear()
    assert runs[True][0]["one"] == "matvec_q4_0_sdot" and runs[False][0]["one"] == "matvec_q4_0"
    assert runs[True][0]["many"] == "matmul_rows_q4_0_sdot"
    scale = np.abs(runs[False][1]).max()
    assert np.abs(runs[True][1] - runs[False][1]).max() < 1e-4 * scale


def test_llvm_turns_the_int8_dot_into_sdot_for_the_a76():
    llvm = pytest.importorskip("llvmlite.binding")
    llvm.initialize_all_targets()
    try:
        llvm.Target.from_triple("aarch64-unknown-linux-gnu")
    except RuntimeError:
        pytest.skip("this llvmlite was built without the AArch64 target")
    asm = A.cross_asm("kestrel_lab.kernels.ops:_dot_q4_0_signed", A.SDOT_SIGNATURE, ("cortex-a76", "generic"))
    a76 = A.parse_asm(asm["cortex-a76"], "aarch64")["packed"]
    assert a76.get("sdot", 0) >= 2, a76          # one per 16 bytes: low and high nibbles
    generic = A.parse_asm(asm["generic"], "aarch64")["packed"]
    assert "sdot" not in generic, generic           # an Armv8.0 CPU has no dot product


@pytest.mark.skipif(not ARM, reason="numba compiles for the host only: the native sdot check needs an aarch64 "
                                    "host (a board, or make board-smoke's emulated A76)")
def test_the_int8_dot_becomes_sdot_on_the_a76():
    xq, xd = _act(1, 64, 1)
    out = np.empty(8, np.float32)
    K.matvec_q4_0_sdot(_q4(8, 64, 2), xq, xd, K.F16_TO_F32, out, 1)
    feats = registry.host_features()
    assert "dotprod" in feats and not feats & {"avx2", "avx512_vnni", "avx512f"}, sorted(feats)
    assert A.asm_summary(K.matvec_q4_0_sdot)["packed"].get("sdot", 0) >= 2


# ------------------------------------------------------------------ host features (fixture cpuinfo files)
def test_x86_features_come_from_the_flags_line_only():
    text = (FIXTURES / "x86-zen4" / "cpuinfo").read_text()
    f = host.features_from(text, "x86_64")
    assert {"avx2", "avx512_vnni", "x86_64"} <= f and "dotprod" not in f and "asimddp" not in f


def test_arm_features_come_from_the_features_line_and_hwcap():
    text = (FIXTURES / "rk3588" / "proc" / "cpuinfo").read_text()
    f = host.features_from(text, "aarch64", hwcap=0)
    assert {"asimddp", "dotprod", "aarch64"} <= f and "i8mm" not in f
    assert "dotprod" not in host.features_from(text.replace(" asimddp", ""), "aarch64", hwcap=0)


def test_an_emulated_a76_ignores_the_x86_hosts_cpuinfo():
    """qemu-user shows the host's /proc/cpuinfo to the emulated process: its x86 ``flags`` must not
    count on aarch64 (they would pick VNNI kernels); AT_HWCAP (bit 20, asimddp) tells the truth."""
    text = (FIXTURES / "x86-zen4" / "cpuinfo").read_text()
    f = host.features_from(text, "aarch64", hwcap=host.HWCAP_ASIMDDP)
    assert "avx512_vnni" not in f and "avx2" not in f and {"dotprod", "aarch64"} <= f
    assert "dotprod" not in host.features_from(text, "aarch64", hwcap=0)
    assert registry.q4_load_layout(f) == "Q4_0_R32"
    # and the other way round: an ARM cpuinfo never lends its Features to x86
    arm = (FIXTURES / "rk3588" / "proc" / "cpuinfo").read_text()
    assert "dotprod" not in host.features_from(arm, "x86_64")


def test_the_host_reports_its_own_isa():
    f = registry.host_features()
    assert A.host_isa() in f
    if ARM:
        assert not f & {"avx2", "avx512_vnni"}
    else:
        assert "dotprod" not in f
