"""Which kernel runs a product of weights and activations: one table, keyed by layout, call and ISA.

The engine never chooses a kernel itself. Each weight matrix has a **layout** (its qtype name, or
``Q4_0_R32`` for plain Q4_0 split and row-interleaved at load), each product has a **call** shape:

=========  ==============================================================  ============================
call       what it computes                                                signature
=========  ==============================================================  ============================
``one``    ``out[0] = W @ x`` for one token                                ``fn(w, act, out)``
``many``   ``out = X @ W.T`` for T tokens (prefill)                        ``fn(w, act, out)``
``qkv``    Q, K and V of one token in one parallel region                  ``fn(wq, wk, wv, act, q, k, v)``
``swiglu`` ``silu(Wgate x) · (Wup x)`` of one token in one pass             ``fn(wg, wu, act, out)``
``layers`` every layer of one decode step in one numba call                ``fn(*args)`` (``step``)
``experts`` an MoE layer's chosen experts for T tokens, grouped by expert   ``fn(stack, act, groups, out)``
``gemm``   ``gelu?(X @ W.T + b)`` for hundreds of tokens (the vision tower's  ``fn(w, act, out, bias, gelu)``
           1,200 patches): Q8_0 an int8 GEMM (``kernels.q8gemm``), F32/F16 BLAS
=========  ==============================================================  ============================

``w`` is a ``Linear`` (``.w``, ``.rows``, ``.nib``/``.sc``), ``act`` an ``Activation`` (``.x``, ``.q8()``,
``.q8c()``, ``.x8x8()``). Every (layout, call) that exists has a **portable** kernel; an ISA-specific one
(``isa="avx512_vnni"``, ``"dotprod"`` …) registers beside it and is chosen when the host has that feature
(``host_features``): ``avx512_vnni``, then ``avx2``, for ``Q4_0_V16``, ``dotprod`` (the A76's ``sdot``) for
plain ``Q4_0``; ``avx512_vnni``, ``avx2`` and portable for the Q8_0 ``gemm``. The Q4_0 kernels are registered
from the one table of variants (``kernels.variants``: layout, ISA, rows per group, kernels): a new Q4_0
variant (an 8-row VNNI layout, the A76's 4×4 layout) is one entry there; a new consumer or another layout's
kernel is one ``@register`` away (the vision tower's int8 GEMM with its bias and GELU epilogue was).
``qkv``/``swiglu`` fall back to separate ``one`` calls for layouts without a fused kernel. ``experts``
(Qwen3-MoE, ``engine.moe``): plain Q4_0 experts have a grouped kernel that reads the file's rows in place; the
other layouts go expert by expert through their ``many`` kernels. Each ``Kernel`` counts its calls, so the
bench and the provenance can say which ran.
Taught in day06_1 (host features), day06_3 (the table) and day07_1 (what the board would pick).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import choice, q8gemm, step, variants
from kestrel_lab.kernels import v16 as V
from kestrel_lab.kernels import vision as VK
from kestrel_lab.kernels.host import host_features

CALLS = ("one", "many", "qkv", "swiglu", "layers", "experts", "gemm")
GEMM_TILE_BYTES = 16 << 20   # float32 bytes of weight rows widened per sgemm (a whole 2B vision matrix)
PORTABLE = variants.PORTABLE


@dataclass
class Kernel:
    """One registered kernel: what it is for, what the host needs, and how often it ran."""

    name: str
    layout: str
    call: str
    isa: str
    fn: Callable
    calls: int = field(default=0, compare=False)

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


TABLE: dict[tuple[str, str], list[Kernel]] = {}


def register(layout: str, call: str, isa: str = PORTABLE, name: str | None = None):
    """Decorator: ``fn`` computes ``call`` for weights in ``layout`` on hosts with ``isa``."""
    if call not in CALLS:
        raise ValueError(f"call {call!r}: expected one of {', '.join(CALLS)}")

    def deco(fn: Callable) -> Callable:
        entries = TABLE.setdefault((layout, call), [])
        if any(k.isa == isa for k in entries):
            raise ValueError(f"a {isa} kernel for ({layout}, {call}) is already registered")
        entries.append(Kernel(name or fn.__name__.lstrip("_"), layout, call, isa, fn))
        return fn
    return deco


def select(layout: str, call: str, features: frozenset[str] | None = None) -> Kernel | None:
    """The kernel for (layout, call) on a host with ``features``: an ISA-specific one it supports,
    else the portable one; None when nothing is registered for the pair. Taught in day06_3."""
    entries = TABLE.get((layout, call), [])
    if features is None and layout in variants.PLANE_LAYOUTS:       # this host: the measured choice
        v = choice.current(host_features()).variant
        k = next((k for k in entries if k.isa == v.isa), None) if v.layout == layout else None
        if k is not None:
            return k
    features = host_features() if features is None else features
    special = [k for k in entries if k.isa != PORTABLE and k.isa in features]
    if special:
        return special[0]
    return next((k for k in entries if k.isa == PORTABLE), None)


def layout_of(w) -> str:
    """The layout name of a ``Linear``: its qtype, or its planes' layout (``Q4_0_R32``, ``Q4_0_V16``)
    when it carries row-grouped planes made at load."""
    if getattr(w, "nib", None) is not None:
        return getattr(w, "planes_layout", "Q4_0_R32")
    return w.qt.name


Q4_LAYOUTS = {"r32": "Q4_0_R32", "v16": "Q4_0_V16", "plain": "Q4_0"}   # KESTREL_Q4_LAYOUT values


def q4_load_layout(features: frozenset[str] | None = None) -> str:
    """The layout the engine keeps plain Q4_0 in on this host: the layout of the row-grouped variant chosen
    for it (``kernels.choice``: the ISA list's pick — ``Q4_0_V16`` with AVX-512 VNNI's ``vpdpbusd`` or AVX2's
    ``vpmaddubsw``, else ``Q4_0_R32`` — unless another variant measured clearly faster here), copied at load.
    With ``features`` given (another machine, e.g. the board's), the ISA list's pick for them.
    ``KESTREL_Q4_LAYOUT`` forces one, to measure them side by side: ``r32``, ``v16``, or ``plain`` (no copy:
    the file's own bytes, with the int8-dot ``sdot`` kernels on a ``dotprod`` host such as the A76, else the
    16-lane ones). Which of R32 and ``sdot`` is faster on a real A76 is still to be measured (day07_1's
    board exercise). Taught in day06_3 and day07_1."""
    forced = os.environ.get("KESTREL_Q4_LAYOUT", "").strip().lower()
    if forced:
        name = Q4_LAYOUTS.get(forced)
        if name is None:
            raise ValueError(f"KESTREL_Q4_LAYOUT={forced!r}: expected one of {', '.join(Q4_LAYOUTS)}")
        return name
    if features is None:
        return choice.current(host_features()).variant.layout       # measured on this host (``kernels.choice``)
    return choice.ladder(features).layout


def table_rows() -> list[tuple[str, str, str, str]]:
    """(layout, call, isa, kernel name) of every registered kernel, for the docs and the bench.

    Taught in day06_3."""
    return [(k.layout, k.call, k.isa, k.name) for entries in TABLE.values() for k in entries]


def used() -> dict[str, int]:
    """Calls per kernel name since the process started (kernels that never ran are left out)."""
    out: dict[str, int] = {}
    for entries in TABLE.values():
        for k in entries:
            if k.calls:
                out[k.name] = out.get(k.name, 0) + k.calls
    return out


# --------------------------------------------------------------------------- the portable kernels
@register("F32", "one", name="matvec_f32")
def _f32_one(w, act, out):
    K.matvec_f32(w.w, act.x[0], out[0], K.n_chunks(w.rows))


@register("F32", "many", name="numpy_matmul_f32")
def _f32_many(w, act, out):
    np.matmul(act.x, w.w.T, out=out)


@register("F16", "one", name="matvec_f16")
def _f16_one(w, act, out):
    K.matvec_f16(w.w, act.x[0], K.F16_TO_F32, out[0], K.n_chunks(w.rows))


@register("F16", "many", name="matmul_rows_f16")
def _f16_many(w, act, out):
    K.matmul_rows_f16(w.w, act.x, K.F16_TO_F32, out, K.n_chunks(w.rows))


@register("Q8_0", "one", name="matvec_q8_0")
def _q8_one(w, act, out):
    xq, xd = act.q8()
    K.matvec_q8_0(w.w, w.w.view(np.int8), xq, xd, K.F16_TO_F32, out[0], K.n_chunks(w.rows))


@register("Q8_0", "many", name="matmul_rows_q8_0")
def _q8_many(w, act, out):
    xq, xd = act.q8()
    K.matmul_rows_q8_0(w.w, w.w.view(np.int8), xq, xd, K.F16_TO_F32, out, K.n_chunks(w.rows))


# ------------------------------------------------------------ Q4_0: every variant of ``kernels.variants``
def _register_variant(v: variants.Variant) -> None:
    """Variant ``v``'s calls: ``one``, ``many``, ``qkv``, ``swiglu`` on its layout, then the whole decode step
    for a row-grouped layout (planes ``w.nib``/``w.sc``, activations with block sums) or the grouped MoE
    experts on the file's plain bytes (``w.w``, activations ``q8``)."""
    if v.planes:
        def pf() -> tuple:
            """The V16 kernels' prefetch distance, measured per machine (``kernels.choice``); left out when it is
            the kernels' default, so one compiled form serves these calls and the lessons' direct ones."""
            d = choice.prefetch_bytes() if v.prefetches else None
            return () if d is None or d == V.PREFETCH_BYTES else (d,)

        def one(w, act, out):
            xq, xc, xd = act.q8c()
            v.matvec(w.nib, w.sc, xq, xc, xd, out[0], K.n_chunks(w.nib.shape[0]), *pf())

        def many(w, act, out):
            xq, xc, xd = act.q8c()
            v.matmul(w.nib, w.sc, xq, xc, xd, out, K.n_chunks(w.nib.shape[0]))

        def qkv(wq, wk, wv, act, q, k, v_):
            xq, xc, xd = act.q8c()
            v.matvec3(wq.nib, wq.sc, wk.nib, wk.sc, wv.nib, wv.sc, xq, xc, xd, q[0], k[0], v_[0],
                      K.n_chunks(wq.nib.shape[0] + wk.nib.shape[0] + wv.nib.shape[0]), *pf())

        def fused_swiglu(wg, wu, act, out):
            xq, xc, xd = act.q8c()
            v.swiglu(wg.nib, wg.sc, wu.nib, wu.sc, xq, xc, xd, out[0], K.n_chunks(wg.nib.shape[0]), *pf())
    else:
        def one(w, act, out):
            xq, xd = act.q8()
            v.matvec(w.w, xq, xd, K.F16_TO_F32, out[0], K.n_chunks(w.rows))

        def many(w, act, out):
            xq, xd = act.q8()
            v.matmul(w.w, xq, xd, K.F16_TO_F32, out, K.n_chunks(w.rows))

        def qkv(wq, wk, wv, act, q, k, v_):
            xq, xd = act.q8()
            v.matvec3(wq.w, wk.w, wv.w, xq, xd, K.F16_TO_F32, q[0], k[0], v_[0],
                      K.n_chunks(wq.rows + wk.rows + wv.rows))

        def fused_swiglu(wg, wu, act, out):
            xq, xd = act.q8()
            v.swiglu(wg.w, wu.w, xq, xd, K.F16_TO_F32, out[0], K.n_chunks(wg.rows))

    for call, fn in (("one", one), ("many", many), ("qkv", qkv), ("swiglu", fused_swiglu)):
        register(v.layout, call, v.isa, name=v.kernel_name(call))(fn)
    if v.planes:
        register(v.layout, "layers", v.isa, name=v.kernel_name("layers"))(step.make_decode_layers(v.name))
    if v.experts:
        register(v.layout, "experts", v.isa, name=v.kernel_name("experts"))(_grouped_experts(*v.experts))


def _grouped_experts(gate_up, down):
    """MoE experts (``engine.moe``) on the file's plain Q4_0 bytes: gate/up for every (token, expert) pair
    in one parallel region, then down in another."""
    def experts(stack, act, groups, out):
        xq, xd = act.q8()
        g = np.empty((groups.n_pairs, stack.m), np.float32)
        nch = _expert_chunks(groups.experts.size)
        gate_up(stack.gate, stack.up, groups.experts, groups.start, groups.tok, xq, xd, K.F16_TO_F32, g, nch)
        gq = np.empty(g.shape, np.int8)
        gd = np.empty((g.shape[0], g.shape[1] // K.QK), np.float32)
        K.quantize_rows(g, gq, gd)
        down(stack.down, groups.experts, groups.start, gq, gd, K.F16_TO_F32, out, nch)
    return experts


@register("Q4_8X8L", "one", name="matvec_q4_8x8l")
def _x8_one(w, act, out):
    xe, xd = act.x8x8()
    K.matvec_q4_8x8l(w.w, xe, xd, K.F16_TO_F32, out[0], K.n_chunks(w.rows // 8))


@register("Q4_8X8L", "many", name="matmul_q4_8x8l")
def _x8_many(w, act, out):
    xe, xd = act.x8x8()
    K.matmul_q4_8x8l(w.w, xe, xd, K.F16_TO_F32, out, K.n_chunks(w.rows // 8))


@register("Q4_8X8L", "qkv", name="matvec3_q4_8x8l")
def _x8_qkv(wq, wk, wv, act, q, k, v):
    xe, xd = act.x8x8()
    K.matvec3_q4_8x8l(wq.w, wk.w, wv.w, xe, xd, K.F16_TO_F32, q[0], k[0], v[0],
                      K.n_chunks((wq.rows + wk.rows + wv.rows) // 8))


@register("Q4_8X8L", "swiglu", name="matvec_swiglu_q4_8x8l")
def _x8_swiglu(wg, wu, act, out):
    xe, xd = act.x8x8()
    K.matvec_swiglu_q4_8x8l(wg.w, wu.w, xe, xd, K.F16_TO_F32, out[0], K.n_chunks(wg.rows // 8))


# --------------------------------------------------------------------------- MoE experts (``engine.moe``)
# ``stack`` is an ``moe.ExpertStack`` (views of one layer's runs in the stacked expert entries, never
# copied), ``act`` the Activation of the chunk's tokens, ``groups`` an ``moe.Groups`` (pairs sorted by
# expert), ``out`` (pairs, hidden): each pair's expert output before the routing weight.
def _expert_chunks(n_active: int) -> int:
    """Row chunks per active expert: enough work items for every thread, whatever k is."""
    return max(1, -(-K.n_chunks(1 << 30) // max(1, n_active)))


def _experts_by_expert(stack, act, groups, out):
    """Any layout: per active expert, its tokens' rows through the ``many`` kernels of its views."""
    for a, e in enumerate(groups.experts):
        p0, p1 = int(groups.start[a]), int(groups.start[a + 1])
        sub = stack.activation(act.x[groups.tok[p0:p1]])
        gate, up = stack.linear("gate", int(e))(sub), stack.linear("up", int(e))(sub)
        K.silu_mul_rows(gate, up, gate)
        out[p0:p1] = stack.linear("down", int(e))(stack.activation(gate))


for _layout in ("F32", "F16", "Q8_0", "Q4_8X8L"):
    register(_layout, "experts", name="experts_by_expert")(_experts_by_expert)


# --------------------------------------------------------------------------- gemm: hundreds of tokens
# ``fn(w, act, out, bias=None, gelu=False)``: ``out = gelu_tanh?(act.x @ W.T + bias)``, the epilogue fused
# where the kernel can. Q8_0 (the vision tower's block matrices): the int8 GEMM of ``kernels.q8gemm``
# (activations quantized to Q8_0 once per call; ``vpdpbusd``, AVX2 or the portable twin, which give the
# same bits). F32/F16: a BLAS sgemm (F16 rows widened a tile at a time), then bias and GELU.
# The text engine never calls it: its prefill results stay those of the "many" kernels.
def _epilogue(out, bias, gelu):
    if bias is not None:
        VK.add_bias(out, bias)
    if gelu:
        VK.gelu_tanh(out)


@register("F32", "gemm", name="numpy_matmul_f32")
def _f32_gemm(w, act, out, bias=None, gelu=False):
    np.matmul(act.x, w.w.T, out=out)
    _epilogue(out, bias, gelu)


def _tiled_gemm(w, act, out, widen):
    step = max(8, min(w.rows, GEMM_TILE_BYTES // (4 * w.cols)))
    tile = np.empty((step, w.cols), np.float32)
    for r0 in range(0, w.rows, step):
        n = min(step, w.rows - r0)
        widen(r0, tile[:n])
        if n == w.rows:
            np.matmul(act.x, tile.T, out=out)
        else:
            np.matmul(act.x, tile[:n].T, out=out[:, r0:r0 + n])


@register("F16", "gemm", name="widened_sgemm_f16")
def _f16_gemm(w, act, out, bias=None, gelu=False):
    _tiled_gemm(w, act, out, lambda r0, t: K.dequant_rows_f16(w.w, K.F16_TO_F32, r0, t))
    _epilogue(out, bias, gelu)


def _q8_gemm(form: str):
    def fn(w, act, out, bias=None, gelu=False):
        q8gemm.gemm(form, w, act.x, out, bias, gelu)
    return fn


for _isa, _form in (("avx512_vnni", "vnni"), ("avx2", "avx2"), (PORTABLE, "portable")):
    register("Q8_0", "gemm", _isa, name=f"int8_gemm_q8_0_{_form}")(_q8_gemm(_form))


for _variant in variants.VARIANTS:        # in table order: ``select`` takes the first ISA kernel that fits
    _register_variant(_variant)
