"""A whole decode step in one numba call, when every layer matrix is in a row-grouped Q4_0 layout.

``make_decode_layers(variant)`` is the per-layer code of ``Qwen3Engine._forward`` for one token (same
kernels, same order of float operations, so the logits are bit-identical) compiled as a single
function: at 30+ tok/s one step lasts ~25 ms and the interpreter's ~20 calls per layer would otherwise
cost several of them. The variant's kernels come from ``variants`` (its ``matvec`` / ``matvec3`` /
``swiglu`` stubs, resolved while numba compiles the step); the registry registers one step per
row-grouped variant as its ``(layout, "layers")`` kernel. Taught in day11_2.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import variants
from kestrel_lab.kernels.attention import attend
from kestrel_lab.kernels.rope import apply_rope


@njit(cache=True)
def _q8c_into(x, xq_buf, xd_buf, xc_buf):
    """``Activation.q8c`` for one token inside numba: quantize ``x`` (1, n) into the front of the
    buffers; returns the (1, n) int8, (1, n/32) ``−8·Σx`` and (1, n/32) scale views."""
    n = x.shape[1]
    nb = n // K.QK
    xq, xd, xc = xq_buf[:n].reshape(1, n), xd_buf[:nb].reshape(1, nb), xc_buf[:nb].reshape(1, nb)
    K.quantize_act(x, xq, xd)
    K.act_block_sums(xq, xc)
    return xq, xc, xd


@lru_cache(maxsize=None)
def make_decode_layers(kind: str):
    """The whole-step kernel on one row-grouped variant's kernels (``kind``: a name of ``variants.VARIANTS``
    with planes, e.g. "r32" or "v16_vnni"). numba freezes the closure's ``kind`` as a constant and the
    ``variants`` stubs pick that variant's kernels while it compiles (a closure over the kernels
    themselves would change numba's on-disk cache key in every process). Taught in day11_2."""
    variant = variants.of(kind)
    if not variant.planes:
        raise ValueError(f"variant {kind!r} keeps the file's rows: the whole-step kernel needs row-grouped planes")
    G = variant.rows_per_group

    @njit(cache=True)
    def decode_layers(h, eps, attn_norm, ffn_norm, q_norm, k_norm, qkv_bias, qk_norm, has_bias, planes, kc_all,
                      vc_all, pos, cos, sin, H, nt, prefetch):
        """Every layer of one decode step in a single numba call, all seven matrices row-interleaved Q4_0.

        Exactly the per-layer code of ``Qwen3Engine._forward`` (same kernels, same order of float
        operations, so the logits are bit-identical), without its ~20 Python-level calls per layer, whose
        dispatch and argument checks would cost several ms of a ~25 ms step. The parallel kernels it calls
        still run on all numba threads. The architecture's attention traits (``config.ATTENTION_TRAITS``) come as
        ``qk_norm`` (Qwen3: per-head RMSNorm of q and k, ``q_norm``/``k_norm`` (L, D)) and ``has_bias``
        (Qwen2: ``qkv_bias`` = (q, k, v) biases, each (L, dim), added after the projections); an
        absent tensor is an empty (L, 0) array. ``h`` (1, hidden) is updated in place; ``planes`` is the tuple
        (nibbles, scales) × (q, k, v, o, gate, up, down), each the whole stack of layers; ``kc_all``/``vc_all``
        the KV cache (layers, kv_heads, max_context, head_dim), written at ``pos``; ``nt`` the thread count (a
        matvec is cut into ``4·nt`` chunks); ``prefetch`` the kernels' prefetch distance (``kernels.choice``).
        """
        qn, qs, kn, ks, vn, vs, on, os_, gn, gs, un, us, dn, ds = planes
        qb, kb, vb = qkv_bias
        L, hid = attn_norm.shape
        KVH, D = kc_all.shape[1], kc_all.shape[3]
        inter = gn.shape[0] * G // L
        gq, gk, go, gg, gd = qn.shape[0] // L, kn.shape[0] // L, on.shape[0] // L, gn.shape[0] // L, dn.shape[0] // L
        cqkv, co, cg, cd = min(gq + 2 * gk, 4 * nt), min(go, 4 * nt), min(gg, 4 * nt), min(gd, 4 * nt)   # chunks
        x = np.empty((1, hid), np.float32)
        q = np.empty((1, H, D), np.float32)
        k = np.empty((1, KVH, D), np.float32)
        v = np.empty((1, KVH, D), np.float32)
        o = np.empty((1, H, D), np.float32)
        g = np.empty((1, inter), np.float32)
        y = np.empty(hid, np.float32)
        n = max(hid, H * D, inter)
        xq_buf, xd_buf, xc_buf = np.empty(n, np.int8), np.empty(n // K.QK, np.float32), np.empty(n // K.QK, np.int16)
        for l in range(L):  # noqa: E741  (l: the layer index, kept short in the slices below)
            # attention block: norm → Q, K, V → q/k norm → RoPE → cache → attention → Wo, residual
            K.rmsnorm(h, attn_norm[l], eps, x)
            xq, xc, xd = _q8c_into(x, xq_buf, xd_buf, xc_buf)
            # (arguments spelled out, not ``*tuple``: numba keeps ``kind`` a constant only in a plain call)
            variants.matvec3(kind, qn[l * gq:(l + 1) * gq], qs[l * gq:(l + 1) * gq], kn[l * gk:(l + 1) * gk],
                             ks[l * gk:(l + 1) * gk], vn[l * gk:(l + 1) * gk], vs[l * gk:(l + 1) * gk],
                             xq, xc, xd, q.reshape(-1), k.reshape(-1), v.reshape(-1), cqkv, prefetch)
            if has_bias:
                qf, kf, vf = q.reshape(-1), k.reshape(-1), v.reshape(-1)
                for i in range(qf.size):
                    qf[i] += qb[l, i]
                for i in range(kf.size):
                    kf[i] += kb[l, i]
                    vf[i] += vb[l, i]
            if qk_norm:
                K.rmsnorm_heads(q, q_norm[l], eps)
                K.rmsnorm_heads(k, k_norm[l], eps)
            apply_rope(q, cos, sin)
            apply_rope(k, cos, sin)
            kc_all[l, :, pos, :] = k[0]
            vc_all[l, :, pos, :] = v[0]
            attend(q, kc_all[l], vc_all[l], pos, o)
            xq, xc, xd = _q8c_into(o.reshape(1, H * D), xq_buf, xd_buf, xc_buf)
            variants.matvec(kind, on[l * go:(l + 1) * go], os_[l * go:(l + 1) * go], xq, xc, xd, y, co, prefetch)
            for i in range(hid):
                h[0, i] += y[i]
            # feed-forward block: norm → silu(Wgate x)·(Wup x) → Wdown, residual
            K.rmsnorm(h, ffn_norm[l], eps, x)
            xq, xc, xd = _q8c_into(x, xq_buf, xd_buf, xc_buf)
            variants.swiglu(kind, gn[l * gg:(l + 1) * gg], gs[l * gg:(l + 1) * gg], un[l * gg:(l + 1) * gg],
                            us[l * gg:(l + 1) * gg], xq, xc, xd, g.reshape(-1), cg, prefetch)
            xq, xc, xd = _q8c_into(g, xq_buf, xd_buf, xc_buf)
            variants.matvec(kind, dn[l * gd:(l + 1) * gd], ds[l * gd:(l + 1) * gd], xq, xc, xd, y, cd, prefetch)
            for i in range(hid):
                h[0, i] += y[i]

    return decode_layers


decode_layers_r32 = make_decode_layers("r32")
decode_layers_r32.__doc__ = """Every layer of one decode step on ``Q4_0_R32`` weights (``make_decode_layers``).

Taught in day11_2."""
