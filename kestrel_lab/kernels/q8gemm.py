"""Q8_0 weights × int8 activations for hundreds of tokens: the vision tower's GEMM (``vpdpbusd``, AVX2, portable).

The tower multiplies 1,200 patches by each block matrix (Q8_0 in a quantized file). Widening the rows to
float32 for a BLAS sgemm spends a 4-byte float and an FMA per weight; an int8 dot spends one byte and a
quarter of a ``vpdpbusd`` lane (64 byte products per instruction, four summed into each int32 lane).

**Activations**: quantized once per matmul to Q8_0 (``kernels.ops.quantize_rows``: int8 per value, one
scale per 32, the text engine's own form), plus ``−128·Σx`` per block (``act_q8_sums``).

**Layout ``Q8_0_G16``** (``pack``, made once when the tower is built, kept beside the file's bytes):
rows in groups of 16 (one int32 lane of a 512-bit register each). For group ``g`` and block ``b``, 512
bytes: 8 chunks of 64, chunk ``k`` holding bytes ``4k … 4k+3`` of the block of each of the 16 rows (row
``r`` at ``64k + 4r``), each stored as ``w + 128`` (unsigned: ``vpdpbusd`` wants its first operand
unsigned, its second signed). The 16 rows' block scales are float32 in a second plane. A last group
with fewer than 16 rows is padded with zero weights and zero scales.

**The tile** (``TT`` tokens × 16 rows, ``_tile_ir``): per block the 8 weight vectors are loaded once and
stay in registers while each of the ``TT`` tokens spends 8 ``vpdpbusd`` on them (its 8 activation words
broadcast to the 16 lanes, the accumulator starting at ``−128·Σx`` so that the unsigned weights count as
``w``). The exact int32 sum is converted and multiplied by ``scale_w · scale_x`` into one float
accumulator per token, which never leaves its register until the last block. **AVX2** hosts (no VNNI)
get the same tile with ``vpmaddubsw``/``vpmaddwd`` on ``|w|`` and ``sign(w)·x`` (llama.cpp's
``mul_sum_i8_pairs``: each int16 pair sum ≤ 2·128·127, exact), the **portable** twin plain loops. All
three make the same int32 sums and the same float operations in the same order: their outputs are the
same float32 bits (tested).

**Epilogue**: bias and, for the MLP's ``fc1``, the tanh GELU are applied as the tile is written
(``kernels.vision.gelu_tanh_scalar``, the same operations as the unfused ``add_bias`` + ``gelu_tanh``).
Work is split over (token chunk × row group) items in one parallel region. Taught in day19_2.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels.vision import gelu_tanh_scalar

QV = 16                   # rows per group: one int32 lane of a 512-bit register each
TT = 8                    # tokens per tile: 8 float accumulators + 8 weight vectors stay in registers
TOKEN_CHUNK = 128         # tokens per work item: their activations (≤ 512 KiB at K = 4,096) stay in L2
GROUP_BYTES = 8 * 64      # bytes of one block of one 16-row group
ISAS = ("vnni", "avx2", "portable")
_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_V64I8, _V16I32, _V16F = ir.VectorType(_I8, 64), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_V32I8, _V16I16, _V8I32 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)


# ------------------------------------------------------------------------------ the layout
@njit(parallel=True, cache=True)
def _pack(src, qs, sc, lut):
    rows = src.shape[0]
    nb = qs.shape[1] // GROUP_BYTES
    for g in prange(qs.shape[0]):
        for r in range(QV):
            row = g * QV + r
            for b in range(nb):
                if row < rows:
                    o = b * K.Q8_BYTES
                    sc[g, b * QV + r] = lut[np.int32(src[row, o]) | (np.int32(src[row, o + 1]) << 8)]
                    for j in range(32):
                        qs[g, b * GROUP_BYTES + 64 * (j // 4) + 4 * r + j % 4] = src[row, o + 2 + j] ^ np.uint8(0x80)
                else:
                    sc[g, b * QV + r] = 0.0
                    for j in range(32):
                        qs[g, b * GROUP_BYTES + 64 * (j // 4) + 4 * r + j % 4] = np.uint8(0x80)


def pack(w) -> tuple[np.ndarray, np.ndarray]:
    """``Q8_0_G16`` planes of a Q8_0 ``Linear`` (see the module docstring): ``qs`` (groups, K/32·512)
    uint8 and ``sc`` (groups, K/32·16) float32, made once and kept on the ``Linear`` (``w.g16``).

    Taught in day19_2."""
    g16 = getattr(w, "g16", None)
    if g16 is None:
        if w.qt.name != "Q8_0":
            raise ValueError(f"{w.name}: Q8_0_G16 is made from Q8_0 weights, got {w.qt.name}")
        groups, nb = -(-w.rows // QV), w.cols // K.QK
        qs = np.empty((groups, nb * GROUP_BYTES), np.uint8)
        sc = np.empty((groups, nb * QV), np.float32)
        _pack(w.w, qs, sc, K.F16_TO_F32)
        g16 = w.g16 = (qs, sc)
    return g16


@njit(parallel=True, cache=True)
def act_q8_sums(xq, xc):
    """``xc[t, b] = −128 · Σ xq[t, 32b … 32b+31]``: the start value of a block's ``vpdpbusd`` sums, which
    makes the stored ``w + 128`` count as ``w``."""
    T, Kd = xq.shape
    for t in prange(T):
        for b in range(Kd // K.QK):
            s = np.int32(0)
            for j in range(K.QK):
                s += np.int32(xq[t, b * K.QK + j])
            xc[t, b] = np.int32(-128) * s


# ------------------------------------------------------------------------------ the x86 tile
def _splat(builder, v, vt):
    t = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(t, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(_I32, vt.count),
                                                                                 [0] * vt.count))


def _avx2_weights(builder, wv):
    """Per weight vector the two 256-bit halves of ``|w|`` and ``w`` (signed bytes), for ``_avx2_dot``."""
    out = []
    flip = ir.Constant(_V32I8, [-128] * 32)
    zero = ir.Constant(_V32I8, [0] * 32)
    for v in wv:
        b = builder.bitcast(v, _V64I8)
        halves = []
        for h in range(2):
            idx = ir.Constant(ir.VectorType(_I32, 32), list(range(32 * h, 32 * h + 32)))
            s = builder.xor(builder.shuffle_vector(b, ir.Constant(_V64I8, ir.Undefined), idx), flip)
            neg = builder.icmp_signed("<", s, zero)
            halves.append((builder.select(neg, builder.sub(zero, s), s), neg))
        out.append(halves)
    return out


def _avx2_dot(builder, acc, wsplit, xs):
    """``acc + Σ_words w·x`` (16 int32 lanes) with ``vpmaddubsw(|w|, sign(w)·x)`` + ``vpmaddwd`` by ones."""
    maddubs = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V16I16, [_V32I8, _V32I8]), "llvm.x86.avx2.pmadd.ub.sw")
    maddwd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V8I32, [_V16I16, _V16I16]), "llvm.x86.avx2.pmadd.wd")
    ones = ir.Constant(_V16I16, [1] * 16)
    zero = ir.Constant(_V32I8, [0] * 32)
    sums = [None, None]
    for halves, xw in zip(wsplit, xs):
        x8 = builder.bitcast(_splat(builder, xw, ir.VectorType(_I32, 8)), _V32I8)
        for h in range(2):
            aw, neg = halves[h]
            sx = builder.select(neg, builder.sub(zero, x8), x8)
            p = builder.call(maddwd, [builder.call(maddubs, [aw, sx]), ones])
            sums[h] = p if sums[h] is None else builder.add(sums[h], p)
    both = builder.shuffle_vector(sums[0], sums[1], ir.Constant(ir.VectorType(_I32, 16), list(range(16))))
    return builder.add(acc, both)


def _make_tile(isa: str):
    """The ``tile`` intrinsic of one x86 form: ``vnni`` (``vpdpbusd``) or ``avx2``."""

    @intrinsic
    def tile(typingctx, w, wo, s, so, x, xo, xs, c, d, co, cs, nb, F):
        """``F[16·i + r] = Σ_b float(Σ_j w_rbj·x_ibj) · (s_rb · d_ib)`` for the 16 rows of a ``Q8_0_G16`` group
        (bytes at ``w[wo:]``, scales at ``s[so:]``) and ``TT`` tokens ``i`` (int8 values as int32 words at
        ``x[xo + i·xs:]``, block sums ``c`` and scales ``d`` at ``co + i·cs``), over ``nb`` blocks."""
        arrays = (w, s, x, c, d, F)
        if not all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" for a in arrays):
            return None
        if (w.dtype, s.dtype, x.dtype, c.dtype, d.dtype, F.dtype) != (
                types.uint8, types.float32, types.int32, types.int32, types.float32, types.float32):
            return None

        def codegen(context, builder, sig, args):
            wa, wo_, sa, so_, xa, xo_, xs_, ca, da, co_, cs_, nb_, Fa = args
            ptr = [context.make_array(t)(context, builder, a).data for t, a in zip(sig.args, args)
                   if isinstance(t, types.Array)]
            wp, sp, xp, cp, dp, fp = ptr
            wo_, so_, xo_, xs_, co_, cs_, nb_ = (builder.sext(v, _I64) if v.type.width < 64 else v
                                                 for v in (wo_, so_, xo_, xs_, co_, cs_, nb_))
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_V16F, [0.0] * 16)) for _ in range(TT)]
            dpbusd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16I32, [_V16I32, _V16I32, _V16I32]),
                "llvm.x86.avx512.vpdpbusd.512")
            with cgutils.for_range(builder, nb_) as loop:
                b = loop.index
                base = builder.add(wo_, builder.mul(b, ir.Constant(_I64, GROUP_BYTES)))
                wv = [builder.load(builder.bitcast(builder.gep(wp, [builder.add(base, ir.Constant(_I64, 64 * k))]),
                                                   _V16I32.as_pointer()), align=1) for k in range(8)]
                scale = builder.load(builder.bitcast(
                    builder.gep(sp, [builder.add(so_, builder.mul(b, ir.Constant(_I64, QV)))]), _V16F.as_pointer()),
                    align=4)
                wsplit = _avx2_weights(builder, wv) if isa == "avx2" else None
                for i in range(TT):
                    ci = builder.add(builder.add(co_, builder.mul(ir.Constant(_I64, i), cs_)), b)
                    xi = builder.add(builder.add(xo_, builder.mul(ir.Constant(_I64, i), xs_)),
                                     builder.mul(b, ir.Constant(_I64, 8)))
                    xw = [builder.load(builder.gep(xp, [builder.add(xi, ir.Constant(_I64, k))]), align=4)
                          for k in range(8)]
                    if isa == "vnni":
                        acc = _splat(builder, builder.load(builder.gep(cp, [ci])), _V16I32)
                        for k in range(8):
                            acc = builder.call(dpbusd, [acc, wv[k], _splat(builder, xw[k], _V16I32)])
                    else:
                        acc = _avx2_dot(builder, ir.Constant(_V16I32, [0] * 16), wsplit, xw)
                    dx = _splat(builder, builder.load(builder.gep(dp, [ci])), _V16F)
                    prod = builder.fmul(builder.sitofp(acc, _V16F), builder.fmul(scale, dx))
                    builder.store(builder.fadd(builder.load(accs[i]), prod), accs[i])
            for i in range(TT):
                out = builder.gep(fp, [ir.Constant(_I64, QV * i)])
                builder.store(builder.load(accs[i]), builder.bitcast(out, _V16F.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(w, wo, s, so, x, xo, xs, c, d, co, cs, nb, F), codegen

    return tile


tile_vnni = _make_tile("vnni")
tile_avx2 = _make_tile("avx2")


@njit(cache=True)
def tile_portable(w, wo, s, so, x8, xo, xs, c, d, co, cs, nb, F):
    """``tile`` in plain loops (any CPU), on the int8 values ``x8`` (offsets in bytes, not words): the
    same int32 sums and the same float32 operations, in the same order."""
    for i in range(TT):
        for r in range(QV):
            F[QV * i + r] = np.float32(0.0)
    for b in range(nb):
        for i in range(TT):
            xb = xo + i * xs + 32 * b
            dx = d[co + i * cs + b]
            for r in range(QV):
                acc = np.int32(0)
                for k in range(8):
                    for j in range(4):
                        wj = np.int32(w[wo + b * GROUP_BYTES + 64 * k + 4 * r + j]) - 128
                        acc += wj * np.int32(x8[xb + 4 * k + j])
                F[QV * i + r] += np.float32(acc) * (s[so + b * QV + r] * dx)


# ------------------------------------------------------------------------------ the GEMM (one per tile form)
@njit(cache=True, inline="always")
def _epilogue(F, out, t0, r0, bias, has_bias, gelu):
    T, R = out.shape
    for i in range(min(TT, T - t0)):
        for r in range(min(QV, R - r0)):
            v = F[QV * i + r]
            if has_bias:
                v += bias[r0 + r]
            if gelu:
                v = gelu_tanh_scalar(v)
            out[t0 + i, r0 + r] = v


def _make_gemm(form: str):
    """The GEMM of one tile form: numba freezes the closure's ``form`` (a str, which keeps the on-disk
    cache key stable) and prunes the branches not taken, so the portable GEMM never meets an x86 intrinsic."""

    @njit(parallel=True, cache=True)
    def gemm(qs, sc, xflat, xs, xc, xd, bias, has_bias, gelu, out):
        T, R = out.shape
        groups, nb = qs.shape[0], xd.shape[1]
        Tp = xd.shape[0]                       # a multiple of TT (padded with zero tokens)
        wflat, sflat = qs.reshape(-1), sc.reshape(-1)
        cflat, dflat = xc.reshape(-1), xd.reshape(-1)
        nchunk = (Tp + TOKEN_CHUNK - 1) // TOKEN_CHUNK
        for item in prange(nchunk * groups):
            tc, g = item // groups, item % groups
            F = np.empty(TT * QV, np.float32)
            for t0 in range(tc * TOKEN_CHUNK, min(Tp, tc * TOKEN_CHUNK + TOKEN_CHUNK), TT):
                if form == "vnni":
                    tile_vnni(wflat, g * qs.shape[1], sflat, g * sc.shape[1], xflat, t0 * xs, xs, cflat, dflat,
                              t0 * nb, nb, nb, F)
                elif form == "avx2":
                    tile_avx2(wflat, g * qs.shape[1], sflat, g * sc.shape[1], xflat, t0 * xs, xs, cflat, dflat,
                              t0 * nb, nb, nb, F)
                else:
                    tile_portable(wflat, g * qs.shape[1], sflat, g * sc.shape[1], xflat, t0 * xs, xs, cflat,
                                  dflat, t0 * nb, nb, nb, F)
                if t0 < T:
                    _epilogue(F, out, t0, g * QV, bias, has_bias, gelu)
    return gemm


GEMMS = {form: _make_gemm(form) for form in ISAS}


def quantize(x: np.ndarray):
    """Activations (T, K) float32 → (xq int8, xq as int32 words, ``−128·Σx`` per block, scales), the rows
    padded with zeros to a multiple of ``TT`` tokens."""
    T, Kd = x.shape
    Tp = -(-T // TT) * TT
    xq = np.zeros((Tp, Kd), np.int8)
    xd = np.zeros((Tp, Kd // K.QK), np.float32)
    K.quantize_rows(x, xq[:T], xd[:T])
    xc = np.empty((Tp, Kd // K.QK), np.int32)
    act_q8_sums(xq, xc)
    return xq, xq.view(np.int32), xc, xd


_NO_BIAS = np.zeros(1, np.float32)


def gemm(form: str, w, x: np.ndarray, out: np.ndarray, bias=None, gelu: bool = False) -> np.ndarray:
    """``out = gelu?(x @ W.T + bias)`` for a Q8_0 ``Linear`` ``w`` and float32 activations ``x`` (T, K), with
    the tile of ``form`` (``vnni``, ``avx2`` or ``portable``). Taught in day19_2."""
    if x.shape[1] != w.cols or out.shape != (x.shape[0], w.rows):
        raise ValueError(f"{w.name}: gemm of {x.shape} activations into {out.shape} with a {w.rows}×{w.cols} matrix")
    qs, sc = pack(w)
    xq, xw, xc, xd = quantize(np.ascontiguousarray(x, dtype=np.float32))
    b = _NO_BIAS if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    if bias is not None and b.shape != (w.rows,):
        raise ValueError(f"{w.name}: bias of shape {b.shape}, expected ({w.rows},)")
    xflat = xq.reshape(-1) if form == "portable" else xw.reshape(-1)    # bytes, or int32 words
    GEMMS[form](qs, sc, xflat, xflat.size // xd.shape[0], xc, xd, b, bias is not None, bool(gelu), out)
    return out


__all__ = ["pack", "gemm", "quantize", "act_q8_sums", "tile_vnni", "tile_avx2", "tile_portable", "GEMMS",
           "QV", "TT", "ISAS"]
