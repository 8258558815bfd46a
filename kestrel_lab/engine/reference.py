"""A plain numpy Qwen3 (and Qwen2) forward doing the engine's math.

``reference_logits`` is the engine written the slow, obvious way: every matrix is dequantized from
the same blocks (``kestrel_lab.quant.dequantize``), and — for quantized weights — the activation
vector is quantized to Q8_0 with ``quant.quantize_q8_0`` and dequantized again, which is exactly the
value the engine's integer dot products see. Dot products are then float64 matmuls. Agreement with
the engine to ~1e-5 relative shows the kernels compute what they claim; any larger gap is a bug.

What the gap costs (KL, top-1 agreement, max difference: ``eval.logit_agreement``) is measured a floor
above, in ``kestrel_lab.eval``. Taught in day12_3 (the notebook checks its own 30-line forward against
``reference_logits``).
"""
from __future__ import annotations

import numpy as np

from kestrel_lab import quant as Q
from kestrel_lab import rope_scaling
from kestrel_lab.config import ModelConfig


def _deq(t) -> np.ndarray:
    return Q.dequantize(t.data, t.qtype, t.rows, t.cols).astype(np.float64)


def _act(x: np.ndarray, qtype: int) -> np.ndarray:
    """What a matrix of ``qtype`` multiplies: x itself for float weights, Q8_0(x) for block formats."""
    if qtype in (Q.F32.id, Q.F16.id):
        return x.astype(np.float64)
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    return Q.dequantize_q8_0(Q.quantize_q8_0(x32), *x32.shape).astype(np.float64)


def _rmsnorm(x, w, eps):
    x = x.astype(np.float32)
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + eps)).astype(np.float32)) * w


def _rope(x, pos, theta, scaling=None):
    """Rotate-half RoPE on x (T, H, D) at positions ``pos`` (T,); ``scaling``: the config's linear/yarn."""
    D = x.shape[-1]
    inv = 1.0 / (np.float32(theta) ** (np.arange(0, D, 2).astype(np.float32) / np.float32(D)))
    ang = np.asarray(pos, np.float32)[:, None] * inv.astype(np.float32)[None, :]
    c, s = (np.cos(ang), np.sin(ang)) if scaling is None else rope_scaling.cos_sin(pos, D, theta, scaling)
    cos = np.concatenate([c, c], -1)[:, None, :]
    sin = np.concatenate([s, s], -1)[:, None, :]
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return (x * cos + rot * sin).astype(np.float32)


def reference_logits(config: ModelConfig, tensors, ids) -> np.ndarray:
    """Logits (T, vocab) float32 of ``ids`` from position 0, by the slow numpy route. Taught in day12_3."""
    c = config
    ids = np.asarray(ids, dtype=np.int64)
    T, H, KVH, D, L = ids.size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.num_hidden_layers
    eps = c.rms_norm_eps

    def f32(n):
        return tensors[n].data.view("<f4").reshape(tensors[n].rows, tensors[n].cols)

    emb = tensors["token_embed"]
    table = emb.data.view("<f4" if emb.qtype == Q.F32.id else "<f2").reshape(emb.rows, emb.cols)
    h = table[ids].astype(np.float32)
    mats = {n: tensors[n] for n in ("q4_q", "q4_k", "q4_v", "q4_o", "q4_gate", "q4_up", "q4_down")}
    full = {n: _deq(t) for n, t in mats.items()}
    per = {"q4_q": c.q_dim, "q4_k": c.kv_dim, "q4_v": c.kv_dim, "q4_o": c.hidden_size,
           "q4_gate": c.intermediate_size, "q4_up": c.intermediate_size, "q4_down": c.hidden_size}

    def lin(name, layer, x):
        r = per[name]
        w = full[name][layer * r:(layer + 1) * r]
        return (_act(x, mats[name].qtype) @ w.T).astype(np.float32)

    pos = np.arange(T)
    group = H // KVH
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    for layer in range(L):
        x = _rmsnorm(h, f32("attn_norm")[layer], eps)
        q, k, v = lin("q4_q", layer, x), lin("q4_k", layer, x), lin("q4_v", layer, x)
        if c.attention.qkv_bias:            # Qwen2: projections with bias
            q, k, v = q + f32("q_bias")[layer], k + f32("k_bias")[layer], v + f32("v_bias")[layer]
        q, k, v = q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D)
        if c.attention.qk_norm:             # Qwen3: per-head RMSNorm of q and k
            q, k = _rmsnorm(q, f32("q_norm")[layer], eps), _rmsnorm(k, f32("k_norm")[layer], eps)
        q, k = _rope(q, pos, c.rope_theta, c.rope_scaling), _rope(k, pos, c.rope_theta, c.rope_scaling)
        o = np.empty((T, H, D), np.float32)
        for hh in range(H):
            s = (q[:, hh, :].astype(np.float64) @ k[:, hh // group, :].T.astype(np.float64)) / np.sqrt(D) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            o[:, hh, :] = p @ v[:, hh // group, :]
        h = h + lin("q4_o", layer, o.reshape(T, H * D))
        x = _rmsnorm(h, f32("ffn_norm")[layer], eps)
        g, u = lin("q4_gate", layer, x), lin("q4_up", layer, x)
        h = h + lin("q4_down", layer, (g / (1 + np.exp(-g)) * u).astype(np.float32))
    hn = _rmsnorm(h, f32("final_norm")[0], eps)
    lm = tensors["q4_lm"]
    return (_act(hn, lm.qtype) @ _deq(lm).T).astype(np.float32)
