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
The positions themselves (where an image's tokens sit on the grid) are ``vision.positions``'; this module
is the one place their frequencies, angles and rotation are computed, for the engine and the lessons alike.
Taught in day09_1, day09_2 and day18_3.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_lab import rope_scaling


def inv_freq(head_dim: int, theta: float, scaling=None) -> np.ndarray:
    """The head_dim/2 inverse frequencies ``theta^(-2i/D)``, float32, each the correctly rounded value; with
    ``scaling`` (the config's linear or yarn ``rope_scaling``) the scaled ones (``kestrel_lab.rope_scaling``,
    where the arithmetic lives, as transformers computes it).

    transformers computes ``theta ** (arange(0, D, 2) / D)`` with torch's float32 ``pow``, which is
    correctly rounded for every head_dim and theta of the Qwen configs (16–128; 1e4, 1e6, 5e6) but for a
    rare ulp; numpy's own float32 ``power`` is less exact (it differs from torch on up to 15 of the 64
    frequencies of head_dim 128), so the power is taken in float64 and rounded once. Taught in day09_1
    and day18_3.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even for RoPE")
    return rope_scaling.inv_freq(head_dim, theta, scaling)


def rope_cos_sin(positions, head_dim: int, theta: float, scaling=None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables (n, D/2) float32 for the given 1-D positions (float32 angles, as transformers);
    ``scaling``: the config's linear or yarn ``rope_scaling`` (cos and sin then carry its attention factor),
    None for plain RoPE. Taught in day09_2."""
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even for RoPE")
    return rope_scaling.cos_sin(positions, head_dim, theta, scaling)


def axis_of_frequency(head_dim: int, mrope_section, interleaved: bool = True) -> np.ndarray:
    """For each of the head_dim/2 frequencies, the axis (0 t, 1 h, 2 w) whose position drives it.

    Interleaved (Qwen3-VL, transformers' ``recomposition_frequencies``): index 1, 4, 7, … take h and
    2, 5, 8, … take w over the first 3·sections indices, the rest t. Chunked (Qwen2-VL's layout): the
    first sections[0] t, the next sections[1] h, the rest w. Taught in day18_3.
    """
    half = head_dim // 2
    sec = [int(s) for s in mrope_section]
    if head_dim % 2 or len(sec) != 3 or sum(sec) != half:
        raise ValueError(f"mrope_section {sec} must be 3 numbers summing to head_dim/2 = {half}")
    axis = np.zeros(half, dtype=np.int64)
    if interleaved:
        for ax, offset in ((1, 1), (2, 2)):       # slice(offset, 3·sec[ax], 3), as transformers
            axis[offset:3 * sec[ax]:3] = ax
    else:
        axis[sec[0]:sec[0] + sec[1]] = 1
        axis[sec[0] + sec[1]:] = 2
    return axis


def mrope_cos_sin(positions3, head_dim: int, theta: float, mrope_section,
                  interleaved: bool = True, scaling=None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables (n, D/2) float32 for 3-D positions (3, n) = (t, h, w): Qwen3-VL's MRoPE.

    Frequency ``i`` takes its angle from the position of axis ``axis_of_frequency(i)``. transformers
    repeats the half (``cat(f, f)``) into (n, D) tables; ``apply_rope`` uses the half for both
    coordinates of a rotated pair, so the half is all the engine keeps. With text-only positions
    (t = h = w) the result equals ``rope_cos_sin``. ``scaling`` as in ``rope_cos_sin``. Taught in day18_3.
    """
    p = np.asarray(positions3)
    if p.ndim != 2 or p.shape[0] != 3:
        raise ValueError(f"mrope_cos_sin: positions must have shape (3, n), got {p.shape}")
    axis = axis_of_frequency(head_dim, mrope_section, interleaved)
    ang = p.astype(np.float32)[axis, :].T * inv_freq(head_dim, theta, scaling)[None, :]   # (n, half)
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
