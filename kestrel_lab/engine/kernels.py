"""The engine's numba kernels: matvec/matmul on every weight format, and the small vector ops.

The story these kernels tell (days 3–7, 23), in the order a student meets it:

1. **Decode is a matvec, and a matvec is memory-bound.** One token multiplies every weight matrix by
   one vector: 2 FLOPs per weight, and every weight comes from DRAM once. The speed limit is the read
   bandwidth divided by the bytes of weights (``roofline.decode_ceiling``); Q4_0 stores a weight in
   4.5 bits (18 bytes per 32), which is why int4 decodes ~7× faster than fp32 on the same machine.
2. **Integers inside the block, floats outside** (llama.cpp's scheme). The activation vector is
   quantized on the fly to Q8_0 (``quantize_act``: per 32-block ``d = max|x| / 127``, ``q = round(x/d)``,
   the scale rounded to fp16 as llama.cpp stores it). Each weight block then costs one *integer* dot
   product of 32 nibbles × 32 int8 values — exact, order-free — and a single float multiply by
   ``d_w · d_x``. ``matvec_q4_0_naive`` is that scheme written block by block: correct, readable, and slow
   (~1 GB/s of weights per core), because each 32-value block ends in a horizontal sum and a scale
   multiply that the vectorizer cannot overlap with the next block. ``matvec_q4_0``/``matvec_q8_0``
   keep one float accumulator per lane (16 or 32 lanes) instead, and sum the lanes once per row: the
   same exact integer products, 2–3× faster, still on the plain layout.
3. **The loop shape decides the speed, then the layout.** Both fast kernels keep one float
   accumulator per SIMD lane and sum the lanes once per row, so no block ends in a horizontal sum.
   ``matvec_q4_0`` does it on the plain layout: 16 lanes = the 16 bytes of a block (low nibble ×
   ``x[j]`` + high nibble × ``x[j+16]`` in int16), a float FMA per lane per block. ``matvec_q4_8x8l``
   does it on Q4_8X8L (``kestrel_lab.quant``), where the 8 rows of a group store the same block
   column side by side: a 64-byte tile holds 8 bytes of each of 8 rows, and the kernel computes 64
   independent lanes (lane ``L`` = row ``L // 8``, byte ``L % 8``) with contiguous loads. Details that
   make LLVM emit packed AVX2/AVX-512 code (check with ``asm_summary`` or
   ``kernel.inspect_asm(kernel.signatures[0])``): the activation is pre-expanded to the lane pattern
   (``expand_act_8x8``: 5 planes × 64 int16 per block, the 5th being the ``-8·Σx`` correction so
   nibbles stay unsigned), integer arithmetic stays in int16 (products ≤ 15·127, sums ≤ 4·15·127),
   per-lane scales are broadcast into a 64-float array before the lane loop. Both run ~5–7× faster
   than the block-by-block kernel on the same bytes. On the course machine the plain 16-lane kernel
   decodes faster (it reads 32 activation bytes per 18 weight bytes; the 64-lane one reads 5 int16
   planes per record), while the 8-row layout wins the batched prefill (``matmul_q4_8x8l``), where
   each record's nibbles are unpacked once for all tokens.
4. **Threads**: every matvec splits its output rows into ``nchunk`` contiguous chunks over ``prange``
   (a few per thread so that a slow thread does not leave the others idle). Rows are independent, so
   no reduction crosses threads and the result does not depend on the thread count.
5. **Prefill is a matmul** (``matmul_q4_8x8l``): for T tokens, each weight tile is unpacked once into
   registers/L1 and used T times, so prefill is compute-bound rather than memory-bound and runs at
   many times the decode token rate. The other formats' batched kernels go row by row with the row
   kept in cache (``matmul_rows_*``).

6. **What limits it now.** These loops are compute-bound, not memory-bound: per 32 weights LLVM
   emits ~12–15 vector instructions (nibble split, int16 multiplies on 256-bit registers, int16 →
   float conversion, an FMA, accumulators reloaded from L1), which runs at roughly 5–7 GB/s of
   weights per core on the course machine — well below one core's share of DRAM bandwidth — so
   decode reaches about half of the bandwidth ceiling with two threads. The next steps are the ones
   llama.cpp takes: a multiply that sums adjacent byte products (``vpmaddubsw``/``vpdpbusd``, which
   numba reaches only through llvmlite intrinsics), the 4×4 nibble order of day07_1, and
   accumulators that never leave registers. ``kestrel-lab bench`` prints each kernel's GB/s beside
   the measured bandwidth.

Exactness: integer dots are exact, so a Q8_0/Q4_0 result differs from a numpy reference of the same
math only by the order of the float additions across blocks (relative ~1e-6). ``fastmath`` is used
where it lets LLVM reorder float sums; the F32 path then still matches PyTorch within ~1e-6 relative.

All kernels use ``cache=True`` (the cache lives in ``NUMBA_CACHE_DIR``, set by ``import kestrel_lab``):
the first run compiles for tens of seconds, later processes load machine code in milliseconds.
Taught in day03_1–3 (matvec, numba), day05_1–3 (int8 and Q4×Q8 dots, activation quantization),
day06_1–3 and day07_1–3 (SIMD, layouts, threads), day08_1–3 (RMSNorm, SwiGLU, softmax), day23_2
(prefill as a matmul).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

QK = 32           # values per quantization block
Q8_BYTES = 34     # fp16 scale + 32 int8
Q4_BYTES = 18     # fp16 scale + 16 bytes of nibbles
GROUP_BYTES = 144  # one Q4_8X8L record: 8 rows × 18 bytes

# fp16 bits → float32, exact for all 65,536 values (numba has no float16 type on the CPU).
F16_TO_F32 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)


def n_chunks(rows: int, per_thread: int = 4) -> int:
    """How many work units to cut ``rows`` into: a few per numba thread. Taught in day07_2."""
    return max(1, min(rows, numba.get_num_threads() * per_thread))


# ================================================================================ scalar helpers
@njit(cache=True)
def f16_round(d):
    """Round a non-negative float to the nearest fp16 value (ties to even), returned as float32.

    The Q8_0 activation scale is stored as fp16 in llama.cpp's block; rounding it the same way keeps
    the engine's integer dot products identical to ``quant.quantize_q8_0``. Taught in day05_3.
    """
    if d == 0.0:
        return np.float32(0.0)
    if d > 65504.0:
        return np.float32(np.inf)
    m, e = math.frexp(np.float64(d))       # d = m · 2^e, 0.5 ≤ m < 1
    sh = e - 11                            # fp16 keeps 11 significant bits ...
    if sh < -24:                           # ... down to the subnormal quantum 2^-24
        sh = -24
    q = math.ldexp(1.0, sh)
    return np.float32(np.rint(np.float64(d) / q) * q)


# ================================================================================ activations
@njit(cache=True)
def quantize_act(x, xq, xd):
    """Quantize rows of activations to Q8_0: ``x`` (T, K) float32 → ``xq`` (T, K) int8, ``xd`` (T, K/32).

    Same arithmetic as ``kestrel_lab.quant.quantize_q8_0`` (float32, ``id = 1/d`` from the unrounded
    scale, round half away from zero), the stored scale rounded to fp16. Taught in day05_3.
    """
    T, K = x.shape
    nb = K // QK
    for t in range(T):
        for b in range(nb):
            amax = np.float32(0.0)
            for j in range(QK):
                a = abs(x[t, b * QK + j])
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            xd[t, b] = f16_round(d)
            for j in range(QK):
                v = x[t, b * QK + j] * inv
                r = math.floor(abs(v) + np.float32(0.5))
                xq[t, b * QK + j] = -r if v < 0 else r


@njit(cache=True)
def expand_act_8x8(xq, xe):
    """Q8_0 activations (T, K) int8 → the lane pattern of Q4_8X8L: ``xe`` (T, K/32, 5, 64) int16.

    For lane ``L`` (row ``L // 8``, byte ``k = L % 8`` of a tile) the planes are the activations the
    tile nibbles multiply: ``x[k]``, ``x[16+k]`` (tile 0 low/high), ``x[8+k]``, ``x[24+k]`` (tile 1),
    and ``-8·(x[k]+x[8+k]+x[16+k]+x[24+k])``, which turns unsigned nibbles into Q4_0's ``q − 8``.
    Taught in day06_2.
    """
    T, K = xq.shape
    nb = K // QK
    for t in range(T):
        for b in range(nb):
            base = b * QK
            for L in range(64):
                k = L & 7
                a0 = np.int16(xq[t, base + k])
                a1 = np.int16(xq[t, base + 16 + k])
                a2 = np.int16(xq[t, base + 8 + k])
                a3 = np.int16(xq[t, base + 24 + k])
                xe[t, b, 0, L] = a0
                xe[t, b, 1, L] = a1
                xe[t, b, 2, L] = a2
                xe[t, b, 3, L] = a3
                xe[t, b, 4, L] = np.int16(-8 * (np.int32(a0) + a1 + a2 + a3))


# ================================================================================ float weights
@njit(parallel=True, fastmath=True, cache=True)
def matvec_f32(w, x, out, nchunk):
    """out = W @ x for an F32 (rows, K) matrix: one contiguous dot per row. Taught in day03_2."""
    rows, K = w.shape
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        for r in range(c * step, min(rows, c * step + step)):
            acc = np.float32(0.0)
            for k in range(K):
                acc += w[r, k] * x[k]
            out[r] = acc


@njit(fastmath=True, cache=True)
def f16_row_to_f32(src, bits, vals):
    """Convert a row of fp16 bits (uint16) to float32 without a table: ``vals`` is ``bits`` viewed as
    float32. Shifting the 15 exponent+mantissa bits up by 13 gives a float32 whose value is the
    fp16 value × 2^-112 (subnormals included); one multiply by 2^112 fixes the scale. Every step is a
    plain vector op, so this converts 8–16 values per instruction (inf/NaN are not expected in weights
    and come out as large finite numbers). Taught in day02_2.
    """
    for k in range(src.shape[0]):
        h = np.int32(src[k])
        bits[k] = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13)
    for k in range(src.shape[0]):
        vals[k] = vals[k] * np.float32(5.192296858534828e+33)   # 2^112


@njit(parallel=True, fastmath=True, cache=True)
def matvec_f16(w, x, lut, out, nchunk):
    """out = W @ x for an F16 matrix given as its uint16 bits (rows, K).

    Two bytes per weight: half the traffic of F32; each row is widened into a float32 scratch row
    (``f16_row_to_f32``), then dotted. ``lut`` is unused here (kept for a uniform signature).
    Taught in day02_2.
    """
    rows, K = w.shape
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        bits = np.empty(K, np.int32)
        vals = bits.view(np.float32)
        for r in range(c * step, min(rows, c * step + step)):
            f16_row_to_f32(w[r], bits, vals)
            acc = np.float32(0.0)
            for k in range(K):
                acc += vals[k] * x[k]
            out[r] = acc


# ================================================================================ block formats
@njit(fastmath=True, cache=True)
def _dot_q8_0_lanes(row, rowi, xq, xd, lut, t, F):
    """One Q8_0 row · one Q8_0 activation row (token ``t``), 32 lanes: lane ``j`` accumulates, in
    float, the exact int16 product of value ``j`` of every block times that block's ``d_w·d_x``.
    ``row`` is the uint8 view (for the fp16 scales), ``rowi`` the same bytes as int8; ``F`` scratch (32,).
    No horizontal sum until the end of the row, so LLVM keeps the 32 lanes in vector registers."""
    nb = xd.shape[1]
    F[:] = 0
    for b in range(nb):
        o = b * Q8_BYTES
        d = lut[np.int32(row[o]) | (np.int32(row[o + 1]) << 8)] * xd[t, b]
        for j in range(QK):
            F[j] += np.float32(np.int16(rowi[o + 2 + j]) * np.int16(xq[t, b * QK + j])) * d
    acc = np.float32(0.0)
    for j in range(QK):
        acc += F[j]
    return acc


@njit(fastmath=True, cache=True)
def _dot_q4_0_lanes(row, xq, xd, lut, t, F):
    """One plain Q4_0 row · one Q8_0 activation row, 16 lanes (byte ``j`` of each block: its low
    nibble times ``x[j]`` plus its high nibble times ``x[j+16]``, in int16), float accumulators."""
    nb = xd.shape[1]
    F[:] = 0
    for b in range(nb):
        o = b * Q4_BYTES
        d = lut[np.int32(row[o]) | (np.int32(row[o + 1]) << 8)] * xd[t, b]
        for j in range(16):
            v = row[o + 2 + j]
            p = ((np.int16(v & 15) - 8) * np.int16(xq[t, b * QK + j])
                 + (np.int16(v >> 4) - 8) * np.int16(xq[t, b * QK + 16 + j]))
            F[j] += np.float32(np.int16(p)) * d
    acc = np.float32(0.0)
    for j in range(16):
        acc += F[j]
    return acc


@njit(parallel=True, cache=True)
def matvec_q4_0_naive(w, xq, xd, lut, out, nchunk):
    """out = W @ x, W plain Q4_0: the first kernel anyone writes — per block a 16-byte integer dot,
    then a horizontal sum and a scale multiply. Correct and slow (~1 GB/s of weights per core); kept
    as the baseline that ``kestrel-lab bench`` and the notebooks compare against. Taught in day05_2.
    """
    rows = w.shape[0]
    nb = xd.shape[1]
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        for r in range(c * step, min(rows, c * step + step)):
            row = w[r]
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * Q4_BYTES
                d = lut[np.int32(row[o]) | (np.int32(row[o + 1]) << 8)] * xd[0, b]
                isum = np.int32(0)
                for j in range(16):
                    v = np.int32(row[o + 2 + j])
                    isum += ((v & 15) - 8) * np.int32(xq[0, b * QK + j]) + ((v >> 4) - 8) * np.int32(xq[0, b * QK + 16 + j])
                acc += np.float32(isum) * d
            out[r] = acc


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q8_0(w, wi, xq, xd, lut, out, nchunk):
    """out = W @ x, W in Q8_0 (rows, K/32·34 bytes; ``wi`` the same bytes viewed as int8), x as Q8_0
    (1, K) int8 + (1, K/32) scales. Taught in day05_1."""
    rows = w.shape[0]
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(QK, np.float32)
        for r in range(c * step, min(rows, c * step + step)):
            out[r] = _dot_q8_0_lanes(w[r], wi[r], xq, xd, lut, 0, F)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q4_0(w, xq, xd, lut, out, nchunk):
    """out = W @ x, W in plain Q4_0 (rows, K/32·18 bytes), 16 float lanes per row (any row count).

    Taught in day05_2.
    """
    rows = w.shape[0]
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(16, np.float32)
        for r in range(c * step, min(rows, c * step + step)):
            out[r] = _dot_q4_0_lanes(w[r], xq, xd, lut, 0, F)


@njit(parallel=True, fastmath=True, cache=True)
def matvec3_q4_0(wa, wb, wc, xq, xd, lut, oa, ob, oc, nchunk):
    """Three plain-Q4_0 matvecs on the same activation in one parallel region (Q, K, V of a layer):
    decode runs ~200 parallel regions per token and each costs a thread hand-off. Taught in day11_2."""
    na, nb_, nc = oa.shape[0], ob.shape[0], oc.shape[0]
    n = na + nb_ + nc
    step = (n + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(16, np.float32)
        for r in range(c * step, min(n, c * step + step)):
            if r < na:
                oa[r] = _dot_q4_0_lanes(wa[r], xq, xd, lut, 0, F)
            elif r < na + nb_:
                ob[r - na] = _dot_q4_0_lanes(wb[r - na], xq, xd, lut, 0, F)
            else:
                oc[r - na - nb_] = _dot_q4_0_lanes(wc[r - na - nb_], xq, xd, lut, 0, F)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_swiglu_q4_0(wg, wu, xq, xd, lut, out, nchunk):
    """``out = silu(Wg x) · (Wu x)`` for one token, plain Q4_0 gate and up in one pass. Taught in day08_2."""
    rows = out.shape[0]
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(16, np.float32)
        for r in range(c * step, min(rows, c * step + step)):
            a = _dot_q4_0_lanes(wg[r], xq, xd, lut, 0, F)
            u = _dot_q4_0_lanes(wu[r], xq, xd, lut, 0, F)
            out[r] = a / (np.float32(1.0) + np.exp(-a)) * u


@njit(parallel=True, fastmath=True, cache=True)
def matmul_rows_q8_0(w, wi, xq, xd, lut, out, nchunk):
    """out[t] = W @ x[t] for T tokens, W in Q8_0: each row stays in cache while all T tokens use it.

    Taught in day23_2.
    """
    rows = w.shape[0]
    T = xq.shape[0]
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(QK, np.float32)
        for r in range(c * step, min(rows, c * step + step)):
            for t in range(T):
                out[t, r] = _dot_q8_0_lanes(w[r], wi[r], xq, xd, lut, t, F)


@njit(parallel=True, fastmath=True, cache=True)
def matmul_rows_q4_0(w, xq, xd, lut, out, nchunk):
    """out[t] = W @ x[t] for T tokens, W in plain Q4_0, row by row: the row stays in L1 while every
    token's 16-lane dot (``_dot_q4_0_lanes``) reads it. Taught in day23_2."""
    rows = w.shape[0]
    T = xq.shape[0]
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(16, np.float32)
        for r in range(c * step, min(rows, c * step + step)):
            for t in range(T):
                out[t, r] = _dot_q4_0_lanes(w[r], xq, xd, lut, t, F)


@njit(parallel=True, fastmath=True, cache=True)
def matmul_rows_f16(w, x, lut, out, nchunk):
    """out[t] = W @ x[t] for T tokens, W F16 bits: a row is widened once, then used by every token.

    Taught in day23_2.
    """
    rows, K = w.shape
    T = x.shape[0]
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        bits = np.empty(K, np.int32)
        vals = bits.view(np.float32)
        for r in range(c * step, min(rows, c * step + step)):
            f16_row_to_f32(w[r], bits, vals)
            for t in range(T):
                acc = np.float32(0.0)
                for k in range(K):
                    acc += vals[k] * x[t, k]
                out[t, r] = acc


@njit(fastmath=True, cache=True)
def _group_8x8l(w, g, xe, xd, lut, F, S, out, o0):
    """The 8 outputs of row group ``g`` of a Q4_8X8L matrix into ``out[o0:o0+8]`` (one token)."""
    nb = xd.shape[1]
    gbytes = nb * GROUP_BYTES
    F[:] = 0
    for b in range(nb):
        o = g * gbytes + b * GROUP_BYTES
        blk = w[o:o + GROUP_BYTES]
        x = xe[0, b]
        dx = xd[0, b]
        for r in range(8):
            s = lut[np.int32(blk[2 * r]) | (np.int32(blk[2 * r + 1]) << 8)] * dx
            for k in range(8):
                S[r * 8 + k] = s
        for L in range(64):
            v0 = blk[16 + L]
            v1 = blk[80 + L]
            p = np.int16(np.int16(v0 & 15) * x[0, L] + np.int16(v0 >> 4) * x[1, L]
                         + np.int16(v1 & 15) * x[2, L] + np.int16(v1 >> 4) * x[3, L] + x[4, L])
            F[L] += np.float32(p) * S[L]
    for r in range(8):
        acc = np.float32(0.0)
        for k in range(8):
            acc += F[r * 8 + k]
        out[o0 + r] = acc


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q4_8x8l(w, xe, xd, lut, out, nchunk):
    """out = W @ x, W in Q4_8X8L (flat bytes, rows/8 groups × K/32 records of 144 bytes).

    ``xe`` is ``expand_act_8x8`` of the Q8_0 activation (1, K/32, 5, 64), ``xd`` its scales (1, K/32).
    64 lanes per record, int16 products, one float accumulator per lane: see the module docstring.
    Taught in day06_2 and day07_3.
    """
    ng = out.shape[0] // 8
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(64, np.float32)
        S = np.empty(64, np.float32)
        for g in range(c * step, min(ng, c * step + step)):
            _group_8x8l(w, g, xe, xd, lut, F, S, out, g * 8)


@njit(parallel=True, fastmath=True, cache=True)
def matvec3_q4_8x8l(wa, wb, wc, xe, xd, lut, oa, ob, oc, nchunk):
    """Three Q4_8X8L matvecs on the same activation in one parallel region (Q, K and V of a layer).

    Decode runs ~200 parallel regions per token; each costs a thread hand-off, so the three
    projections that read the same normalized vector share one. Taught in day11_2.
    """
    na, nb_, nc = oa.shape[0] // 8, ob.shape[0] // 8, oc.shape[0] // 8
    ng = na + nb_ + nc
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(64, np.float32)
        S = np.empty(64, np.float32)
        for g in range(c * step, min(ng, c * step + step)):
            if g < na:
                _group_8x8l(wa, g, xe, xd, lut, F, S, oa, g * 8)
            elif g < na + nb_:
                _group_8x8l(wb, g - na, xe, xd, lut, F, S, ob, (g - na) * 8)
            else:
                _group_8x8l(wc, g - na - nb_, xe, xd, lut, F, S, oc, (g - na - nb_) * 8)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_swiglu_q4_8x8l(wg, wu, xe, xd, lut, out, nchunk):
    """``out = silu(Wg x) · (Wu x)`` for one token, Q4_8X8L gate and up in one pass: each row group
    computes its 8 gate and 8 up values and combines them at once. Taught in day08_2."""
    ng = out.shape[0] // 8
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(64, np.float32)
        S = np.empty(64, np.float32)
        gv = np.empty(8, np.float32)
        uv = np.empty(8, np.float32)
        for g in range(c * step, min(ng, c * step + step)):
            _group_8x8l(wg, g, xe, xd, lut, F, S, gv, 0)
            _group_8x8l(wu, g, xe, xd, lut, F, S, uv, 0)
            for r in range(8):
                a = gv[r]
                out[g * 8 + r] = a / (np.float32(1.0) + np.exp(-a)) * uv[r]


@njit(parallel=True, fastmath=True, cache=True)
def matmul_q4_8x8l(w, xe, xd, lut, out, nchunk):
    """out[t] = W @ x[t] for T tokens, W in Q4_8X8L: each 144-byte record is unpacked once (nibbles
    into 4 int16 planes, scales into 64 lanes) and then used by all T tokens. Taught in day23_2."""
    rows = out.shape[1]
    T = xe.shape[0]
    nb = xd.shape[1]
    ng = rows // 8
    gbytes = nb * GROUP_BYTES
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty((T, 64), np.float32)
        S = np.empty(64, np.float32)
        N = np.empty((4, 64), np.int16)
        for g in range(c * step, min(ng, c * step + step)):
            F[:] = 0
            for b in range(nb):
                o = g * gbytes + b * GROUP_BYTES
                blk = w[o:o + GROUP_BYTES]
                for r in range(8):
                    s = lut[np.int32(blk[2 * r]) | (np.int32(blk[2 * r + 1]) << 8)]
                    for k in range(8):
                        S[r * 8 + k] = s
                for L in range(64):
                    v0 = blk[16 + L]
                    v1 = blk[80 + L]
                    N[0, L] = np.int16(v0 & 15)
                    N[1, L] = np.int16(v0 >> 4)
                    N[2, L] = np.int16(v1 & 15)
                    N[3, L] = np.int16(v1 >> 4)
                for t in range(T):
                    x = xe[t, b]
                    dx = xd[t, b]
                    Ft = F[t]
                    for L in range(64):
                        p = np.int16(N[0, L] * x[0, L] + N[1, L] * x[1, L] + N[2, L] * x[2, L]
                                     + N[3, L] * x[3, L] + x[4, L])
                        Ft[L] += np.float32(p) * (S[L] * dx)
            for t in range(T):
                for r in range(8):
                    acc = np.float32(0.0)
                    for k in range(8):
                        acc += F[t, r * 8 + k]
                    out[t, g * 8 + r] = acc


@njit(parallel=True, cache=True)
def repack_q4_0_to_8x8l(src, dst, nchunk):
    """Plain Q4_0 (rows, K/32·18) → Q4_8X8L flat bytes, in parallel (``quant.repack_q4_8x8l`` in numba).

    The engine calls this once at load for plain Q4_0 files so that decode runs the fast layout; it
    costs a copy of the weights (not zero-copy), which is why ``--quant q4_8x8l`` files exist.
    Taught in day06_2.
    """
    rows, rb = src.shape
    nb = rb // Q4_BYTES
    ng = rows // 8
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        for g in range(c * step, min(ng, c * step + step)):
            for b in range(nb):
                o = (g * nb + b) * GROUP_BYTES
                for r in range(8):
                    s = b * Q4_BYTES
                    row = src[g * 8 + r]
                    dst[o + 2 * r] = row[s]
                    dst[o + 2 * r + 1] = row[s + 1]
                    for k in range(8):
                        dst[o + 16 + r * 8 + k] = row[s + 2 + k]
                        dst[o + 80 + r * 8 + k] = row[s + 10 + k]


# ================================================================================ vector ops
@njit(fastmath=True, cache=True)
def rmsnorm(x, w, eps, out):
    """RMSNorm over the last axis of ``x`` (T, D): ``x / sqrt(mean(x²) + eps) · w``.

    The mean of squares is accumulated in float64 so the result does not depend on D's size.
    Taught in day08_1.
    """
    T, D = x.shape
    for t in range(T):
        ss = 0.0
        for i in range(D):
            v = np.float64(x[t, i])
            ss += v * v
        inv = np.float32(1.0 / math.sqrt(ss / D + eps))
        for i in range(D):
            out[t, i] = (x[t, i] * inv) * w[i]


@njit(fastmath=True, cache=True)
def rmsnorm_heads(x, w, eps):
    """In-place RMSNorm of every head: ``x`` (T, heads, head_dim), ``w`` (head_dim,): Qwen3's q/k norm.

    Taught in day09_3.
    """
    T, H, D = x.shape
    for t in range(T):
        for h in range(H):
            ss = 0.0
            for i in range(D):
                v = np.float64(x[t, h, i])
                ss += v * v
            inv = np.float32(1.0 / math.sqrt(ss / D + eps))
            for i in range(D):
                x[t, h, i] = (x[t, h, i] * inv) * w[i]


@njit(fastmath=True, cache=True)
def silu_mul(gate, up, out):
    """SwiGLU's middle: ``silu(gate) · up`` with ``silu(g) = g / (1 + e^-g)``. Taught in day08_2."""
    T, D = gate.shape
    for t in range(T):
        for i in range(D):
            g = gate[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * up[t, i]


@njit(cache=True)
def softmax_inplace(x, n):
    """Numerically stable softmax of ``x[:n]`` in place: subtract the max before ``exp``.

    Taught in day08_3.
    """
    m = x[0]
    for i in range(1, n):
        if x[i] > m:
            m = x[i]
    s = np.float32(0.0)
    for i in range(n):
        e = np.exp(x[i] - m)
        x[i] = e
        s += e
    inv = np.float32(1.0) / s
    for i in range(n):
        x[i] *= inv


@njit(cache=True)
def embed_f16(table, ids, lut, out):
    """Rows of an F16 embedding table (uint16 bits) for ``ids`` → float32 (T, D). Taught in day12_2."""
    D = table.shape[1]
    for t in range(ids.shape[0]):
        row = table[ids[t]]
        for i in range(D):
            out[t, i] = lut[row[i]]


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of a 1-D float array (a copy, float32). Taught in day08_3."""
    y = np.array(x, dtype=np.float32)
    softmax_inplace(y, y.shape[0])
    return y


def asm_summary(kernel, signature: int = 0) -> dict:
    """What LLVM made of a compiled kernel: instruction count and how many touch 512-, 256- and 128-bit
    registers (zmm/ymm/xmm), plus the most frequent mnemonics. Packed integer multiplies
    (``vpmullw``/``vpmaddwd``) in the hot loop mean it vectorized; a wall of ``vaddss`` means it did
    not. Call the kernel once first so that it is compiled. Taught in day06_1.
    """
    from collections import Counter

    if not kernel.signatures:
        raise ValueError(f"{kernel.__name__} has not been compiled yet: call it once first")
    import warnings

    def parse(asm: str):
        ops, regs = Counter(), Counter()
        for line in asm.splitlines():
            s = line.strip()
            if not s or s.startswith((".", "#")) or s.endswith(":"):
                continue
            ops[s.split()[0]] += 1
            for r in ("zmm", "ymm", "xmm"):
                if r in s:
                    regs[r] += 1
                    break
        return ops, regs

    sig = kernel.signatures[signature]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops, regs = parse(kernel.inspect_asm(sig))
    if not ops:
        # Loaded from numba's on-disk cache: machine code without its assembly text. Compile a
        # private, uncached copy of the same function for the same signature to see it.
        opts = {k: v for k, v in kernel.targetoptions.items() if k in ("parallel", "fastmath")}
        fresh = njit(**opts)(kernel.py_func)
        fresh.compile(sig)
        ops, regs = parse(fresh.inspect_asm(sig))
    return {"instructions": sum(ops.values()), "zmm": regs["zmm"], "ymm": regs["ymm"], "xmm": regs["xmm"],
            "top": ops.most_common(12)}
