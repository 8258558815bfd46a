"""The one table of Q4_0 kernel variants: how plain Q4_0 can be kept in memory and multiplied, per ISA.

Each ``Variant`` is declared once here with everything the rest of the package needs to know about it:
the registry layout it serves and the CPU feature it needs (``registry`` registers its kernels from
this table), the rows per group and the load-time copy that makes its layout (``engine.model``), the
instruction its inner loop multiplies with and the function that does one row group for one token
(``roofline.int8_dot_peak`` times it), and its kernels for the whole decode step (``step``, through the
``matvec`` / ``matvec3`` / ``swiglu`` stubs below, which numba resolves from this table at compile time).

==============  ===========  ===========  =====  =============================================
variant         layout       isa          rows   inner loop
==============  ===========  ===========  =====  =============================================
``r32``         Q4_0_R32     portable     32     int16 lanes, ``vpmullw`` (rows as lanes)
``v16``         Q4_0_V16     portable     16     plain loops (the VNNI kernels' exact twin)
``v16_vnni``    Q4_0_V16     avx512_vnni  16     ``vpdpbusd``
``v16_avx2``    Q4_0_V16     avx2         16     ``vpmaddubsw`` + ``vpmaddwd``
``plain``       Q4_0         portable     —      16 int16 lanes on the file's bytes (no copy)
``plain_sdot``  Q4_0         dotprod      —      ``sdot`` (the A76's int8 dot) on the file's bytes
==============  ===========  ===========  =====  =============================================

The order is the registry's order: for one (layout, call), ``registry.select`` takes the first
ISA-specific kernel the host supports, so ``v16_vnni`` comes before ``v16_avx2``. Adding a variant is one
entry here (and its kernels in ``ops`` or ``v16``). Taught in day06_3 (the table) and day07_3.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from numba import types
from numba.extending import overload

from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import v16 as V

PORTABLE = "portable"


@dataclass(frozen=True)
class Variant:
    """One way to keep and multiply Q4_0 weights (see the module table)."""

    name: str                   # the table's key, also the suffix the whole-step kernel is named by
    layout: str                 # the registry layout whose kernels these are
    isa: str                    # the host feature the kernels need (``PORTABLE``: none)
    suffix: str                 # suffix of the registered kernels' names ("_vnni", "_sdot", "")
    stem: str                   # their stem: matvec_<stem><suffix>, matmul_<stem><suffix>, …
    rows_per_group: int         # rows per group of the layout's planes (1: the file's own rows)
    instruction: str            # what the inner loop multiplies with, for reports
    matvec: Callable            # the numba kernels on this layout (signatures in ``registry``)
    matvec3: Callable
    swiglu: Callable
    matmul: Callable
    group: Callable | None = None   # one row group × one token: the roofline's compute-limit loop runs it
    repack: Callable | None = None  # plain Q4_0 → this layout's (nibbles, scales) planes; None: no copy
    experts: tuple | None = None    # (gate+up, down) grouped MoE expert kernels on the file's bytes
    matmul_stem: str = "matmul_"    # the prefill kernel's name prefix

    @property
    def prefetches(self) -> bool:
        """Whether its decode kernels take a prefetch distance (``kernels.v16``; measured by ``kernels.choice``)."""
        return self.layout == "Q4_0_V16"

    @property
    def planes(self) -> bool:
        """Whether the layout is made at load (row-grouped planes) rather than the file's own bytes."""
        return self.repack is not None

    def kernel_name(self, call: str) -> str:
        """The registered name of this variant's kernel for ``call``."""
        prefix = {"one": "matvec_", "many": self.matmul_stem, "qkv": "matvec3_", "swiglu": "matvec_swiglu_",
                  "experts": "experts_"}
        if call == "layers":
            return f"decode_layers_{self.name}"
        return f"{prefix[call]}{self.stem}{self.suffix}"


VARIANTS: tuple[Variant, ...] = (
    Variant("r32", "Q4_0_R32", PORTABLE, "", "q4_r32", K.QR, "int16 lanes (vpmullw, rows as lanes)",
            K.matvec_q4_r32, K.matvec3_q4_r32, K.matvec_swiglu_q4_r32, K.matmul_q4_r32,
            group=K._group_r32, repack=K.repack_q4_0_to_r32),
    Variant("v16", "Q4_0_V16", PORTABLE, "", "q4_v16", V.QV, "plain loops",
            V.matvec_q4_v16, V.matvec3_q4_v16, V.matvec_swiglu_q4_v16, V.matmul_q4_v16,
            group=V._group_portable, repack=V.repack_q4_0_to_v16),
    Variant("v16_vnni", "Q4_0_V16", "avx512_vnni", "_vnni", "q4_v16", V.QV, "vpdpbusd",
            V.matvec_q4_v16_vnni, V.matvec3_q4_v16_vnni, V.matvec_swiglu_q4_v16_vnni, V.matmul_q4_v16_vnni,
            group=V._group_vnni, repack=V.repack_q4_0_to_v16),
    Variant("v16_avx2", "Q4_0_V16", "avx2", "_avx2", "q4_v16", V.QV, "vpmaddubsw + vpmaddwd",
            V.matvec_q4_v16_avx2, V.matvec3_q4_v16_avx2, V.matvec_swiglu_q4_v16_avx2, V.matmul_q4_v16_avx2,
            group=V._group_avx2, repack=V.repack_q4_0_to_v16),
    Variant("plain", "Q4_0", PORTABLE, "", "q4_0", 1, "16 int16 lanes per block (no copy)",
            K.matvec_q4_0, K.matvec3_q4_0, K.matvec_swiglu_q4_0, K.matmul_rows_q4_0,
            experts=(K.experts_swiglu_q4_0, K.experts_down_q4_0), matmul_stem="matmul_rows_"),
    Variant("plain_sdot", "Q4_0", "dotprod", "_sdot", "q4_0", 1, "sdot (int8 dot, no copy)",
            K.matvec_q4_0_sdot, K.matvec3_q4_0_sdot, K.matvec_swiglu_q4_0_sdot, K.matmul_rows_q4_0_sdot,
            experts=(K.experts_swiglu_q4_0_sdot, K.experts_down_q4_0_sdot), matmul_stem="matmul_rows_"),
)
BY_NAME = {v.name: v for v in VARIANTS}
PLANE_LAYOUTS = {v.layout: v.rows_per_group for v in VARIANTS if v.planes}   # made at load → rows per group


def of(name: str) -> Variant:
    """The variant called ``name`` (a clear error naming the known ones)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"no Q4_0 variant {name!r}: expected one of {', '.join(BY_NAME)}") from None


def repack_for(layout: str) -> Callable:
    """The load-time copy that makes ``layout``'s planes from plain Q4_0."""
    return next(v.repack for v in VARIANTS if v.layout == layout and v.planes)


def supported(features: frozenset[str]) -> list[Variant]:
    """The variants a host with ``features`` can run, in table order."""
    return [v for v in VARIANTS if v.isa == PORTABLE or v.isa in features]


# --------------------------------------------------------------------------- stubs numba resolves by name
# ``matvec(name, …)`` inside a numba function calls variant ``name``'s kernel: ``name`` must be a compile-time
# constant (a closure variable of a factory, as in ``step.make_decode_layers``), and numba picks the kernel
# from the table while it types the caller. The caller's on-disk cache key stays the name (a string), where
# a closure over the kernels themselves would change it in every process.
def _literal(name) -> Variant:
    if not isinstance(name, types.StringLiteral):
        return None
    return of(name.literal_value)


def matvec(name, nib, sc, xq, xc, xd, out, nchunk, prefetch):
    """Variant ``name``'s ``out = W x`` on its planes (numba only). ``prefetch``: how far ahead the ``Q4_0_V16``
    kernels prefetch (``kernels.choice`` measures it per machine); the other layouts do not use it."""
    raise NotImplementedError("variants.matvec is resolved by numba inside a compiled function")


def matvec3(name, na, sa, nb, sb, nc, sc, xq, xc, xd, oa, ob, oc, nchunk, prefetch):
    """Variant ``name``'s Q, K and V of one token in one parallel region (numba only)."""
    raise NotImplementedError("variants.matvec3 is resolved by numba inside a compiled function")


def swiglu(name, ng, sg, nu, su, xq, xc, xd, out, nchunk, prefetch):
    """Variant ``name``'s ``silu(Wgate x) · (Wup x)`` in one pass (numba only)."""
    raise NotImplementedError("variants.swiglu is resolved by numba inside a compiled function")


def group(name, nib, sc, x8, x32, xc, xd, F, Si, Sf):
    """Variant ``name``'s one row group × one token into ``F`` (numba only): ``x8`` the token's int8
    activations and ``x32`` the same bytes as int32 words, ``Si``/``Sf`` one int32 scratch of K/32·rows
    and its float32 view (each variant reads the forms it needs)."""
    raise NotImplementedError("variants.group is resolved by numba inside a compiled function")


@overload(matvec, jit_options={"cache": True})
def _ov_matvec(name, nib, sc, xq, xc, xd, out, nchunk, prefetch):
    v = _literal(name)
    if v is None:
        return None
    fn = v.matvec
    if v.prefetches:
        def impl(name, nib, sc, xq, xc, xd, out, nchunk, prefetch):
            fn(nib, sc, xq, xc, xd, out, nchunk, prefetch)
    else:
        def impl(name, nib, sc, xq, xc, xd, out, nchunk, prefetch):
            fn(nib, sc, xq, xc, xd, out, nchunk)
    return impl


@overload(matvec3, jit_options={"cache": True})
def _ov_matvec3(name, na, sa, nb, sb, nc, sc, xq, xc, xd, oa, ob, oc, nchunk, prefetch):
    v = _literal(name)
    if v is None:
        return None
    fn = v.matvec3
    if v.prefetches:
        def impl(name, na, sa, nb, sb, nc, sc, xq, xc, xd, oa, ob, oc, nchunk, prefetch):
            fn(na, sa, nb, sb, nc, sc, xq, xc, xd, oa, ob, oc, nchunk, prefetch)
    else:
        def impl(name, na, sa, nb, sb, nc, sc, xq, xc, xd, oa, ob, oc, nchunk, prefetch):
            fn(na, sa, nb, sb, nc, sc, xq, xc, xd, oa, ob, oc, nchunk)
    return impl


@overload(swiglu, jit_options={"cache": True})
def _ov_swiglu(name, ng, sg, nu, su, xq, xc, xd, out, nchunk, prefetch):
    v = _literal(name)
    if v is None:
        return None
    fn = v.swiglu
    if v.prefetches:
        def impl(name, ng, sg, nu, su, xq, xc, xd, out, nchunk, prefetch):
            fn(ng, sg, nu, su, xq, xc, xd, out, nchunk, prefetch)
    else:
        def impl(name, ng, sg, nu, su, xq, xc, xd, out, nchunk, prefetch):
            fn(ng, sg, nu, su, xq, xc, xd, out, nchunk)
    return impl


@overload(group, jit_options={"cache": True})
def _ov_group(name, nib, sc, x8, x32, xc, xd, F, Si, Sf):
    v = _literal(name)
    if v is None:
        return None
    fn = v.group
    if v.layout == "Q4_0_R32":       # int16 lanes: int8 activations, scale bits read back as float32
        def impl(name, nib, sc, x8, x32, xc, xd, F, Si, Sf):
            fn(nib, sc, x8, xc, xd, F, Si, Sf)
    else:                            # 16-row groups: the activations as int32 words of four bytes
        def impl(name, nib, sc, x8, x32, xc, xd, F, Si, Sf):
            fn(nib, sc, x32, xc, xd, F, Si, V.PREFETCH_BYTES)
    return impl


__all__ = ["Variant", "VARIANTS", "BY_NAME", "PLANE_LAYOUTS", "PORTABLE", "of", "repack_for", "supported",
           "matvec", "matvec3", "swiglu", "group"]
