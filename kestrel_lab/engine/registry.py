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
=========  ==============================================================  ============================

``w`` is a ``Linear`` (``.w``, ``.rows``, ``.nib``/``.sc``), ``act`` an ``Activation`` (``.x``,
``.q8()``, ``.q8c()``, ``.x8x8()``). Every (layout, call) that exists has a **portable** kernel; an
ISA-specific one (``isa="avx512_vnni"``, ``"dotprod"`` …) registers beside it and is chosen when the
host has that feature (``host_features``). A new layout (an 8-row VNNI layout, the A76's 4×4 layout),
a new consumer (the vision tower's matmul with bias, MoE expert slices) or an ISA-specific kernel is
one ``@register`` away. ``qkv``/``swiglu`` fall back to separate ``one`` calls for layouts without a
fused kernel. Each ``Kernel`` counts its calls, so the bench and the provenance can say which ran.
Taught in day06_1 (host features), day06_3 (the table) and day07_1 (what the board would pick).
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import numpy as np

from kestrel_lab.engine import kernels as K
from kestrel_lab.engine import kernels_v16 as V
from kestrel_lab.engine import step

CALLS = ("one", "many", "qkv", "swiglu", "layers")
PORTABLE = "portable"


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


@lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """The CPU features kernels may require, from /proc/cpuinfo (x86 ``flags``, ARM ``Features``).

    ARM's ``asimddp`` is reported as ``dotprod`` (the A76's ``sdot``), ``i8mm`` as ``i8mm``.
    Taught in day06_1.
    """
    feats: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    feats.update(value.split())
                    break
    except OSError:
        pass
    if "asimddp" in feats:
        feats.add("dotprod")
    feats.add(platform.machine().lower())
    return frozenset(feats)


def select(layout: str, call: str, features: frozenset[str] | None = None) -> Kernel | None:
    """The kernel for (layout, call) on a host with ``features``: an ISA-specific one it supports,
    else the portable one; None when nothing is registered for the pair. Taught in day06_3."""
    entries = TABLE.get((layout, call), [])
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


PLANE_LAYOUTS = {"Q4_0_R32": 32, "Q4_0_V16": 16}   # layouts made from plain Q4_0 at load → rows per group


def q4_load_layout(features: frozenset[str] | None = None) -> str:
    """The layout the engine splits plain Q4_0 into at load on this host: ``Q4_0_V16`` where an
    ISA-specific kernel for it is available (AVX-512 VNNI), else ``Q4_0_R32`` (faster than the
    portable ``Q4_0_V16`` kernels). ``KESTREL_Q4_LAYOUT=r32|v16`` forces one, to measure both.
    Taught in day06_3 and day07_1."""
    forced = os.environ.get("KESTREL_Q4_LAYOUT", "").strip().lower()
    if forced:
        name = {"r32": "Q4_0_R32", "v16": "Q4_0_V16"}.get(forced)
        if name is None:
            raise ValueError(f"KESTREL_Q4_LAYOUT={forced!r}: expected r32 or v16")
        return name
    k = select("Q4_0_V16", "one", features)
    return "Q4_0_V16" if k is not None and k.isa != PORTABLE else "Q4_0_R32"


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


@register("Q4_0", "one", name="matvec_q4_0")
def _q4_one(w, act, out):
    xq, xd = act.q8()
    K.matvec_q4_0(w.w, xq, xd, K.F16_TO_F32, out[0], K.n_chunks(w.rows))


@register("Q4_0", "many", name="matmul_rows_q4_0")
def _q4_many(w, act, out):
    xq, xd = act.q8()
    K.matmul_rows_q4_0(w.w, xq, xd, K.F16_TO_F32, out, K.n_chunks(w.rows))


@register("Q4_0", "qkv", name="matvec3_q4_0")
def _q4_qkv(wq, wk, wv, act, q, k, v):
    xq, xd = act.q8()
    K.matvec3_q4_0(wq.w, wk.w, wv.w, xq, xd, K.F16_TO_F32, q[0], k[0], v[0],
                   K.n_chunks(wq.rows + wk.rows + wv.rows))


@register("Q4_0", "swiglu", name="matvec_swiglu_q4_0")
def _q4_swiglu(wg, wu, act, out):
    xq, xd = act.q8()
    K.matvec_swiglu_q4_0(wg.w, wu.w, xq, xd, K.F16_TO_F32, out[0], K.n_chunks(wg.rows))


@register("Q4_0_R32", "one", name="matvec_q4_r32")
def _r32_one(w, act, out):
    xq, xc, xd = act.q8c()
    K.matvec_q4_r32(w.nib, w.sc, xq, xc, xd, out[0], K.n_chunks(w.nib.shape[0]))


@register("Q4_0_R32", "many", name="matmul_q4_r32")
def _r32_many(w, act, out):
    xq, xc, xd = act.q8c()
    K.matmul_q4_r32(w.nib, w.sc, xq, xc, xd, out, K.n_chunks(w.nib.shape[0]))


@register("Q4_0_R32", "qkv", name="matvec3_q4_r32")
def _r32_qkv(wq, wk, wv, act, q, k, v):
    xq, xc, xd = act.q8c()
    K.matvec3_q4_r32(wq.nib, wq.sc, wk.nib, wk.sc, wv.nib, wv.sc, xq, xc, xd, q[0], k[0], v[0],
                     K.n_chunks(wq.nib.shape[0] + wk.nib.shape[0] + wv.nib.shape[0]))


@register("Q4_0_R32", "swiglu", name="matvec_swiglu_q4_r32")
def _r32_swiglu(wg, wu, act, out):
    xq, xc, xd = act.q8c()
    K.matvec_swiglu_q4_r32(wg.nib, wg.sc, wu.nib, wu.sc, xq, xc, xd, out[0], K.n_chunks(wg.nib.shape[0]))


register("Q4_0_R32", "layers", name="decode_layers_r32")(step.decode_layers_r32)


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


# ------------------------------------------------------------------ Q4_0_V16: portable and AVX-512 VNNI
def _register_v16(isa: str, suffix: str, matvec, matvec3, swiglu, matmul):
    """The five calls on ``Q4_0_V16`` for one ISA (the kernels of ``kernels_v16._make_kernels``)."""
    def one(w, act, out):
        xq, xc, xd = act.q8c()
        matvec(w.nib, w.sc, xq, xc, xd, out[0], K.n_chunks(w.nib.shape[0]))

    def many(w, act, out):
        xq, xc, xd = act.q8c()
        matmul(w.nib, w.sc, xq, xc, xd, out, K.n_chunks(w.nib.shape[0]))

    def qkv(wq, wk, wv, act, q, k, v):
        xq, xc, xd = act.q8c()
        matvec3(wq.nib, wq.sc, wk.nib, wk.sc, wv.nib, wv.sc, xq, xc, xd, q[0], k[0], v[0],
                K.n_chunks(wq.nib.shape[0] + wk.nib.shape[0] + wv.nib.shape[0]))

    def fused_swiglu(wg, wu, act, out):
        xq, xc, xd = act.q8c()
        swiglu(wg.nib, wg.sc, wu.nib, wu.sc, xq, xc, xd, out[0], K.n_chunks(wg.nib.shape[0]))

    register("Q4_0_V16", "one", isa, name=f"matvec_q4_v16{suffix}")(one)
    register("Q4_0_V16", "many", isa, name=f"matmul_q4_v16{suffix}")(many)
    register("Q4_0_V16", "qkv", isa, name=f"matvec3_q4_v16{suffix}")(qkv)
    register("Q4_0_V16", "swiglu", isa, name=f"matvec_swiglu_q4_v16{suffix}")(fused_swiglu)
    register("Q4_0_V16", "layers", isa, name=f"decode_layers_v16{suffix}")(step.make_decode_layers("v16" + suffix))


_register_v16(PORTABLE, "", V.matvec_q4_v16, V.matvec3_q4_v16, V.matvec_swiglu_q4_v16, V.matmul_q4_v16)
_register_v16("avx512_vnni", "_vnni", V.matvec_q4_v16_vnni, V.matvec3_q4_v16_vnni, V.matvec_swiglu_q4_v16_vnni,
              V.matmul_q4_v16_vnni)
