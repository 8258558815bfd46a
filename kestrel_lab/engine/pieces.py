"""The engine with the student's pieces in it: one forward step, each operation a piece when one is swapped in.

``Qwen3Engine`` built while pieces are swapped in (``kestrel_lab.seam``) runs ``forward`` below instead of
its own ``_forward``: the same layer, in the same order, written with one call per operation so that
each call can be the student's function (``seam.PIECES``) or, for a piece not swapped in, the package's
kernel. With no piece swapped in the engine never comes here — its own path, and its speed, are unchanged.

================  =======================================================  ==============================
piece             where it runs                                            the package's own
================  =======================================================  ==============================
quantize_act      the activation before every plain Q4_0 product           ``ops.quantize_act``
matvec_q4_0       every plain Q4_0 product (the file's rows, one token      ``ops.matvec_q4_0``
                  at a time)
rmsnorm           the two norms of a layer and the final norm               ``ops.rmsnorm``
rmsnorm_heads     Qwen3's q/k norm                                          ``ops.rmsnorm_heads``
rope_cos_sin      the tables of every position (MRoPE: one table per axis,  ``rope.rope_cos_sin``
                  each frequency's column from its axis)
apply_rope        q and k                                                   ``rope.apply_rope``
attention         each layer's attention over its KV cache                  ``attention.attend``
route             each MoE layer's router (``moe.MoELayer``)               ``moe.route``
================  =======================================================  ==============================

Matrices the student's matvec cannot read (F32, F16, Q8_0 — the vision tower's, say) stay the package's.
Taught in day30_1.
"""
from __future__ import annotations

import numpy as np

from kestrel_lab import quant as Q
from kestrel_lab import seam
from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels.attention import attend
from kestrel_lab.kernels.linear import Activation
from kestrel_lab.kernels.rope import apply_rope, axis_of_frequency, rope_cos_sin

ENGINE_PIECES = ("kernels.quantize_act", "kernels.matvec_q4_0", "layers.rmsnorm", "layers.rmsnorm_heads",
                 "layers.rope_cos_sin", "layers.apply_rope", "layers.attention", "moe.route")
MATVEC_PIECES = ("kernels.quantize_act", "kernels.matvec_q4_0")


def engine_pieces() -> dict:
    """The engine's pieces swapped in now ({key: function}); empty when the package runs alone."""
    return {k: fn for k in ENGINE_PIECES if (fn := seam.get(k)) is not None}


def _f32(a, shape, piece: str) -> np.ndarray:
    """A piece's result as float32 of the expected shape, or a clear error naming the piece."""
    out = np.asarray(a, dtype=np.float32)
    if out.shape != tuple(shape):
        raise ValueError(f"piece {piece} returned shape {out.shape}, expected {tuple(shape)}")
    return out


class PieceOps:
    """The operations of one forward step, each the swapped-in piece or the package's kernel."""

    def __init__(self, pieces: dict):
        self.pieces = dict(pieces)
        self.get = self.pieces.get

    def check_scaling(self, config, source: str) -> None:
        """The ``layers.rope_cos_sin`` piece computes plain RoPE: a model whose config scales RoPE (linear,
        yarn) would run other math with it, so it is refused, naming the file and the field."""
        if config.rope_scaling is not None and "layers.rope_cos_sin" in self.pieces:
            raise ValueError(f"{source}: rope_scaling is {config.rope_scaling.rope_type}; the piece "
                             f"layers.rope_cos_sin computes plain RoPE, so the student's engine cannot run this "
                             f"model (take the piece out, or use a model without rope scaling)")

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        fn = self.get("layers.rmsnorm")
        if fn is None:
            out = np.empty_like(x)
            K.rmsnorm(x, w, np.float32(eps), out)
            return out
        return _f32(fn(x.copy(), w, float(eps)), x.shape, "layers.rmsnorm")

    def rmsnorm_heads(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        fn = self.get("layers.rmsnorm_heads")
        if fn is None:
            out = x.copy()
            K.rmsnorm_heads(out, w, np.float32(eps))
            return out
        return _f32(fn(x.copy(), w, float(eps)), x.shape, "layers.rmsnorm_heads")

    def rope_tables(self, positions: np.ndarray, head_dim: int, theta: float, mrope=None, scaling=None):
        """cos, sin (T, D/2) of 1-D positions (T,), or of 3-D ones (3, T) with ``mrope`` = (section, interleaved):
        each frequency's column taken from the 1-D table of its axis's positions. ``scaling``: the config's
        rope scaling — the package's tables then (``check_scaling`` refuses the piece for such a model)."""
        piece = self.get("layers.rope_cos_sin")
        fn = piece if piece is not None else (lambda p, d, t: rope_cos_sin(p, d, t, scaling))
        half = head_dim // 2
        if mrope is None:
            c, s = fn(np.asarray(positions).reshape(-1), head_dim, theta)
            n = np.asarray(positions).size
            return _f32(c, (n, half), "layers.rope_cos_sin"), _f32(s, (n, half), "layers.rope_cos_sin")
        pos3 = np.asarray(positions)
        axis = axis_of_frequency(head_dim, mrope[0], mrope[1])
        tables = [fn(pos3[a], head_dim, theta) for a in range(3)]
        cols = np.arange(half)
        cos = np.stack([_f32(tables[a][0], (pos3.shape[1], half), "layers.rope_cos_sin") for a in range(3)])
        sin = np.stack([_f32(tables[a][1], (pos3.shape[1], half), "layers.rope_cos_sin") for a in range(3)])
        return np.ascontiguousarray(cos[axis, :, cols].T), np.ascontiguousarray(sin[axis, :, cols].T)

    def apply_rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        fn = self.get("layers.apply_rope")
        if fn is None:
            out = x.copy()
            apply_rope(out, np.ascontiguousarray(cos), np.ascontiguousarray(sin))
            return out
        return _f32(fn(x.copy(), cos, sin), x.shape, "layers.apply_rope")

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
        """q (T, H, D) over the cache k, v (KVH, pos0 + T, D)."""
        fn = self.get("layers.attention")
        if fn is None:
            out = np.empty_like(q)
            attend(q, k, v, pos0, out)
            return out
        return _f32(fn(q.copy(), np.array(k), np.array(v)), q.shape, "layers.attention")

    def linear(self, w, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` (T, rows): the student's Q8_0 activation and Q4_0 matvec on plain Q4_0 weights when
        swapped in, one token row at a time; the package's kernel for everything else."""
        if w.qt is not Q.Q4_0 or w.nib is not None or not any(k in self.pieces for k in MATVEC_PIECES):
            return w(Activation(x))
        quant, matvec = self.get("kernels.quantize_act"), self.get("kernels.matvec_q4_0")
        out = np.empty((x.shape[0], w.rows), np.float32)
        nb = w.cols // K.QK
        for t in range(x.shape[0]):
            if quant is None:
                xq, xd = np.empty((1, w.cols), np.int8), np.empty((1, nb), np.float32)
                K.quantize_act(x[t:t + 1], xq, xd)
                xq, xd = xq[0], xd[0]
            else:
                xq, xd = quant(x[t].copy())
                xq, xd = np.asarray(xq, np.int8).reshape(w.cols), np.asarray(xd, np.float32).reshape(nb)
            if matvec is None:
                y = np.empty((1, w.rows), np.float32)
                K.matvec_q4_0(w.w, xq[None], xd[None], K.F16_TO_F32, y[0], K.n_chunks(w.rows))
                out[t] = y[0]
            else:
                out[t] = _f32(matvec(w.w, xq, xd), (w.rows,), "kernels.matvec_q4_0")
        return out


def _attention_block(eng, ops: PieceOps, layer: int, x: np.ndarray, cos, sin, pos0: int) -> np.ndarray:
    """Q, K, V → (bias) → q/k norm → RoPE → cache → attention → Wo: the attention half of one layer."""
    c, m = eng.config, eng.layers[layer]
    T = x.shape[0]
    H, KVH, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q, k, v = (ops.linear(m[n], x) for n in ("q4_q", "q4_k", "q4_v"))
    if eng.qkv_bias:
        q, k, v = q + eng.q_bias[layer], k + eng.k_bias[layer], v + eng.v_bias[layer]
    q, k, v = q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D)
    eps = c.rms_norm_eps
    if eng.qk_norm:
        q, k = ops.rmsnorm_heads(q, eng.q_norm[layer], eps), ops.rmsnorm_heads(k, eng.k_norm[layer], eps)
    q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
    kc, vc = eng.cache.k[layer], eng.cache.v[layer]
    kc[:, pos0:pos0 + T, :] = k.transpose(1, 0, 2)
    vc[:, pos0:pos0 + T, :] = v.transpose(1, 0, 2)
    o = ops.attention(q, kc[:, :pos0 + T], vc[:, :pos0 + T], pos0)
    return ops.linear(m["q4_o"], o.reshape(T, H * D))


def forward(eng, ops: PieceOps, ids: np.ndarray, last_only: bool, positions=None, images=None) -> np.ndarray:
    """``Qwen3Engine._forward`` with every operation through ``ops``: logits of the last id (or of all)."""
    c = eng.config
    T, pos0, eps = ids.size, eng.cache.pos, c.rms_norm_eps
    cos, sin = eng._rope_tables(T, positions, ops)
    h = eng._embed(ids)
    if images is not None:
        h[images.mask] = images.embeds          # the merger's output replaces the pad embeddings
    for layer, m in enumerate(eng.layers):
        h = h + _attention_block(eng, ops, layer, ops.rmsnorm(h, eng.attn_norm[layer], eps), cos, sin, pos0)
        x = ops.rmsnorm(h, eng.ffn_norm[layer], eps)
        if layer in eng.moe_layers:
            h = h + eng.moe_layers[layer](x)
        else:
            g, u = ops.linear(m["q4_gate"], x), ops.linear(m["q4_up"], x)
            K.silu_mul_rows(g, u, g)
            h = h + ops.linear(m["q4_down"], g)
        if images is not None and layer < len(images.deepstack):
            h[images.mask] += images.deepstack[layer]   # DeepStack: after layer 0, 1, …
        if eng.trace is not None:
            eng.trace(layer, h)
    eng.cache.pos = pos0 + T
    hs = h[-1:] if last_only else h
    return ops.linear(eng.lm_head, ops.rmsnorm(hs, eng.final_norm, eps))
