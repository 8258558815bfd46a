"""Q4_0 × Q8_0 with ``vpdpbusd`` (AVX-512 VNNI) or ``vpmaddubsw`` (AVX2): the 16-row layout and its kernels.

``kernels.ops.matvec_q4_r32`` makes rows its SIMD lanes but still multiplies in int16: per 32 weights of
32 rows it spends a load, an AND, a shift, two ``vpmullw`` and two ``vpaddw`` per column. VNNI's
``vpdpbusd`` multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four products
into one of 16 int32 lanes — one instruction for what took four. LLVM never forms it from a plain
loop (checked on LLVM 22), so it is called here through an llvmlite intrinsic
(``numba.extending.intrinsic``), the way llama.cpp calls ``_mm512_dpbusd_epi32``.

**Layout ``Q4_0_V16``** (made at load from plain Q4_0 by ``repack_q4_0_to_v16``, same 18 bytes per 32
weights, another order): rows in groups of 16 (one int32 lane each); for group ``g`` and block ``b``,
256 nibble bytes as 4 chunks of 64: chunk ``k`` holds bytes ``4k … 4k+3`` of the block of each of the
16 rows (row ``r`` at ``64k + 4r``). Byte ``j`` of a Q4_0 block holds weight ``j`` in its low nibble and
weight ``j + 16`` in its high nibble, so one 64-byte load, an AND and a shift give the unsigned
weights ``4k … 4k+3`` and ``16+4k … 16+4k+3`` of 16 rows, and each meets its four int8 activations,
broadcast to every lane as one int32 word. Eight ``vpdpbusd`` per block and group; the ``−8·Σx``
correction of ``kernels.ops.act_block_sums`` is the accumulator's start value (nibbles stay unsigned,
as ``vpdpbusd`` wants its first operand). The 16 rows' fp16 scales sit in a separate plane, as in
``Q4_0_R32``. Then one conversion, one multiply by ``d_w·d_x`` and one add per row and block — all
in registers (``block16_fma``): a lane never leaves its register between the integer sum and the
float accumulator. The conversion is one ``vcvtph2ps`` of the block's 16 fp16 scales (exact, so the
same bits as the portable kernels' shift trick): converting a group's scales in a scalar pass first
cost more instructions than the block itself, and took ~10 % off a decode matvec read from memory
(course EPYC VM, bit-identical outputs). Prefill (``matmul``) goes four tokens at a time through ``block16x4_fma``: the
block's 4 loads, ANDs and shifts are done once and its 8 nibble vectors stay in registers for the
four tokens' 32 ``vpdpbusd`` (the ``T % 4`` tokens left over go one by one).

**AVX2 hosts** (no VNNI: AMD Zen 2/3, Intel before Ice Lake) get the same layout and kernels with
another block: ``vpmaddubsw`` (u8 × s8, adjacent pairs summed into int16) and one ``vpmaddwd`` by ones
per block turn the same bytes into the same exact int32 sums (``_block_dot_ir``); LLVM splits each
512-bit vector into two ymm halves there, and keeps it in zmm registers on an AVX-512 host.

Every kernel has a **portable** twin on the same layout (plain loops, any CPU) that computes the same
exact integer sums; the registry picks the VNNI one where the host reports ``avx512_vnni``, else the
AVX2 one where it reports ``avx2``. The
intrinsic names an x86 instruction: on another ISA it is never compiled, because the registry never
selects it there (numba compiles on first call). Taught in day06_1 (the intrinsic), day06_3 (the layout
table) and day07_1 (the same pattern with 4 rows: the A76's ``q4_0_4x4``).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from kestrel_lab.kernels import ops as K

QV = 16                     # rows per group: one int32 lane of a 512-bit register each
BLOCK_BYTES = 16 * QV       # nibble bytes of one block of a group (4 chunks of 64)
_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_V64I8, _V16I32, _V16F = ir.VectorType(_I8, 64), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_V32I8, _V16I16, _V8I32 = ir.VectorType(_I8, 32), ir.VectorType(ir.IntType(16), 16), ir.VectorType(_I32, 8)
_V16H = ir.VectorType(ir.HalfType(), 16)
_LANES0 = ir.Constant(ir.VectorType(_I32, 16), [0] * 16)
ISAS = ("vnni", "avx2")     # the x86 forms of the block: ``vpdpbusd``, or ``vpmaddubsw`` + ``vpmaddwd``


# ------------------------------------------------------------------------------ the layout
@njit(parallel=True, cache=True)
def repack_q4_0_to_v16(src, nib, sc, nchunk):
    """Plain Q4_0 (rows, K/32·18) → ``Q4_0_V16``: ``nib`` (rows/16, K/32·256) uint8 and ``sc``
    (rows/16, K/32·16) uint16, the rows' fp16 scale bits per block (see the module docstring).

    ``rows`` must be a multiple of 16. Taught in day06_3 and day07_1."""
    rows, rb = src.shape
    nb = rb // K.Q4_BYTES
    ng = rows // QV
    step = (ng + nchunk - 1) // nchunk
    for c in prange(nchunk):
        for g in range(c * step, min(ng, c * step + step)):
            for r in range(QV):
                row = src[g * QV + r]
                for b in range(nb):
                    s = b * K.Q4_BYTES
                    sc[g, b * QV + r] = np.uint16(row[s]) | (np.uint16(row[s + 1]) << 8)
                    for k in range(4):
                        for i in range(4):
                            nib[g, b * BLOCK_BYTES + 64 * k + 4 * r + i] = row[s + 2 + 4 * k + i]


#: How far ahead of the block being multiplied the decode kernels prefetch the nibble plane (the
#: kernels' ``prefetch`` argument; 0: no prefetch instruction, the hardware prefetchers alone). A decode
#: step reads every weight once, from memory; the hardware prefetcher alone left the Q4_0_V16 matvec at
#: ~60 % of the read bandwidth on this course's 2-vCPU Xeon. Prefetching 2 KiB ahead (4 lines per block)
#: took Qwen3-0.6B decode from 24.5 to 32 tok/s at 1 thread and 45 to 59 at 2 (with the planes on huge
#: pages; 1, 2, 4 and 8 KiB measured, interleaved, quiet machine); a non-temporal prefetch halved it.
#: On the course's AMD EPYC (Zen 4) VM the same instructions slow decode down: without them a whole step
#: ran 10 % faster at 1 thread and 4 % at 2 (median of 30 interleaved rounds in one process, winning 22 and
#: 23 of them): its prefetchers already follow the stream. So the distance is one of ``PREFETCH_CHOICES``,
#: measured per machine by ``kernels.choice`` (``PREFETCH_BYTES`` is the default).
PREFETCH_BYTES = 2048
PREFETCH_CHOICES = (PREFETCH_BYTES, 0)


# ------------------------------------------------------------------------------ the x86 block
def _block_dot_ir(builder, isa, acc, q, x):
    """IR for ``acc + Σ_word q[word]·x[word]`` over a block's 8 words: in each of the 16 int32 lanes
    (one row), the four u8 nibbles × four s8 activations of every word, summed exactly.

    ``q``: 8 (16 × i32) nibble vectors, ``x``: the 8 activation words broadcast to 16 lanes.
    ``vnni``: 8 chained ``vpdpbusd``. ``avx2`` (256-bit registers, no VNNI): the 512-bit vectors in two
    halves; ``vpmaddubsw`` gives int16 sums of byte pairs (at most 2·15·128 = 3,840 in magnitude), the
    8 words' pair sums are added in int16 (at most 30,720: no overflow, so exact), and one
    ``vpmaddwd`` by ones per half turns each row's two int16 into its int32 sum: 16 ``vpmaddubsw``,
    14 ``vpaddw`` and 2 ``vpmaddwd`` for what VNNI does in 8 — llama.cpp's AVX2 ``mul_sum_us8_pairs``
    trick, without its per-word ``vpmaddwd``."""
    if isa == "vnni":
        dpbusd = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V16I32, [_V16I32, _V16I32, _V16I32]), "llvm.x86.avx512.vpdpbusd.512")
        for qw, xw in zip(q, x):
            acc = builder.call(dpbusd, [acc, qw, xw])
        return acc
    if isa != "avx2":
        raise ValueError(f"isa {isa!r}: expected one of {ISAS}")
    maddubs = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V16I16, [_V32I8, _V32I8]), "llvm.x86.avx2.pmadd.ub.sw")
    maddwd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V8I32, [_V16I16, _V16I16]), "llvm.x86.avx2.pmadd.wd")
    undef = ir.Constant(_V64I8, ir.Undefined)
    ones = ir.Constant(_V16I16, [1] * 16)
    halves = []
    for h in range(2):
        lanes = ir.Constant(ir.VectorType(_I32, 32), list(range(32 * h, 32 * h + 32)))
        pairs = None
        for qw, xw in zip(q, x):
            qh = builder.shuffle_vector(builder.bitcast(qw, _V64I8), undef, lanes)
            xh = builder.shuffle_vector(builder.bitcast(xw, _V64I8), undef, lanes)
            p = builder.call(maddubs, [qh, xh])
            pairs = p if pairs is None else builder.add(pairs, p)
        halves.append(builder.call(maddwd, [pairs, ones]))
    both = builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 16), list(range(16))))
    return builder.add(acc, both)


def _splat(builder, v, vt):
    t = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(t, ir.Constant(vt, ir.Undefined), _LANES0)


def _nibbles_ir(builder, wptr, wo):
    """The block's 8 nibble vectors of 16 rows: word ``k`` (low nibbles of chunk ``k``) and ``k + 4``
    (its high nibbles), from 4 loads of 64 bytes, 4 ANDs and 4 shifts."""
    low, four = ir.Constant(_V64I8, [0x0F] * 64), ir.Constant(_V64I8, [4] * 64)
    q = [None] * 8
    for k in range(4):
        p = builder.gep(wptr, [builder.add(wo, ir.Constant(wo.type, 64 * k))])
        v = builder.load(builder.bitcast(p, _V64I8.as_pointer()), align=1)
        q[k] = builder.bitcast(builder.and_(v, low), _V16I32)
        q[k + 4] = builder.bitcast(builder.lshr(v, four), _V16I32)
    return q


def _scales_ir(builder, sptr, so):
    """The 16 rows' scales of one block as float32: 16 fp16 values from the scale plane (``sptr`` its uint16
    data, ``so`` the first), widened exactly (``fpext`` → one ``vcvtph2ps``)."""
    h = builder.load(builder.bitcast(builder.gep(sptr, [so]), _V16H.as_pointer()), align=2)
    return builder.fpext(h, _V16F)


def _block_sums_ir(builder, isa, wptr, wo, xptr, xo, c):
    """IR for the 16 int32 sums ``c + Σ_j q_rj·x_j`` of one block."""
    x = [_splat(builder, builder.load(builder.gep(xptr, [builder.add(xo, ir.Constant(xo.type, word))]), align=4),
                _V16I32) for word in range(8)]
    return _block_dot_ir(builder, isa, _splat(builder, c, _V16I32), _nibbles_ir(builder, wptr, wo), x)


def _is(t, dtype) -> bool:
    return isinstance(t, types.Array) and t.dtype == dtype and t.layout == "C" and t.ndim == 1


def _make_intrinsics(isa: str):
    """``block16_sums``, ``block16_fma`` and ``block16x4_fma`` for one x86 form of the block (``ISAS``)."""

    @intrinsic
    def block16_sums(typingctx, w, wo, x, xo, c, out):
        """``out[0:16] = c + Σ_j q_rj·x_j`` for the 16 rows of one ``Q4_0_V16`` block (``w[wo:wo+256]``),
        ``x`` the activation's int8 values viewed as int32 words (the block's 8 words at ``xo``): the
        exact integer sums, which tests compare with the portable kernel's. Taught in day06_1."""
        if not (_is(w, types.uint8) and _is(x, types.int32) and _is(out, types.int32)
                and isinstance(wo, types.Integer) and isinstance(xo, types.Integer) and c == types.int32):
            return None

        def codegen(context, builder, sig, args):
            wa, wo_, xa, xo_, c_, oa = args
            wt, _, xt, _, _, ot = sig.args
            wptr = context.make_array(wt)(context, builder, wa).data
            xptr = context.make_array(xt)(context, builder, xa).data
            optr = context.make_array(ot)(context, builder, oa).data
            acc = _block_sums_ir(builder, isa, wptr, wo_, xptr, xo_, c_)
            builder.store(acc, builder.bitcast(optr, _V16I32.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(w, wo, x, xo, c, out), codegen

    @intrinsic
    def block16_fma(typingctx, w, wo, x, xo, c, s, so, dx, F):
        """``F[0:16] += float(c + Σ_j q_rj·x_j) · (s[so:so+16] · dx)`` for one block of 16 rows, kept in
        registers from the integer sum to the float accumulator. ``s`` is the scale plane itself (the rows'
        fp16 bits): its 16 scales become float32 in one ``vcvtph2ps`` (exact), so no pass converts them
        first; ``dx`` is the activation's scale."""
        if not (_is(w, types.uint8) and _is(x, types.int32) and _is(s, types.uint16) and _is(F, types.float32)
                and isinstance(wo, types.Integer) and isinstance(xo, types.Integer)
                and isinstance(so, types.Integer) and c == types.int32 and dx == types.float32):
            return None

        def codegen(context, builder, sig, args):
            wa, wo_, xa, xo_, c_, sa, so_, dx_, Fa = args
            wt, _, xt, _, _, st, _, _, Ft = sig.args
            wptr = context.make_array(wt)(context, builder, wa).data
            xptr = context.make_array(xt)(context, builder, xa).data
            sptr = context.make_array(st)(context, builder, sa).data
            fptr = builder.bitcast(context.make_array(Ft)(context, builder, Fa).data, _V16F.as_pointer())
            acc = _block_sums_ir(builder, isa, wptr, wo_, xptr, xo_, c_)
            prod = builder.fmul(builder.sitofp(acc, _V16F),
                                builder.fmul(_scales_ir(builder, sptr, so_), _splat(builder, dx_, _V16F)))
            builder.store(builder.fadd(builder.load(fptr, align=4), prod), fptr, align=4)
            return context.get_dummy_value()
        return types.void(w, wo, x, xo, c, s, so, dx, F), codegen

    @intrinsic
    def block16x4_fma(typingctx, w, wo, x, xo, xs, xc, co, cs, s, so, xd, F, fo):
        """``block16_fma`` for **four tokens** at once: the group's block is loaded and split into its 8
        nibble vectors once (4 loads, 4 ANDs, 4 shifts), then stays in registers while each of the four
        tokens spends its block dot on it. Per-token ``block16_fma`` repeats the loads and the split
        for every token, so a prefill matmul spent a third of its instructions unpacking the same bytes.

        Token ``i`` (0…3) reads its 8 activation words at ``x[xo + i·xs]``, its ``−8·Σx`` at
        ``xc[co + i·cs]`` (int16), its scale at ``xd[co + i·cs]`` (float32) and accumulates into
        ``F[fo + 16·i : fo + 16·i + 16]``; ``s`` is the scale plane's fp16 bits, as in ``block16_fma``. The
        float operations per token are ``block16_fma``'s, in the same order, so the results are the same
        float32 bits."""
        if not (_is(w, types.uint8) and _is(x, types.int32) and _is(xc, types.int16) and _is(s, types.uint16)
                and _is(xd, types.float32) and _is(F, types.float32)
                and all(isinstance(a, types.Integer) for a in (wo, xo, xs, co, cs, so, fo))):
            return None

        def codegen(context, builder, sig, args):
            wa, wo_, xa, xo_, xs_, ca, co_, cs_, sa, so_, da, Fa, fo_ = args
            ptr = [context.make_array(t)(context, builder, a).data
                   for t, a in zip(sig.args, args) if isinstance(t, types.Array)]
            wptr, xptr, cptr, sptr, dptr, fptr = ptr
            i64 = ir.IntType(64)

            def nth(base, i, stride):          # base + i·stride as an i64 index
                return builder.add(builder.sext(base, i64), builder.mul(ir.Constant(i64, i), stride))

            q = _nibbles_ir(builder, wptr, wo_)
            scale = _scales_ir(builder, sptr, so_)
            xs64, cs64 = builder.sext(xs_, i64), builder.sext(cs_, i64)
            for i in range(4):
                c = builder.sext(builder.load(builder.gep(cptr, [nth(co_, i, cs64)])), _I32)
                dx = builder.load(builder.gep(dptr, [nth(co_, i, cs64)]))
                xo_i = nth(xo_, i, xs64)
                x = [_splat(builder, builder.load(builder.gep(xptr, [builder.add(xo_i, ir.Constant(i64, word))]),
                                                  align=4), _V16I32) for word in range(8)]
                acc = _block_dot_ir(builder, isa, _splat(builder, c, _V16I32), q, x)
                fp = builder.bitcast(builder.gep(fptr, [nth(fo_, i, ir.Constant(i64, QV))]), _V16F.as_pointer())
                prod = builder.fmul(builder.sitofp(acc, _V16F), builder.fmul(scale, _splat(builder, dx, _V16F)))
                builder.store(builder.fadd(builder.load(fp, align=4), prod), fp, align=4)
            return context.get_dummy_value()
        return types.void(*(w, wo, x, xo, xs, xc, co, cs, s, so, xd, F, fo)), codegen

    return block16_sums, block16_fma, block16x4_fma


block16_sums, block16_fma, block16x4_fma = _make_intrinsics("vnni")
block16_sums_avx2_, block16_fma_avx2, block16x4_fma_avx2 = _make_intrinsics("avx2")


@njit(cache=True)
def block16_sums_vnni(w, wo, x, xo, c, out):
    """``block16_sums`` callable from Python (an intrinsic is usable only inside compiled code).

    Taught in day06_1 and day06_3."""
    block16_sums(w, wo, x, xo, c, out)


@njit(cache=True)
def block16_sums_avx2(w, wo, x, xo, c, out):
    """``block16_sums`` with ``vpmaddubsw`` + ``vpmaddwd`` (AVX2 hosts without VNNI), callable from Python."""
    block16_sums_avx2_(w, wo, x, xo, c, out)


# ------------------------------------------------------------------------------ the portable block
@njit(cache=True, inline="always")
def _byte(word, i):
    """Signed byte ``i`` (little-endian) of an int32 word (shifted to the top, truncated to int32,
    shifted back with sign extension)."""
    return np.int32(np.int64(word) << (24 - 8 * i)) >> 24


@njit(cache=True)
def block16_sums_portable(w, wo, xw, xo, c, out):
    """``block16_sums`` in plain loops (any CPU): the same exact int32 sums. Taught in day06_1 and day07_1."""
    for r in range(QV):
        acc = np.int32(c)
        for k in range(4):
            lo, hi = xw[xo + k], xw[xo + 4 + k]
            for i in range(4):
                v = np.int32(w[wo + 64 * k + 4 * r + i])
                acc += (v & 15) * _byte(lo, i) + (v >> 4) * _byte(hi, i)
        out[r] = acc


@njit(fastmath=True, cache=True, inline="always")
def block16_fma_portable(w, wo, xw, xo, c, s, so, dx, F):
    """``block16_fma`` in plain loops (any CPU)."""
    for r in range(QV):
        acc = np.int32(c)
        for k in range(4):
            lo, hi = xw[xo + k], xw[xo + 4 + k]
            for i in range(4):
                v = np.int32(w[wo + 64 * k + 4 * r + i])
                acc += (v & 15) * _byte(lo, i) + (v >> 4) * _byte(hi, i)
        F[r] += np.float32(acc) * (s[so + r] * dx)


@njit(fastmath=True, cache=True, inline="always")
def block16x4_fma_portable(w, wo, xw, xo, xs, xc, co, cs, s, so, xd, F, fo):
    """``block16x4_fma`` in plain loops (any CPU): a row's byte is split once for the four tokens."""
    for r in range(QV):
        a0 = np.int32(xc[co])
        a1 = np.int32(xc[co + cs])
        a2 = np.int32(xc[co + 2 * cs])
        a3 = np.int32(xc[co + 3 * cs])
        for k in range(4):
            for i in range(4):
                v = np.int32(w[wo + 64 * k + 4 * r + i])
                lo, hi = v & 15, v >> 4
                a0 += lo * _byte(xw[xo + k], i) + hi * _byte(xw[xo + 4 + k], i)
                a1 += lo * _byte(xw[xo + xs + k], i) + hi * _byte(xw[xo + xs + 4 + k], i)
                a2 += lo * _byte(xw[xo + 2 * xs + k], i) + hi * _byte(xw[xo + 2 * xs + 4 + k], i)
                a3 += lo * _byte(xw[xo + 3 * xs + k], i) + hi * _byte(xw[xo + 3 * xs + 4 + k], i)
        F[fo + r] += np.float32(a0) * (s[so + r] * (xd[co] * K.F16_SCALE))
        F[fo + QV + r] += np.float32(a1) * (s[so + r] * (xd[co + cs] * K.F16_SCALE))
        F[fo + 2 * QV + r] += np.float32(a2) * (s[so + r] * (xd[co + 2 * cs] * K.F16_SCALE))
        F[fo + 3 * QV + r] += np.float32(a3) * (s[so + r] * (xd[co + 3 * cs] * K.F16_SCALE))


@njit(cache=True, inline="always")
def _scales(sc, Si):
    """fp16 scale bits → float32 bits / 2^112 (``kernels.ops._r32_scales``'s trick), a contiguous loop."""
    for i in range(sc.shape[0]):
        h = np.int32(sc[i])
        Si[i] = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13)


@njit(cache=True, inline="always")
def _prefetch_ahead(nib, at, dist):
    """Prefetch the 256 bytes (4 lines) ``dist`` bytes past byte ``at`` of the nibble plane (past the end of
    the group's row is the next group's, which this thread reads next; a prefetch never faults); nothing
    when ``dist`` is 0."""
    if dist > 0:
        for line in range(4):
            K.prefetch(nib, at + dist + 64 * line)


# ------------------------------------------------------------------------------ the kernels
@njit(fastmath=True, cache=True, inline="always")
def _group_vnni(nib, sc, xw, xc, xd, F, Si, pf):
    """The 16 outputs of one group for one token into ``F`` (``vpdpbusd``; the scales are widened inside the
    block, so ``Si`` is not used)."""
    F[:] = 0
    for b in range(xd.shape[0]):
        _prefetch_ahead(nib, b * BLOCK_BYTES, pf)
        block16_fma(nib, b * BLOCK_BYTES, xw, b * 8, np.int32(xc[b]), sc, b * QV, xd[b], F)


@njit(fastmath=True, cache=True, inline="always")
def _group_avx2(nib, sc, xw, xc, xd, F, Si, pf):
    """``_group_vnni`` with ``vpmaddubsw`` + ``vpmaddwd``."""
    F[:] = 0
    for b in range(xd.shape[0]):
        _prefetch_ahead(nib, b * BLOCK_BYTES, pf)
        block16_fma_avx2(nib, b * BLOCK_BYTES, xw, b * 8, np.int32(xc[b]), sc, b * QV, xd[b], F)


@njit(fastmath=True, cache=True, inline="always")
def _group_portable(nib, sc, xw, xc, xd, F, Si, pf):
    """``_group_vnni`` in plain loops (the scales converted first into ``Si``, by the bit trick)."""
    Sf = Si.view(np.float32)
    _scales(sc, Si)
    F[:] = 0
    for b in range(xd.shape[0]):
        _prefetch_ahead(nib, b * BLOCK_BYTES, pf)
        block16_fma_portable(nib, b * BLOCK_BYTES, xw, b * 8, np.int32(xc[b]), Sf, b * QV, xd[b] * K.F16_SCALE, F)


def _make_kernels(isa: str):
    """matvec / three matvecs / SwiGLU / matmul on ``Q4_0_V16``: ``isa`` "vnni" (``vpdpbusd``), "avx2"
    (``vpmaddubsw`` + ``vpmaddwd``) or "portable" (plain loops). The decode kernels (matvec, matvec3,
    SwiGLU) take a last argument ``prefetch``, the distance of ``_prefetch_ahead`` (default
    ``PREFETCH_BYTES``; ``kernels.choice`` measures which distance this machine decodes faster with).

    One body, three compiled variants: numba freezes the closure's ``isa`` and prunes the branches not
    taken before typing, so the portable variant never meets an x86 intrinsic (and compiles on any
    CPU), and the closure holds only a str, which keeps numba's on-disk cache key stable."""

    @njit(parallel=True, fastmath=True, cache=True)
    def matvec(nib, sc, xq, xc, xd, out, nchunk, prefetch=PREFETCH_BYTES):
        ng = nib.shape[0]
        step = (ng + nchunk - 1) // nchunk
        xw = xq[0].view(np.int32)
        for c in prange(nchunk):
            F = np.empty(QV, np.float32)
            Si = np.empty(sc.shape[1], np.int32)
            for g in range(c * step, min(ng, c * step + step)):
                if isa == "vnni":
                    _group_vnni(nib[g], sc[g], xw, xc[0], xd[0], F, Si, prefetch)
                elif isa == "avx2":
                    _group_avx2(nib[g], sc[g], xw, xc[0], xd[0], F, Si, prefetch)
                else:
                    _group_portable(nib[g], sc[g], xw, xc[0], xd[0], F, Si, prefetch)
                out[g * QV:(g + 1) * QV] = F

    @njit(parallel=True, fastmath=True, cache=True)
    def matvec3(na_, sa, nb_, sb, nc_, scc, xq, xc, xd, oa, ob, oc, nchunk, prefetch=PREFETCH_BYTES):
        ga, gb = na_.shape[0], nb_.shape[0]
        ng = ga + gb + nc_.shape[0]
        step = (ng + nchunk - 1) // nchunk
        xw = xq[0].view(np.int32)
        for c in prange(nchunk):
            F = np.empty(QV, np.float32)
            Si = np.empty(sa.shape[1], np.int32)
            for g in range(c * step, min(ng, c * step + step)):
                if g < ga:
                    if isa == "vnni":
                        _group_vnni(na_[g], sa[g], xw, xc[0], xd[0], F, Si, prefetch)
                    elif isa == "avx2":
                        _group_avx2(na_[g], sa[g], xw, xc[0], xd[0], F, Si, prefetch)
                    else:
                        _group_portable(na_[g], sa[g], xw, xc[0], xd[0], F, Si, prefetch)
                    oa[g * QV:(g + 1) * QV] = F
                elif g < ga + gb:
                    h = g - ga
                    if isa == "vnni":
                        _group_vnni(nb_[h], sb[h], xw, xc[0], xd[0], F, Si, prefetch)
                    elif isa == "avx2":
                        _group_avx2(nb_[h], sb[h], xw, xc[0], xd[0], F, Si, prefetch)
                    else:
                        _group_portable(nb_[h], sb[h], xw, xc[0], xd[0], F, Si, prefetch)
                    ob[h * QV:(h + 1) * QV] = F
                else:
                    h = g - ga - gb
                    if isa == "vnni":
                        _group_vnni(nc_[h], scc[h], xw, xc[0], xd[0], F, Si, prefetch)
                    elif isa == "avx2":
                        _group_avx2(nc_[h], scc[h], xw, xc[0], xd[0], F, Si, prefetch)
                    else:
                        _group_portable(nc_[h], scc[h], xw, xc[0], xd[0], F, Si, prefetch)
                    oc[h * QV:(h + 1) * QV] = F

    @njit(parallel=True, fastmath=True, cache=True)
    def swiglu(ng_, sg, nu, su, xq, xc, xd, out, nchunk, prefetch=PREFETCH_BYTES):
        """``silu(W_gate x) · (W_up x)``: each chunk's gate groups, then the same groups of up. Alternating
        between the two matrices group by group read at ~19 GB/s at 1 thread where this order reads ~23 (the
        two matrices as separate matvecs ~24) on the course's EPYC VM: long sequential streams are what the
        prefetchers follow. Same float operations per row, so the same bits."""
        ng = ng_.shape[0]
        step = (ng + nchunk - 1) // nchunk
        xw = xq[0].view(np.int32)
        for c in prange(nchunk):
            F = np.empty(QV, np.float32)
            Si = np.empty(sg.shape[1], np.int32)
            lo, hi = c * step, min(ng, c * step + step)
            for g in range(lo, hi):           # gate: its 16 outputs wait in ``out``
                if isa == "vnni":
                    _group_vnni(ng_[g], sg[g], xw, xc[0], xd[0], F, Si, prefetch)
                elif isa == "avx2":
                    _group_avx2(ng_[g], sg[g], xw, xc[0], xd[0], F, Si, prefetch)
                else:
                    _group_portable(ng_[g], sg[g], xw, xc[0], xd[0], F, Si, prefetch)
                out[g * QV:(g + 1) * QV] = F
            for g in range(lo, hi):           # up, and the product
                if isa == "vnni":
                    _group_vnni(nu[g], su[g], xw, xc[0], xd[0], F, Si, prefetch)
                elif isa == "avx2":
                    _group_avx2(nu[g], su[g], xw, xc[0], xd[0], F, Si, prefetch)
                else:
                    _group_portable(nu[g], su[g], xw, xc[0], xd[0], F, Si, prefetch)
                for r in range(QV):
                    out[g * QV + r] = K.silu(out[g * QV + r]) * F[r]

    @njit(parallel=True, fastmath=True, cache=True)
    def matmul(nib, sc, xq, xc, xd, out, nchunk):
        """Prefill: T tokens × one group's 16 rows per work item. Tokens go four at a time through
        ``block16x4_fma`` (the block split once, kept in registers); the last ``T % 4`` one by one."""
        T = xq.shape[0]
        nb = xd.shape[1]
        ng = nib.shape[0]
        step = (ng + nchunk - 1) // nchunk
        xw = xq.reshape(-1).view(np.int32)
        xcf = xc.reshape(-1)
        xdf = xd.reshape(-1)
        wpt = xq.shape[1] // 4              # int32 words per token
        T4 = T - T % 4
        for c in prange(nchunk):
            F = np.empty(T * QV, np.float32)
            Si = np.empty(sc.shape[1], np.int32)
            Sf = Si.view(np.float32)
            for g in range(c * step, min(ng, c * step + step)):
                F[:] = 0
                gn, gs = nib[g], sc[g]
                if isa != "vnni" and isa != "avx2":
                    _scales(gs, Si)           # the x86 blocks widen the fp16 scales themselves
                for b in range(nb):
                    for t in range(0, T4, 4):     # the group's 256-byte block serves four tokens per load
                        if isa == "vnni":
                            block16x4_fma(gn, b * BLOCK_BYTES, xw, t * wpt + b * 8, wpt, xcf, t * nb + b, nb,
                                          gs, b * QV, xdf, F, t * QV)
                        elif isa == "avx2":
                            block16x4_fma_avx2(gn, b * BLOCK_BYTES, xw, t * wpt + b * 8, wpt, xcf, t * nb + b,
                                               nb, gs, b * QV, xdf, F, t * QV)
                        else:
                            block16x4_fma_portable(gn, b * BLOCK_BYTES, xw, t * wpt + b * 8, wpt, xcf, t * nb + b,
                                                   nb, Sf, b * QV, xdf, F, t * QV)
                    for t in range(T4, T):
                        Ft = F[t * QV:(t + 1) * QV]
                        if isa == "vnni":
                            block16_fma(gn, b * BLOCK_BYTES, xw, t * wpt + b * 8, np.int32(xc[t, b]), gs,
                                        b * QV, xd[t, b], Ft)
                        elif isa == "avx2":
                            block16_fma_avx2(gn, b * BLOCK_BYTES, xw, t * wpt + b * 8, np.int32(xc[t, b]), gs,
                                             b * QV, xd[t, b], Ft)
                        else:
                            block16_fma_portable(gn, b * BLOCK_BYTES, xw, t * wpt + b * 8, np.int32(xc[t, b]),
                                                 Sf, b * QV, xd[t, b] * K.F16_SCALE, Ft)
                for t in range(T):
                    out[t, g * QV:(g + 1) * QV] = F[t * QV:(t + 1) * QV]

    return matvec, matvec3, swiglu, matmul


matvec_q4_v16_vnni, matvec3_q4_v16_vnni, matvec_swiglu_q4_v16_vnni, matmul_q4_v16_vnni = _make_kernels("vnni")
matvec_q4_v16_avx2, matvec3_q4_v16_avx2, matvec_swiglu_q4_v16_avx2, matmul_q4_v16_avx2 = _make_kernels("avx2")
matvec_q4_v16, matvec3_q4_v16, matvec_swiglu_q4_v16, matmul_q4_v16 = _make_kernels("portable")
