"""Rotary position embedding, Qwen's way ("rotate half"), and the MRoPE helper of Qwen3-VL.

RoPE rotates each pair of coordinates of q and k by an angle proportional to the token's position,
so that q·k depends only on the distance between the two tokens. Qwen (like Llama in HF) pairs
coordinate ``i`` with ``i + D/2`` — not ``2i`` with ``2i+1`` as the original paper — so the rotation is

    out[i]       = x[i]·cos θᵢ − x[i + D/2]·sin θᵢ
    out[i + D/2] = x[i + D/2]·cos θᵢ + x[i]·sin θᵢ,      θᵢ = pos · theta^(−2i/D),  i < D/2.

The tables are computed the way ``transformers`` computes them (float32 ``inv_freq``, float32 angle,
float32 cos/sin), so an F32 engine matches ``Qwen3ForCausalLM`` to float rounding.

MRoPE (Qwen3-VL) gives each frequency index one of three position components (time, height, width),
chosen by ``mrope_section`` (e.g. [24, 20, 20] of the 64 frequencies), interleaved or in blocks. For
text tokens all three components equal the 1-D position, so MRoPE reduces exactly to 1-D RoPE — the
text tower of Qwen3-VL runs on this engine unchanged (``mrope_cos_sin``, tested against ``rope_cos_sin``).
Taught in day09_1, day09_2 and day18_3.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_lab import rope_scaling


def inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """``theta^(-2i/D)`` for i < D/2, in float32 as transformers computes it. Taught in day09_1."""
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even for RoPE")
    expo = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / (np.float32(theta) ** expo)).astype(np.float32)


def rope_cos_sin(positions, head_dim: int, theta: float, scaling=None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables (n, D/2) float32 for the given 1-D positions; ``scaling``: the config's linear
    or yarn ``rope_scaling`` (``kestrel_lab.rope_scaling``), None for plain RoPE. Taught in day09_2."""
    if scaling is not None:
        return rope_scaling.cos_sin(positions, head_dim, theta, scaling)
    pos = np.asarray(positions, dtype=np.float32).reshape(-1)
    ang = pos[:, None] * inv_freq(head_dim, theta)[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def mrope_cos_sin(positions3, head_dim: int, theta: float, mrope_section, interleaved: bool = False,
                  scaling=None):
    """cos and sin tables (n, D/2) for 3-D positions (3, n) = (t, h, w), Qwen3-VL's MRoPE.

    Frequency index ``i`` takes its angle from component ``c(i)``: with ``interleaved`` (Qwen3-VL),
    indices cycle t, h, w, t, h, w … with the t-slots beyond the h/w sections staying t; otherwise
    the first ``mrope_section[0]`` indices use t, the next ``mrope_section[1]`` h, the rest w.
    With text-only positions (t = h = w) the result equals ``rope_cos_sin``. Taught in day18_3.
    """
    p = np.asarray(positions3, dtype=np.float32)
    if p.ndim != 2 or p.shape[0] != 3:
        raise ValueError(f"positions3 must have shape (3, n), got {p.shape}")
    half = head_dim // 2
    sec = list(mrope_section)
    if sum(sec) != half or len(sec) != 3:
        raise ValueError(f"mrope_section {sec} must be 3 sections (t, h, w) summing to head_dim/2 = {half}")
    comp = np.zeros(half, dtype=np.int64)
    if interleaved:
        for c in (1, 2):
            idx = np.arange(c, 3 * sec[c], 3)
            comp[idx[idx < half]] = c
    else:
        comp[sec[0]:sec[0] + sec[1]] = 1
        comp[sec[0] + sec[1]:] = 2
    freq = inv_freq(head_dim, theta) if scaling is None else rope_scaling.inv_freq(head_dim, theta, scaling)
    ang = p[comp, :].T * freq[None, :]   # (n, half): position of each index's component
    a = rope_scaling.attention_factor(scaling)
    return (np.cos(ang) * a).astype(np.float32), (np.sin(ang) * a).astype(np.float32)


@njit(cache=True)
def apply_rope(x, cos, sin):
    """Rotate ``x`` (T, heads, D) in place; ``cos``/``sin`` (T, D/2) are the rows of its positions.

    Taught in day09_2.
    """
    T, H, D = x.shape
    half = D // 2
    for t in range(T):
        for h in range(H):
            for i in range(half):
                a = x[t, h, i]
                b = x[t, h, i + half]
                c = cos[t, i]
                s = sin[t, i]
                x[t, h, i] = a * c - b * s
                x[t, h, i + half] = b * c + a * s
