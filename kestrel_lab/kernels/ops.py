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
   than the block-by-block kernel on the same bytes, and both still pay float work for every few
   integer products: 1 conversion + 1 FMA per 2 (16-lane) or 4 (64-lane) products.
   **Rows as lanes** is the layout that removes it (``repack_q4_0_to_r32``, done by the engine at
   load): for each group of 32 rows and each block, the 32 rows' byte ``j`` sit side by side, so
   one 32-byte load feeds 32 int16 lanes, one lane per *row*. A lane then accumulates its row's
   whole block — 32 products — in an int16 register (unsigned nibbles, with the ``−8·Σx`` correction
   of ``act_block_sums`` as its start value; int16 wrap-around is harmless because the true sum
   fits), and only then converts once and does one FMA with ``d_w·d_x``. Per column of 32 rows the
   loop is a load, an AND, a shift, two ``vpmullw`` and two ``vpaddw`` per 16 rows on 256-bit
   registers: ~8 instructions per 32 weights of a row, all integer, where the 16-lane kernel spends
   ~25 (a third of them scale lookup, conversion and FMA; look with ``asm_summary``). So
   ``matvec_q4_r32`` runs ~2.5–3× faster than the 16-lane kernel (~19–21 GB/s of weights per core
   on the course machine, more than one core's share of DRAM bandwidth when two cores read). The
   scales go to a separate plane, so a group's fp16 → float32 conversion is one contiguous vector
   loop. The same blocks serve the batched prefill (``matmul_q4_r32``): a 512-byte block stays in
   L1 while every token uses it.
4. **Threads**: every matvec splits its output rows into ``nchunk`` contiguous chunks over ``prange``
   (a few per thread so that a slow thread does not leave the others idle). Rows are independent, so
   no reduction crosses threads and the result does not depend on the thread count.
5. **Prefill is a matmul** (``matmul_q4_r32``, ``matmul_q4_8x8l``): for T tokens, each weight block
   is read from DRAM once and used T times from L1, so prefill is compute-bound rather than
   memory-bound and runs at several times the decode token rate. The other formats' batched kernels
   go row by row with the row kept in cache (``matmul_rows_*``).

6. **What limits it now.** The plain-layout loops are compute-bound (~25 instructions per 32
   weights, ~5–7 GB/s of weights per core). The row-interleaved kernel does ~8 and reaches
   ~19–21 GB/s per core with the data in cache; from DRAM one core gets ~16–19 GB/s (compute and
   memory latency together), and two cores reach the measured read bandwidth. What is left is what
   llama.cpp does with hand-written intrinsics: a multiply that sums adjacent byte products (``vpmaddubsw``,
   ``vpdpbusd``: no zero-extension to int16, half the multiplies), which LLVM does not derive from
   this loop and numba reaches only through llvmlite intrinsics, and 512-bit registers (LLVM's
   tuning for this CPU prefers 256-bit ones). ``kestrel-lab bench`` prints each kernel's GB/s beside
   the measured bandwidth. Two numba details matter as much as the arithmetic: index from a slice
   start (``blk[j·32 + r]``, provably ≥ 0, so no negative-index wrap-around and no byte gathers),
   and ``inline="always"`` helpers (no reference counting for the slices passed to them).

Exactness: integer dots are exact, so a Q8_0/Q4_0 result differs from a numpy reference of the same
math only by the order of the float additions across blocks (relative ~1e-6). ``fastmath`` is used
where it lets LLVM reorder float sums; the F32 path then still matches PyTorch within ~1e-6 relative.

All kernels use ``cache=True`` (the cache lives in ``NUMBA_CACHE_DIR``, set by ``import kestrel_lab``):
the first run compiles for tens of seconds, later processes load machine code in milliseconds.
Taught in day03_1–3 (matvec, numba), day05_1–3 (int8 and Q4×Q8 dots, activation quantization),
day06_1–3 and day07_1–3 (SIMD, layouts — rows as lanes in day07_1 —, threads), day08_1–3 (RMSNorm, SwiGLU,
softmax), day23_2 (prefill as a matmul).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from kestrel_lab.quant import half_bits_to_f32

QK = 32           # values per quantization block
Q8_BYTES = 34     # fp16 scale + 32 int8
Q4_BYTES = 18     # fp16 scale + 16 bytes of nibbles
GROUP_BYTES = 144  # one Q4_8X8L record: 8 rows × 18 bytes

# fp16 bits → float32, exact for all 65,536 values (numba has no float16 type on the CPU).
F16_TO_F32 = half_bits_to_f32(np.arange(65536, dtype=np.uint16))


def n_chunks(rows: int, per_thread: int = 4) -> int:
    """How many work units to cut ``rows`` into: a few per numba thread. Taught in day07_2."""
    return max(1, min(rows, numba.get_num_threads() * per_thread))


@intrinsic
def prefetch(typingctx, arr, off):
    """Prefetch (into every cache level, ``llvm.prefetch`` read / locality 3: ``prefetcht0``, ``prfm pldl1keep``)
    the line holding element ``off`` of ``arr``. No bounds check: a prefetch never faults, and a streaming
    kernel asks for data a little past where it is reading (``v16._prefetch_ahead``)."""
    if not (isinstance(arr, types.Array) and isinstance(off, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        a, o = args
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        ptr = builder.bitcast(builder.gep(context.make_array(sig.args[0])(context, builder, a).data, [o]), i8p)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(arr, off), codegen


# ================================================================================ scalar helpers
@intrinsic
def f32_bits(typingctx, d):
    """The bits of a float32 as an int32 (a register move, no memory): for integer tricks on floats."""
    if d != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(d), codegen


@intrinsic
def bits_f32(typingctx, b):
    """The float32 whose bits are the low 32 bits of the integer ``b`` (``f32_bits`` backwards; numba widens
    int32 arithmetic to int64, so any integer is taken and truncated)."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(b), codegen


F16_MIN_NORMAL = np.float32(2.0 ** -14)


@njit(cache=True)
def f16_round(d):
    """Round a non-negative float32 to the nearest fp16 value (ties to even), returned as float32.

    The Q8_0 activation scale is stored as fp16 in llama.cpp's block; rounding it the same way keeps
    the engine's integer dot products identical to ``quant.quantize_q8_0``. Integer work on the bits, no
    library call (it runs once per 32 activations of every decode step): a normal fp16 keeps the top 10 of
    float32's 23 mantissa bits, so add half of the dropped part (minus one unless the kept last bit is
    odd: ties to even) and clear it — a carry into the exponent is the right result too; below 2^-14 the
    fp16 quantum is 2^-24, and ``rint(d·2^24)·2^-24`` is exact in float32. Taught in day05_3.
    """
    d = np.float32(d)
    if d > np.float32(65504.0):
        return np.float32(np.inf)
    if d < F16_MIN_NORMAL:
        return np.float32(np.rint(d * np.float32(2.0 ** 24))) * np.float32(2.0 ** -24)
    b = f32_bits(d)
    return bits_f32((b + np.int32(0xFFF) + ((b >> 13) & 1)) & np.int32(-0x2000))


@njit(fastmath=True, cache=True, inline="always")
def silu(g):
    """``g · sigmoid(g) = g / (1 + e^-g)``, the SiLU of SwiGLU. Below −80 it is ``g·e^g`` (< 1e-33):
    the plain formula would compute ``e^-g`` = inf there, which ``fastmath`` (no-inf) turns into NaN.
    Taught in day08_2."""
    if g > np.float32(-80.0):
        return g / (np.float32(1.0) + np.exp(-g))
    return g * np.exp(g)


# ================================================================================ activations
@njit(cache=True, inline="always")
def _quantize_row(x, xq, xd, t):
    """Row ``t`` of ``quantize_act``: the body both the serial and the row-parallel kernel run."""
    nb = x.shape[1] // QK
    for b in range(nb):
        m = np.int32(0)             # |x|'s largest bits: for non-negative floats the integer order is the
        for j in range(QK):         # float order, and an integer max vectorizes where a float compare did not
            m = max(m, f32_bits(x[t, b * QK + j]) & np.int32(0x7FFFFFFF))
        d = bits_f32(m) / np.float32(127.0)
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        xd[t, b] = f16_round(d)
        for j in range(QK):
            v = x[t, b * QK + j] * inv
            # C's roundf: floor(|v| + 0.5) would round 0.49999997 up (the f32 sum is 1.0)
            a = np.abs(v)
            w = np.floor(a)
            r = w + np.floor(np.float32(2.0) * (a - w))
            xq[t, b * QK + j] = np.int8(-r if v < 0 else r)


@njit(cache=True)
def quantize_act(x, xq, xd):
    """Quantize rows of activations to Q8_0: ``x`` (T, K) float32 → ``xq`` (T, K) int8, ``xd`` (T, K/32).

    Same arithmetic as ``kestrel_lab.quant.quantize_q8_0`` (float32, ``id = 1/d`` from the unrounded
    scale, round half away from zero), the stored scale rounded to fp16. Serial: a decode step's one
    row is too little work for a parallel region (``quantize_rows`` picks). Taught in day05_3.
    """
    for t in range(x.shape[0]):
        _quantize_row(x, xq, xd, t)


@njit(parallel=True, cache=True)
def quantize_act_par(x, xq, xd):
    """``quantize_act`` with the rows spread over the numba threads (a prefill's T rows): rows are
    independent, so the result is the serial one bit for bit. Taught in day23_2."""
    for t in prange(x.shape[0]):
        _quantize_row(x, xq, xd, t)


PAR_MIN_ROWS = 4    # fewer rows than this: a parallel region's hand-off costs more than it saves


def quantize_rows(x, xq, xd):
    """``quantize_act`` or, for ≥ ``PAR_MIN_ROWS`` rows and more than one thread, ``quantize_act_par``
    (measured: +8 % prefill at 2 threads when the row ops stopped running on one core)."""
    if x.shape[0] >= PAR_MIN_ROWS and numba.get_num_threads() > 1:
        quantize_act_par(x, xq, xd)
    else:
        quantize_act(x, xq, xd)


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
                    isum += (((v & 15) - 8) * np.int32(xq[0, b * QK + j])
                             + ((v >> 4) - 8) * np.int32(xq[0, b * QK + 16 + j]))
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
def matmul_rows_q8_0(w, wi, xq, xd, lut, out, nchunk):
    """out[t] = W @ x[t] for T tokens, W in Q8_0: each row stays in cache while all T tokens use it."""
    rows = w.shape[0]
    T = xq.shape[0]
    step = (rows + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(QK, np.float32)
        for r in range(c * step, min(rows, c * step + step)):
            for t in range(T):
                out[t, r] = _dot_q8_0_lanes(w[r], wi[r], xq, xd, lut, t, F)


@njit(cache=True)
def _dot_q4_0_signed(row, xq, xd, lut, t):
    """One plain Q4_0 row · one Q8_0 activation row as **int8 × int8** dots (the A76's ``sdot``),
    read from the file's own bytes: no repacking, no copy.

    ``b ^ 0x88`` flips bit 3 and bit 7 of a byte, so each nibble ``q`` becomes ``q ^ 8``, which read
    as a 4-bit two's-complement number *is* ``q − 8``. Shifted to the top of a byte it is an int8
    multiple of 16: ``int8((b^0x88) << 4) = 16·(q_lo − 8)`` and ``int8((b^0x88) & 0xF0) = 16·(q_hi − 8)``
    (llama.cpp's ``q4_0_4x4`` stores the nibbles that way). The 32 products with the int8
    activations then sum to ``16·Σ (q − 8)·x``, at most 16·32·8·128 = 2^19 in size: it fits int32, and
    ``>> 4`` divides it by 16 exactly. A loop of int8 products summed into int32 is what LLVM turns
    into ``sdot`` for a CPU with dotprod (cortex-a76); x86 has no signed int8 dot, and there LLVM
    leaves the loop scalar (so these kernels are registered for ``dotprod`` only). The float side is
    ``matvec_q4_0_naive``'s, operation for operation, so the results are bit-exact with it — as long as the caller
    is compiled **without** fastmath (LLVM inlines this function, and under fastmath it fuses the multiply and
    add). Taught in day07_1."""
    nb = xd.shape[1]
    acc = np.float32(0.0)
    for b in range(nb):
        o = b * Q4_BYTES
        d = lut[np.int32(row[o]) | (np.int32(row[o + 1]) << 8)] * xd[t, b]
        q = row[o + 2:o + Q4_BYTES]        # indices from a slice start: contiguous loads, no wrap-around
        x = xq[t, b * QK:(b + 1) * QK]
        isum = np.int32(0)
        for j in range(16):       # numba widens int32 products to int64: truncate, so LLVM sees int32 sums
            v = np.int32(q[j] ^ np.uint8(0x88))
            lo = np.int32(np.int8(np.uint8((v << 4) & 0xFF)))
            hi = np.int32(np.int8(np.uint8(v & 0xF0)))
            isum = np.int32(isum + np.int32(lo * np.int32(x[j])) + np.int32(hi * np.int32(x[16 + j])))
        acc += np.float32(isum >> 4) * d
    return acc


def _make_q4_0_kernels(signed: bool):
    """matvec / three matvecs / SwiGLU / matmul / the MoE expert halves on **plain** Q4_0, with the
    16-lane dot (``_dot_q4_0_lanes``, int16, fastmath) or the int8 dot (``_dot_q4_0_signed``, the
    A76's ``sdot``, no fastmath so that it stays bit-exact with ``matvec_q4_0_naive``).

    One body, two compiled variants (as ``kernels.v16._make_kernels``): numba freezes ``signed`` and
    prunes the branch not taken before typing; the closure holds only a bool, which keeps numba's
    on-disk cache key stable."""

    jit = njit(parallel=True, fastmath=not signed, cache=True)

    @jit
    def matvec_q4_0(w, xq, xd, lut, out, nchunk):
        """out = W @ x, W in plain Q4_0 (rows, K/32·18 bytes), one dot per row (any row count).

        Taught in day05_2."""
        rows = w.shape[0]
        step = (rows + nchunk - 1) // nchunk
        for c in prange(nchunk):
            F = np.empty(16, np.float32)
            for r in range(c * step, min(rows, c * step + step)):
                if signed:
                    out[r] = _dot_q4_0_signed(w[r], xq, xd, lut, 0)
                else:
                    out[r] = _dot_q4_0_lanes(w[r], xq, xd, lut, 0, F)

    @jit
    def matvec3_q4_0(wa, wb, wc, xq, xd, lut, oa, ob, oc, nchunk):
        """Three plain-Q4_0 matvecs on the same activation in one parallel region (Q, K, V of a layer):
        decode runs ~200 parallel regions per token and each costs a thread hand-off. Taught in day07_3."""
        na, nb_, nc = oa.shape[0], ob.shape[0], oc.shape[0]
        n = na + nb_ + nc
        step = (n + nchunk - 1) // nchunk
        for c in prange(nchunk):
            F = np.empty(16, np.float32)
            for r in range(c * step, min(n, c * step + step)):
                if r < na:
                    w, o, i = wa, oa, r
                elif r < na + nb_:
                    w, o, i = wb, ob, r - na
                else:
                    w, o, i = wc, oc, r - na - nb_
                if signed:
                    o[i] = _dot_q4_0_signed(w[i], xq, xd, lut, 0)
                else:
                    o[i] = _dot_q4_0_lanes(w[i], xq, xd, lut, 0, F)

    @jit
    def matvec_swiglu_q4_0(wg, wu, xq, xd, lut, out, nchunk):
        """``out = silu(Wg x) · (Wu x)`` for one token, plain Q4_0 gate and up in one pass."""
        rows = out.shape[0]
        step = (rows + nchunk - 1) // nchunk
        for c in prange(nchunk):
            F = np.empty(16, np.float32)
            for r in range(c * step, min(rows, c * step + step)):
                if signed:
                    a = _dot_q4_0_signed(wg[r], xq, xd, lut, 0)
                    u = _dot_q4_0_signed(wu[r], xq, xd, lut, 0)
                else:
                    a = _dot_q4_0_lanes(wg[r], xq, xd, lut, 0, F)
                    u = _dot_q4_0_lanes(wu[r], xq, xd, lut, 0, F)
                out[r] = silu(a) * u

    @jit
    def matmul_rows_q4_0(w, xq, xd, lut, out, nchunk):
        """out[t] = W @ x[t] for T tokens, W in plain Q4_0, row by row: the row stays in L1 while every
        token's dot reads it. Taught in day23_2."""
        rows = w.shape[0]
        T = xq.shape[0]
        step = (rows + nchunk - 1) // nchunk
        for c in prange(nchunk):
            F = np.empty(16, np.float32)
            for r in range(c * step, min(rows, c * step + step)):
                for t in range(T):
                    if signed:
                        out[t, r] = _dot_q4_0_signed(w[r], xq, xd, lut, t)
                    else:
                        out[t, r] = _dot_q4_0_lanes(w[r], xq, xd, lut, t, F)

    @jit
    def experts_swiglu_q4_0(wg, wu, ex, start, tok, xq, xd, lut, out, nchunk):
        """The gate/up half of an MoE layer, on the file's plain Q4_0 expert stacks read in place.

        ``wg``, ``wu``: one layer's (experts, m, m·18/32…) views of ``q4_gate_exps`` / ``q4_up_exps``;
        the (token, slot) pairs routed to active expert ``ex[a]`` are ``start[a]..start[a+1]``, pair ``p``
        reading token ``tok[p]`` of the Q8_0 activations. ``out[p] = silu(Wg[e] x) · (Wu[e] x)``. Work
        items are (active expert, chunk of its rows), so an expert's rows are read once for all its tokens
        (llama.cpp's ``mul_mat_id``), and experts nobody chose are never touched. Taught in day22_2."""
        n_act = ex.shape[0]
        m = wg.shape[1]
        step = (m + nchunk - 1) // nchunk
        for w in prange(n_act * nchunk):
            a = w // nchunk
            c = w - a * nchunk
            e = ex[a]
            F = np.empty(16, np.float32)
            for r in range(c * step, min(m, c * step + step)):
                rg = wg[e, r]
                ru = wu[e, r]
                for p in range(start[a], start[a + 1]):
                    t = tok[p]
                    if signed:
                        g = _dot_q4_0_signed(rg, xq, xd, lut, t)
                        u = _dot_q4_0_signed(ru, xq, xd, lut, t)
                    else:
                        g = _dot_q4_0_lanes(rg, xq, xd, lut, t, F)
                        u = _dot_q4_0_lanes(ru, xq, xd, lut, t, F)
                    out[p, r] = silu(g) * u

    @jit
    def experts_down_q4_0(wd, ex, start, gq, gd, lut, out, nchunk):
        """The down half of an MoE layer: ``out[p] = Wd[e] g[p]`` for each pair ``p`` of active expert
        ``ex[a]``, ``wd`` one layer's (experts, hidden, …) view of ``q4_down_exps`` in place, ``g`` the
        pairs' SwiGLU outputs as Q8_0 (one row per pair). Taught in day22_2."""
        n_act = ex.shape[0]
        h = wd.shape[1]
        step = (h + nchunk - 1) // nchunk
        for w in prange(n_act * nchunk):
            a = w // nchunk
            c = w - a * nchunk
            e = ex[a]
            F = np.empty(16, np.float32)
            for r in range(c * step, min(h, c * step + step)):
                rd = wd[e, r]
                for p in range(start[a], start[a + 1]):
                    if signed:
                        out[p, r] = _dot_q4_0_signed(rd, gq, gd, lut, p)
                    else:
                        out[p, r] = _dot_q4_0_lanes(rd, gq, gd, lut, p, F)

    return (matvec_q4_0, matvec3_q4_0, matvec_swiglu_q4_0, matmul_rows_q4_0, experts_swiglu_q4_0,
            experts_down_q4_0)


(matvec_q4_0, matvec3_q4_0, matvec_swiglu_q4_0, matmul_rows_q4_0, experts_swiglu_q4_0,
 experts_down_q4_0) = _make_q4_0_kernels(False)
(matvec_q4_0_sdot, matvec3_q4_0_sdot, matvec_swiglu_q4_0_sdot, matmul_rows_q4_0_sdot, experts_swiglu_q4_0_sdot,
 experts_down_q4_0_sdot) = _make_q4_0_kernels(True)


@njit(cache=True)
def dequant_rows_f16(w, lut, r0, out):
    """Rows ``r0 … r0+n−1`` of an F16 matrix (uint16 bits) widened to float32 into ``out`` (n, K)."""
    n, K = out.shape
    for i in range(n):
        for k in range(K):
            out[i, k] = lut[w[r0 + i, k]]


@njit(parallel=True, fastmath=True, cache=True)
def matmul_rows_f16(w, x, lut, out, nchunk):
    """out[t] = W @ x[t] for T tokens, W F16 bits: a row is widened once, then used by every token."""
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
    projections that read the same normalized vector share one.
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
    computes its 8 gate and 8 up values and combines them at once."""
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
                out[g * 8 + r] = silu(gv[r]) * uv[r]


@njit(parallel=True, fastmath=True, cache=True)
def matmul_q4_8x8l(w, xe, xd, lut, out, nchunk):
    """out[t] = W @ x[t] for T tokens, W in Q4_8X8L: each 144-byte record is unpacked once (nibbles
    into 4 int16 planes, scales into 64 lanes) and then used by all T tokens."""
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


# ================================================================================ row-interleaved Q4_0
QR = 32                   # rows per group of the row-interleaved decode layout
F16_SCALE = np.float32(5.192296858534828e+33)  # 2^112: see f16_row_to_f32


@njit(parallel=True, cache=True)
def repack_q4_0_to_r32(src, nib, sc, nchunk):
    """Plain Q4_0 (rows, K/32·18) → the split, row-interleaved layout of the decode kernels.

    ``rows`` must be a multiple of 32 (``QR``). Two planes, both ordered (row group, block, …):
    ``nib`` (rows/32, K/32·512) uint8: for group ``g`` and block ``b`` 16 columns of 32 bytes, column
    ``j`` holding byte ``j`` of the block of each of the 32 rows (low nibble = value ``j``, high
    nibble = value ``j + 16``); ``sc`` (rows/32, K/32·32) uint16: the 32 rows' fp16 scale bits of
    each block. Same bytes as the file (18 per 32 weights), another order: one 32-byte load gives the
    same weight position of 32 rows, so the kernel makes *rows* its SIMD lanes, and the scales of a
    whole group convert to float32 in one contiguous vector loop. Taught in day07_1.
    """
    rows, rb = src.shape
    nb = rb // Q4_BYTES
    ng = rows // QR
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        for g in range(c * step, min(ng, c * step + step)):
            for r in range(QR):
                row = src[g * QR + r]
                for b in range(nb):
                    s = b * Q4_BYTES
                    sc[g, b * QR + r] = np.uint16(row[s]) | (np.uint16(row[s + 1]) << 8)
                    for j in range(16):
                        nib[g, b * 16 * QR + j * QR + r] = row[s + 2 + j]


@njit(cache=True)
def act_block_sums(xq, xc):
    """``xc[t, b] = −8 · Σ xq[t, 32b:32b+32]`` as int16 for a Q8_0 activation ``xq`` (T, K) int8.

    The correction that lets the row-interleaved kernels multiply *unsigned* nibbles ``q`` and still
    get Q4_0's ``Σ (q − 8)·x = Σ q·x − 8·Σ x``: computed once per activation vector, it saves a
    subtraction per weight. |xc| ≤ 8·32·127 = 32,512 fits int16. (Widening ``xq`` to int16 here too
    would make each broadcast one instruction: faster with the weights in cache, but measured ~15 %
    slower from DRAM on the course machine, so the kernels read the int8 values.)
    """
    T, K = xq.shape
    for t in range(T):
        for b in range(K // QK):
            s = np.int32(0)
            for j in range(QK):
                s += np.int32(xq[t, b * QK + j])
            xc[t, b] = np.int16(-8 * s)


@njit(fastmath=True, cache=True, inline="always")
def _r32_scales(sc, Si):
    """fp16 scale bits (uint16) → float32 bits in ``Si`` (the bit trick of ``f16_row_to_f32``; the
    caller multiplies by 2^112). A contiguous loop over a whole group: no table, no gather."""
    for i in range(sc.shape[0]):
        h = np.int32(sc[i])
        Si[i] = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13)


@njit(fastmath=True, cache=True, inline="always")
def _r32_block(nib, xr, c, dx, s, F):
    """One block of 32 rows × one token: ``F[r] += (Σ_j (q_rj − 8)·x_j) · d_r·d_x``.

    ``nib``: the block's 512 nibble bytes; ``xr``: its 32 int8 activations; ``c``: their ``−8·Σx``
    (``act_block_sums``); ``dx``: their scale × 2^112; ``s``: the 32 rows' scale bits as float32.
    The row loop is the vectorized one (32 int16 lanes); LLVM unrolls the 16 columns, so the
    accumulator stays in a register and each column costs one 32-byte load, an AND, a shift, two
    ``vpmullw`` and two ``vpaddw`` for 32 rows × 2 weights. int16 wraps around, and that is fine:
    the exact ``Σ (q−8)·x`` lies in ±32,512, so the sum modulo 2^16 *is* the result. Only after
    the 32 products does the block meet floats: one conversion and one FMA per row."""
    for r in range(QR):
        acc = c
        for j in range(16):
            v = np.int16(nib[j * QR + r])
            acc = np.int16(acc + (v & 15) * np.int16(xr[j]) + (v >> 4) * np.int16(xr[16 + j]))
        F[r] += np.float32(acc) * (s[r] * dx)


@njit(fastmath=True, cache=True, inline="always")
def _group_r32(nib, sc, x, xc, xd, F, Si, Sf):
    """The 32 outputs of one row group for one token into ``F``: ``nib``/``sc`` the group's rows of
    the two planes, ``x``/``xc``/``xd`` the token's activation, ``Si``/``Sf`` scratch (K/32·32).

    Slices are taken per block (``nib[b·512:…]``, ``x[b·32:…]``) on purpose: indices counted from a
    slice start are provably ≥ 0, so numba's negative-index wrap-around disappears and LLVM sees
    plain contiguous loads (indexing ``nib[b·512 + j·32 + r]`` directly makes it emit byte gathers).
    The helpers are ``inline="always"``: inlined by numba, the slices cost no reference counting."""
    nb = xd.shape[0]
    _r32_scales(sc, Si)
    for r in range(QR):
        F[r] = 0
    for b in range(nb):
        _r32_block(nib[b * 16 * QR:(b + 1) * 16 * QR], x[b * QK:(b + 1) * QK], xc[b], xd[b] * F16_SCALE,
                   Sf[b * QR:(b + 1) * QR], F)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q4_r32(nib, sc, xq, xc, xd, out, nchunk):
    """out = W @ x, W plain Q4_0 split by ``repack_q4_0_to_r32`` into ``nib`` and ``sc``.

    ``xq``/``xd`` the Q8_0 activation (1, K), (1, K/32); ``xc`` its ``act_block_sums`` (1, K/32).
    Rows are the SIMD lanes: per 32 weights of a row the loop spends ~8 integer vector instructions
    (the 16-lane kernel ~25), and a block's float work is done once per 32 products. Taught in day07_1
    and day06_3.
    """
    ng = nib.shape[0]
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(QR, np.float32)
        Si = np.empty(sc.shape[1], np.int32)
        Sf = Si.view(np.float32)
        for g in range(c * step, min(ng, c * step + step)):
            _group_r32(nib[g], sc[g], xq[0], xc[0], xd[0], F, Si, Sf)
            out[g * QR:(g + 1) * QR] = F


@njit(parallel=True, fastmath=True, cache=True)
def matvec3_q4_r32(na_, sa, nb_, sb, nc_, scc, xq, xc, xd, oa, ob, oc, nchunk):
    """Q, K and V (split row-interleaved Q4_0) on the same activation in one parallel region.

    Taught in day07_3."""
    ga, gb = na_.shape[0], nb_.shape[0]
    ng = ga + gb + nc_.shape[0]
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty(QR, np.float32)
        Si = np.empty(sa.shape[1], np.int32)
        Sf = Si.view(np.float32)
        for g in range(c * step, min(ng, c * step + step)):
            if g < ga:
                _group_r32(na_[g], sa[g], xq[0], xc[0], xd[0], F, Si, Sf)
                oa[g * QR:(g + 1) * QR] = F
            elif g < ga + gb:
                h = g - ga
                _group_r32(nb_[h], sb[h], xq[0], xc[0], xd[0], F, Si, Sf)
                ob[h * QR:(h + 1) * QR] = F
            else:
                h = g - ga - gb
                _group_r32(nc_[h], scc[h], xq[0], xc[0], xd[0], F, Si, Sf)
                oc[h * QR:(h + 1) * QR] = F


@njit(parallel=True, fastmath=True, cache=True)
def matvec_swiglu_q4_r32(ng_, sg, nu, su, xq, xc, xd, out, nchunk):
    """``out = silu(Wg x) · (Wu x)``, split row-interleaved Q4_0 gate and up, one pass."""
    ng = ng_.shape[0]
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        Fg = np.empty(QR, np.float32)
        Fu = np.empty(QR, np.float32)
        Si = np.empty(sg.shape[1], np.int32)
        Sf = Si.view(np.float32)
        for g in range(c * step, min(ng, c * step + step)):
            _group_r32(ng_[g], sg[g], xq[0], xc[0], xd[0], Fg, Si, Sf)
            _group_r32(nu[g], su[g], xq[0], xc[0], xd[0], Fu, Si, Sf)
            for r in range(QR):
                out[g * QR + r] = silu(Fg[r]) * Fu[r]


@njit(parallel=True, fastmath=True, cache=True)
def matmul_q4_r32(nib, sc, xq, xc, xd, out, nchunk):
    """out[t] = W @ x[t] for T tokens, W split row-interleaved Q4_0: a group's scales are converted
    once and each 512-byte block (in L1) serves every token. Taught in day23_2."""
    T = xq.shape[0]
    nb = xd.shape[1]
    ng = nib.shape[0]
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        F = np.empty((T, QR), np.float32)
        Si = np.empty(sc.shape[1], np.int32)
        Sf = Si.view(np.float32)
        for g in range(c * step, min(ng, c * step + step)):
            F[:] = 0
            gn = nib[g]
            _r32_scales(sc[g], Si)
            for b in range(nb):
                blk = gn[b * 16 * QR:(b + 1) * 16 * QR]
                s = Sf[b * QR:(b + 1) * QR]
                for t in range(T):
                    _r32_block(blk, xq[t, b * QK:(b + 1) * QK], xc[t, b], xd[t, b] * F16_SCALE, s, F[t])
            for t in range(T):
                out[t, g * QR:(g + 1) * QR] = F[t]


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


@njit(fastmath=True, cache=True, inline="always")
def _silu_mul_row(gate, up, out, t):
    for i in range(gate.shape[1]):
        out[t, i] = silu(gate[t, i]) * up[t, i]


@njit(fastmath=True, cache=True)
def silu_mul(gate, up, out):
    """SwiGLU's middle: ``silu(gate) · up`` with ``silu(g) = g / (1 + e^-g)``. Taught in day08_2."""
    for t in range(gate.shape[0]):
        _silu_mul_row(gate, up, out, t)


@njit(parallel=True, fastmath=True, cache=True)
def silu_mul_par(gate, up, out):
    """``silu_mul`` with the rows spread over the numba threads: the same float32 bits."""
    for t in prange(gate.shape[0]):
        _silu_mul_row(gate, up, out, t)


def silu_mul_rows(gate, up, out):
    """``silu_mul``, or ``silu_mul_par`` for ≥ ``PAR_MIN_ROWS`` rows on more than one thread."""
    if gate.shape[0] >= PAR_MIN_ROWS and numba.get_num_threads() > 1:
        silu_mul_par(gate, up, out)
    else:
        silu_mul(gate, up, out)


@njit(cache=True)
def softmax_inplace(x, n):
    """Numerically stable softmax of ``x[:n]`` in place: subtract the max before ``exp``.

    The sum is accumulated in float64: over a 151,936-entry vocabulary a float32 running sum drops
    every term below ~6e-8 once it passes 1, and the probabilities would sum to 1.004.
    Taught in day08_3.
    """
    m = x[0]
    for i in range(1, n):
        if x[i] > m:
            m = x[i]
    s = 0.0
    for i in range(n):
        e = np.exp(x[i] - m)
        x[i] = e
        s += e
    inv = 1.0 / s
    for i in range(n):
        x[i] *= inv


@njit(cache=True)
def embed_f16(table, ids, lut, out):
    """Rows of an F16 embedding table (uint16 bits) for ``ids`` → float32 (T, D). Taught in day23_1."""
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
