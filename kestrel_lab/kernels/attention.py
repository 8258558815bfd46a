"""Grouped-query attention over the KV cache, for prefill (causal, many tokens) and decode (one).

Query head ``h`` reads KV head ``h // (heads / kv_heads)`` (GQA: Qwen3-0.6B has 16 query heads sharing
8 KV heads). For a token at absolute position ``p`` the scores are ``q·k_j / sqrt(D)`` for ``j ≤ p``
(the causal mask is just the loop bound), softmax in float32 with the max subtracted, and the output
is ``Σ softmax_j · v_j``. Prefill and decode are the same kernel: decode is prefill of one token.
Work is split over ``prange`` by (token, head) pairs, which are independent.
Taught in day10_1 (one head), day10_2 (GQA) and day10_3 (causal prefill).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(parallel=True, fastmath=True, cache=True)
def attend(q, kc, vc, pos0, out):
    """Attention for T new tokens at positions ``pos0 … pos0+T−1``.

    ``q`` (T, heads, D) rotated queries; ``kc``/``vc`` (kv_heads, max_context, D) one layer's cache,
    already holding the new tokens' keys/values; ``out`` (T, heads, D). Taught in day10_3.
    """
    T, H, D = q.shape
    KVH = kc.shape[0]
    group = H // KVH
    scale = np.float32(1.0 / math.sqrt(D))
    for th in prange(T * H):
        t = th // H
        h = th % H
        kvh = h // group
        n = pos0 + t + 1
        s = np.empty(n, np.float32)
        qv = q[t, h]
        for j in range(n):
            kr = kc[kvh, j]
            acc = np.float32(0.0)
            for i in range(D):
                acc += qv[i] * kr[i]
            s[j] = acc * scale
        m = s[0]
        for j in range(1, n):
            if s[j] > m:
                m = s[j]
        tot = np.float32(0.0)
        for j in range(n):
            e = np.exp(s[j] - m)
            s[j] = e
            tot += e
        inv = np.float32(1.0) / tot
        o = out[t, h]
        for i in range(D):
            o[i] = 0.0
        for j in range(n):
            p = s[j] * inv
            vr = vc[kvh, j]
            for i in range(D):
                o[i] += p * vr[i]


def attend_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
    """The same attention in plain numpy (for tests and the notebooks): q (T, H, D), k/v (KVH, n, D).

    Taught in day10_2.
    """
    T, H, D = q.shape
    group = H // k.shape[0]
    out = np.zeros_like(q)
    for t in range(T):
        n = pos0 + t + 1
        for h in range(H):
            s = k[h // group, :n] @ q[t, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h] = p @ v[h // group, :n]
    return out
