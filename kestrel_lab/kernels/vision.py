"""The numba kernels the vision tower needs beyond the text engine's: LayerNorm, two GELUs, bias, softmax.

The text tower uses RMSNorm and SiLU; the ViT of Qwen3-VL uses what a ViT uses:

- ``layernorm``: ``(x − mean) / sqrt(var + eps) · w + b`` (biased variance, eps 1e-6 hard-coded in
  transformers' ``Qwen3VLVisionBlock`` and ``Qwen3VLVisionPatchMerger``). Mean and variance are
  accumulated in float64 (two passes), so the result does not depend on the width;
- ``gelu_tanh``: ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` — the blocks' MLP (``hidden_act =
  gelu_pytorch_tanh``);
- ``gelu_erf``: ``0.5·x·(1 + erf(x/√2))`` — the exact GELU of all four mergers (``nn.GELU()``).
  Swapping the two moves the merger output by ~1e-3: small enough to look plausible, large enough
  to fail a 1e-4 comparison, which is why both exist;
- ``add_bias``: every ``Linear`` of the tower has a bias (the text tower's have none);
- ``softmax_rows``: in place over the last axis, max subtracted (the attention scores of one head).

- ``attend_bidirectional``: the attention of every patch over its own image, fused (no n×n matrix), one
  query and one key at a time — the plain version; the tower runs ``kernels.vit_attention``'s tiles.

The element-wise kernels are serial on purpose: some of the tower's linear layers are BLAS sgemms (the
patch embedding, the mergers, the block matrices of an F32 file), which run OpenBLAS's own threads, and
a numba-parallel kernel between two BLAS calls makes the two thread pools take turns on the same cores
and stall each other (measured on 2 cores: attention of 320 patches 15× slower when a parallel softmax
ran between per-head BLAS calls). Q8_0 block matrices go through ``kernels.q8gemm`` (numba threads).
Taught in day19_2.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

SQRT_2_OVER_PI = 0.7978845608028654
INV_SQRT_2 = 0.7071067811865476


@njit(cache=True)
def layernorm(x, w, b, eps, out):
    """LayerNorm over the last axis of ``x`` (T, D) with weight ``w`` and bias ``b`` (D,) into ``out``.

    Taught in day19_2.
    """
    T, D = x.shape
    for t in range(T):
        s = 0.0
        for i in range(D):
            s += np.float64(x[t, i])
        mean = s / D
        ss = 0.0
        for i in range(D):
            d = np.float64(x[t, i]) - mean
            ss += d * d
        inv = 1.0 / math.sqrt(ss / D + eps)
        m32, inv32 = np.float32(mean), np.float32(inv)
        for i in range(D):
            out[t, i] = (x[t, i] - m32) * inv32 * w[i] + b[i]


@njit(cache=True, inline="always")
def gelu_tanh_scalar(v):
    """One float32 through the tanh GELU: the operations of ``gelu_tanh``, shared with the fused epilogue
    of ``kernels.q8gemm`` so that fused and unfused give the same bits."""
    c = np.float32(SQRT_2_OVER_PI)
    return np.float32(0.5) * v * (np.float32(1.0) + np.tanh(c * (v + np.float32(0.044715) * v * v * v)))


@njit(cache=True)
def gelu_tanh(x):
    """In place: ``0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))`` (PyTorch ``gelu(approximate="tanh")``).

    Taught in day19_2.
    """
    T, D = x.shape
    for t in range(T):
        for i in range(D):
            x[t, i] = gelu_tanh_scalar(x[t, i])


@njit(cache=True)
def gelu_erf(x):
    """In place: the exact GELU ``0.5·x·(1 + erf(x/√2))`` (PyTorch ``nn.GELU()``). Taught in day20_1."""
    T, D = x.shape
    for t in range(T):
        for i in range(D):
            v = np.float64(x[t, i])
            x[t, i] = np.float32(0.5 * v * (1.0 + math.erf(v * INV_SQRT_2)))


@njit(cache=True)
def add_bias(x, b):
    """In place: ``x[t] += b`` for every row of ``x`` (T, D). Taught in day19_1."""
    T, D = x.shape
    for t in range(T):
        for i in range(D):
            x[t, i] += b[i]


@njit(cache=True)
def softmax_rows(s):
    """In place: softmax over the last axis of ``s`` (R, n), the row maximum subtracted first."""
    R, n = s.shape
    for r in range(R):
        m = s[r, 0]
        for j in range(1, n):
            if s[r, j] > m:
                m = s[r, j]
        tot = np.float32(0.0)
        for j in range(n):
            e = np.exp(s[r, j] - m)
            s[r, j] = e
            tot += e
        inv = np.float32(1.0) / tot
        for j in range(n):
            s[r, j] *= inv


@njit(parallel=True, fastmath=True, cache=True)
def attend_bidirectional(q, k, v, seg_start, seg_end, out):
    """Bidirectional attention of every patch over the patches of its own image, all heads, fused.

    ``q``/``k``/``v`` (heads, N, D) float32 (rotated q and k); ``seg_start[i]``/``seg_end[i]`` the
    rows of patch i's image; ``out`` (heads, N, D). Scores ``q·k/√D``, softmax with the maximum
    subtracted, weighted sum of values — one (head, patch) pair per work item, so the n×n score
    matrix is never stored. A single parallel region per block, not one per head between BLAS calls
    (which made the two thread pools stall each other). The plain version: the tower runs
    ``kernels.vit_attention.attend_segments_tiled``, and the tests compare the two.
    """
    H, N, D = q.shape
    scale = np.float32(1.0 / math.sqrt(D))
    for hi in prange(H * N):
        h = hi // N
        i = hi % N
        a, b = seg_start[i], seg_end[i]
        s = np.empty(b - a, np.float32)
        qv = q[h, i]
        m = np.float32(-3.0e38)
        for j in range(a, b):
            kr = k[h, j]
            acc = np.float32(0.0)
            for d in range(D):
                acc += qv[d] * kr[d]
            acc *= scale
            s[j - a] = acc
            if acc > m:
                m = acc
        tot = np.float32(0.0)
        for j in range(b - a):
            e = np.exp(s[j] - m)
            s[j] = e
            tot += e
        inv = np.float32(1.0) / tot
        o = out[h, i]
        for d in range(D):
            o[d] = 0.0
        for j in range(a, b):
            p = s[j - a] * inv
            vr = v[h, j]
            for d in range(D):
                o[d] += p * vr[d]


__all__ = ["layernorm", "gelu_tanh", "gelu_erf", "add_bias", "softmax_rows", "attend_bidirectional"]
