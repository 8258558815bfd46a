"""The weights and activations every kernel call takes: ``Linear``, ``Activation``, ``RawTensor``.

A ``Linear`` is one weight matrix in its storage format (a VQF entry's bytes, or the row-grouped planes
made from plain Q4_0 at load); calling it with an ``Activation`` runs the registry's kernel for its
layout. An ``Activation`` quantizes itself once (Q8_0, the row-interleaved kernels' block sums, the
Q4_8X8L lanes) however many matrices read it. The text engine, the MoE experts and the vision tower all
build on these two, so they live on the kernels floor with the registry. Taught in day05_3 and day12_1.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kestrel_lab import quant as Q
from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import registry


@dataclass
class RawTensor:
    """A tensor given as bytes (qtype, rows, cols, flat uint8): what a VQF directory entry points at.

    ``from_tensors`` accepts any object with these four attributes (the VQF reader's ``VQFTensor``
    has them), so tests and notebooks can run the engine on weights built in memory. Taught in day12_1.
    """
    qtype: int
    rows: int
    cols: int
    data: np.ndarray


class Linear:
    """One weight matrix (or one layer's slice of a stacked one) in its storage format.

    ``__call__(act)`` returns ``act.x @ W.T`` as float32 (T, rows) with the kernels the registry
    gives its layout (``kernel_one`` for one token, ``kernel_many`` for many). ``r32``: the
    (nibbles, scales) planes of a plain Q4_0 matrix made by ``kernels.ops.repack_q4_0_to_r32``; when
    given, the layout is ``planes_layout`` (``Q4_0_R32`` or ``Q4_0_V16``) and they are what the kernels read.
    Taught in day12_1.
    """

    def __init__(self, qtype: int, rows: int, cols: int, data: np.ndarray, name: str = "", r32=None,
                 planes_layout: str = "Q4_0_R32"):
        self.qt = Q.qtype(qtype)
        self.rows, self.cols, self.name = rows, cols, name
        self.nbytes = int(data.size)
        # Plain Q4_0 split and row-grouped at load (``kernels.ops.repack_q4_0_to_r32``, or
        # ``kernels.v16.repack_q4_0_to_v16`` for ``planes_layout="Q4_0_V16"``): the planes (nibbles,
        # scales) that every product with this matrix then reads instead of ``w``.
        self.nib, self.sc = r32 if r32 is not None else (None, None)
        self.planes_layout = planes_layout
        q = self.qt
        if q is Q.F32:
            self.w = data.view("<f4").reshape(rows, cols)
        elif q is Q.F16:
            self.w = data.view("<u2").reshape(rows, cols)
        elif q is Q.Q4_8X8L:
            self.w = data.reshape(-1)
        else:
            self.w = data.reshape(rows, self.nbytes // rows)
        if self.w.flags.writeable:          # one numba specialization for mmap and in-memory weights
            self.w = self.w.view()
            self.w.setflags(write=False)
        self.layout = registry.layout_of(self)
        self.kernel_one, self.kernel_many = kernel_for(self.layout, "one"), kernel_for(self.layout, "many")

    def __call__(self, act: "Activation") -> np.ndarray:
        T = act.x.shape[0]
        out = np.empty((T, self.rows), dtype=np.float32)
        (self.kernel_one if T == 1 else self.kernel_many)(self, act, out)
        return out


class Activation:
    """Activations (T, K) float32 and, computed on first use, their Q8_0 and Q4_8X8L-lane forms.

    Several matrices read the same vector (q/k/v; gate/up), so it is quantized once. Taught in day05_3.
    """

    def __init__(self, x: np.ndarray):
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self._q8 = None
        self._e = None
        self._c = None

    def q8(self):
        """(int8 values, float32 scales) of the Q8_0 form, computed once. Taught in day05_3."""
        if self._q8 is None:
            T, Kd = self.x.shape
            xq = np.empty((T, Kd), np.int8)
            xd = np.empty((T, Kd // K.QK), np.float32)
            K.quantize_rows(self.x, xq, xd)
            self._q8 = (xq, xd)
        return self._q8

    def q8c(self):
        """(int8 values, ``−8·Σx`` per block, scales) for the row-interleaved Q4_0 kernels, computed once.

        Taught in day23_2."""
        if self._c is None:
            xq, xd = self.q8()
            xc = np.empty(xd.shape, np.int16)
            K.act_block_sums(xq, xc)
            self._c = xc
        return self._q8[0], self._c, self._q8[1]

    def x8x8(self):
        """(int16 lane planes, scales) for the Q4_8X8L kernels, computed once. Taught in day06_2."""
        if self._e is None:
            xq, xd = self.q8()
            T, Kd = xq.shape
            xe = np.empty((T, Kd // K.QK, 5, 64), np.int16)
            K.expand_act_8x8(xq, xe)
            self._e = (xe, xd)
        return self._e


@lru_cache(maxsize=None)
def kernel_for(layout: str, call: str):
    """The registry's kernel for (layout, call) on this host, looked up once; ``one`` and ``many`` must exist."""
    k = registry.select(layout, call)
    if k is None and call in ("one", "many"):
        raise ValueError(f"no kernel is registered for {layout} weights ({call})")
    return k


def fused_kernel(call: str, a: "Activation", *mats: Linear):
    """The registry's fused kernel for one token and matrices of one layout, else None."""
    if a.x.shape[0] != 1 or any(m.layout != mats[0].layout for m in mats):
        return None
    return kernel_for(mats[0].layout, call)


__all__ = ["RawTensor", "Linear", "Activation", "kernel_for", "fused_kernel"]
