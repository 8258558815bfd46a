"""The vision tower's attention: every patch over the patches of its own image, in register tiles.

``kernels.vision.attend_bidirectional`` takes one (head, patch) pair per work item and one key at a time:
a 64-wide dot product, then a horizontal sum of its 16 lanes, for each of the 1,440,000 (query, key)
pairs of a 1,200-patch image per head — more shuffles than multiplies. Here, per (head, tile of ``QT``
queries) work item, inside the image's segment:

1. **scores** in tiles of ``QT`` queries × 16 keys (``fma_tile``): the keys transposed once per head
   and segment to (D, keys), so 16 keys are one vector; for each of the D dimensions one load of 16
   keys' values and ``QT`` fused multiply-adds by a query's value broadcast — ``QT`` accumulators stay in
   registers for the whole dot product, no horizontal sums;
2. **softmax** of the ``QT`` score rows (scaled by 1/√D, maximum subtracted): ``exp`` is ``exp_rows``, a
   degree-6 polynomial on ``2^frac`` with the exponent put into the float's bits (relative error
   ~2e-6, the float32 rounding of ``x·log2 e``; numba without SVML calls a scalar ``expf`` per element);
3. **weighted sum of values** with the same tile (``fma_tile`` again: the ``QT`` probability rows
   broadcast, 16 values of a key's row loaded), divided by each row's sum at the end.

Only ``QT`` × (segment length) scores exist at a time, never the n×n matrix. ``fma_tile`` is written in
LLVM's generic vector IR (``<16 x float>`` multiplies and adds, no x86 intrinsic), so it is the same
kernel on every ISA (LLVM splits the vectors for 256- or 128-bit registers); ``fma_tile_portable`` is
its plain-loop twin, for tests. Taught in day19_2.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

QT = 8                       # queries per tile: 8 accumulators of 16 lanes
KV = 16                      # keys (or value dimensions) per vector
_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
_V16F = ir.VectorType(_F32, KV)
LOG2E = 1.4426950408889634
# 2^f on [−½, ½]: degree-6 Taylor polynomial of exp(f·ln 2), coefficients (ln 2)^k / k!
_C = tuple(math.log(2.0) ** k / math.factorial(k) for k in range(7))


@intrinsic
def fma_tile(typingctx, a, ao, ars, ast, b, bo, bst, n, c, co, crs):
    """``c[co + i·crs + l] = Σ_s a[ao + i·ars + s·ast] · b[bo + s·bst + l]`` for ``i < QT``, ``l < 16``,
    ``s < n``: ``QT`` rows of ``a`` broadcast against 16-wide vectors of ``b``, accumulated in registers.
    Scores: ``a`` the queries, ``b`` the transposed keys; values: ``a`` the probabilities, ``b`` V."""
    if not all(isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == 1 and t.layout == "C"
               for t in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        aa, ao_, ars_, ast_, ba, bo_, bst_, n_, ca, co_, crs_ = args
        ap, bp, cp = (context.make_array(t)(context, builder, v).data
                      for t, v in zip(sig.args, args) if isinstance(t, types.Array))
        ao_, ars_, ast_, bo_, bst_, n_, co_, crs_ = (builder.sext(v, _I64) if v.type.width < 64 else v
                                                     for v in (ao_, ars_, ast_, bo_, bst_, n_, co_, crs_))
        accs = [cgutils.alloca_once_value(builder, ir.Constant(_V16F, [0.0] * KV)) for _ in range(QT)]
        undef = ir.Constant(_V16F, ir.Undefined)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F, [_V16F] * 3), "llvm.fma.v16f32")
        zeros = ir.Constant(ir.VectorType(_I32, KV), [0] * KV)
        with cgutils.for_range(builder, n_) as loop:
            s = loop.index
            bv = builder.load(builder.bitcast(builder.gep(bp, [builder.add(bo_, builder.mul(s, bst_))]),
                                              _V16F.as_pointer()), align=4)
            sa = builder.add(ao_, builder.mul(s, ast_))
            for i in range(QT):
                ai = builder.load(builder.gep(ap, [builder.add(sa, builder.mul(ir.Constant(_I64, i), ars_))]))
                splat = builder.shuffle_vector(builder.insert_element(undef, ai, ir.Constant(_I32, 0)), undef, zeros)
                builder.store(builder.call(fma, [splat, bv, builder.load(accs[i])]), accs[i])
        for i in range(QT):
            ptr = builder.gep(cp, [builder.add(co_, builder.mul(ir.Constant(_I64, i), crs_))])
            builder.store(builder.load(accs[i]), builder.bitcast(ptr, _V16F.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(a, ao, ars, ast, b, bo, bst, n, c, co, crs), codegen


@njit(cache=True)
def fma_tile_jit(a, ao, ars, ast, b, bo, bst, n, c, co, crs):
    """``fma_tile`` callable from Python (an intrinsic is usable only inside compiled code)."""
    fma_tile(a, ao, ars, ast, b, bo, bst, n, c, co, crs)


@njit(cache=True)
def fma_tile_portable(a, ao, ars, ast, b, bo, bst, n, c, co, crs):
    """``fma_tile`` in plain loops, the products summed in the same order; ``fma_tile`` fuses each multiply
    and add (one rounding instead of two), so the two differ by float rounding only (tested: ≤ 1e-6 of the
    scale)."""
    for i in range(QT):
        for lane in range(KV):
            acc = np.float32(0.0)
            for s in range(n):
                acc = acc + a[ao + i * ars + s * ast] * b[bo + s * bst + lane]
            c[co + i * crs + lane] = acc


@njit(fastmath=True, cache=True)
def exp_rows(s, n, bits):
    """In place, ``s[0:n] = exp(s[0:n])`` for arguments ≤ 0 (a softmax's ``x − max``): ``2^(x·log2 e)`` as
    ``2^int · 2^frac`` (the integer rounded to nearest, |frac| ≤ ½), the fraction by a degree-6
    polynomial, the integer put into the exponent bits
    (``bits``: int32 scratch of ≥ n, viewed as float32). Arguments below −87 count as −87 (a result of
    ~1e-38 instead of less). Vectorizes, unlike a call to ``expf`` per element."""
    f32 = bits.view(np.float32)
    for j in range(n):
        y = max(s[j], np.float32(-87.0)) * np.float32(LOG2E)
        fl = np.floor(y + np.float32(0.5))
        f = y - fl
        p = np.float32(_C[6])
        p = p * f + np.float32(_C[5])
        p = p * f + np.float32(_C[4])
        p = p * f + np.float32(_C[3])
        p = p * f + np.float32(_C[2])
        p = p * f + np.float32(_C[1])
        p = p * f + np.float32(_C[0])
        bits[j] = (np.int32(fl) + np.int32(127)) << 23
        s[j] = p
    for j in range(n):
        s[j] = s[j] * f32[j]


@njit(cache=True)
def _segment_layout(k, v, a, n, npad, kt, vp):
    """Keys of rows a … a+n−1 transposed to ``kt`` (H, D, npad) and values copied to ``vp`` (H, npad, D),
    zero-padded to ``npad`` keys."""
    H, D = k.shape[1], k.shape[2]
    for h in range(H):
        for d in range(D):
            for j in range(npad):
                kt[h, d, j] = k[a + j, h, d] if j < n else np.float32(0.0)
        for j in range(npad):
            for d in range(D):
                vp[h, j, d] = v[a + j, h, d] if j < n else np.float32(0.0)


@njit(parallel=True, fastmath=True, cache=True)
def _attend_segment(q, kt, vp, a, n, out, portable):
    """Attention of the queries of one segment (rows a … a+n−1), all heads, ``QT`` queries per work item."""
    H, D, npad = kt.shape
    scale = np.float32(1.0 / math.sqrt(D))
    tiles = (n + QT - 1) // QT
    ktf, vpf = kt.reshape(-1), vp.reshape(-1)
    for item in prange(H * tiles):
        h, t0 = item // tiles, (item % tiles) * QT
        qt = np.zeros(QT * D, np.float32)
        for i in range(min(QT, n - t0)):
            for d in range(D):
                qt[i * D + d] = q[a + t0 + i, h, d] * scale
        S = np.empty(QT * npad, np.float32)
        bits = np.empty(npad, np.int32)
        acc = np.empty(QT * D, np.float32)
        for j0 in range(0, npad, KV):
            if portable:
                fma_tile_portable(qt, 0, D, 1, ktf, h * D * npad + j0, npad, D, S, j0, npad)
            else:
                fma_tile(qt, 0, D, 1, ktf, h * D * npad + j0, npad, D, S, j0, npad)
        tot = np.empty(QT, np.float32)
        for i in range(QT):
            row = S[i * npad:(i + 1) * npad]
            m = row[0]
            for j in range(1, n):
                m = max(m, row[j])
            for j in range(n):
                row[j] = row[j] - m
            exp_rows(row, n, bits)
            s = np.float32(0.0)
            for j in range(n):
                s += row[j]
            for j in range(n, npad):
                row[j] = np.float32(0.0)
            tot[i] = s
        for d0 in range(0, D, KV):
            if portable:
                fma_tile_portable(S, 0, npad, 1, vpf, h * npad * D + d0, D, npad, acc, d0, D)
            else:
                fma_tile(S, 0, npad, 1, vpf, h * npad * D + d0, D, npad, acc, d0, D)
        for i in range(min(QT, n - t0)):
            inv = np.float32(1.0) / tot[i]
            for d in range(D):
                out[a + t0 + i, h * D + d] = acc[i * D + d] * inv


def attend_segments_tiled(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu: np.ndarray,
                          portable: bool = False) -> np.ndarray:
    """Bidirectional attention inside each segment ``cu[s] … cu[s+1]``: q, k, v (N, heads, D) float32 (q and
    k rotated) → (N, heads·D). ``portable`` runs ``fma_tile_portable`` (tests). Taught in day19_2."""
    N, H, D = q.shape
    if D % KV:
        raise ValueError(f"attend_segments_tiled: head dim {D} is not a multiple of {KV}")
    q, k, v = (np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))
    out = np.empty((N, H * D), np.float32)
    for a, b in zip(cu[:-1], cu[1:]):
        n = int(b - a)
        if n == 0:
            continue
        npad = -(-n // KV) * KV
        kt = np.empty((H, D, npad), np.float32)
        vp = np.empty((H, npad, D), np.float32)
        _segment_layout(k, v, int(a), n, npad, kt, vp)
        _attend_segment(q, kt, vp, int(a), n, out, portable)
    return out


__all__ = ["attend_segments_tiled", "fma_tile", "fma_tile_jit", "fma_tile_portable", "exp_rows", "QT", "KV"]
