"""Qwen3-VL's 3-D rotary positions (MRoPE) for a prompt with images, and their cos/sin tables.

A text token has one position p, written three times: (t, h, w) = (p, p, p). An image's ``<|image_pad|>``
tokens (one per 2×2 block of patches, row-major over the merged grid H' × W') all start from the
position ``s`` the image is reached at and spread over the grid instead of along the sequence::

    t = s + frame,   h = s + row,   w = s + col          (row < H', col < W')

and the text after the image continues from ``s + max(H', W')`` — not from ``s + H'·W'``. So after an
image the rope position is no longer the token's index in the KV cache: it runs behind by
``H'·W' − max(H', W')``. That lag is the *rope delta* (``max position + 1 − tokens``, ≤ 0); every later
token, decode included, gets position ``index + delta`` on all three axes. This is transformers 5.24's
``Qwen3VLModel.get_rope_index`` / ``get_vision_position_ids`` rule, rewritten in numpy (and tested
against it).

The frequency side (``mrope_cos_sin``): head_dim/2 frequencies, each assigned to one axis. Qwen3-VL
*interleaves* them — index 0, 3, 6, … take t, 1, 4, … take h, 2, 5, … take w for the first
3·sections, the rest stay t (``recomposition_frequencies``), e.g. [24, 20, 20] for head_dim 128 — then
duplicates the half for rotate-half RoPE. With t = h = w (text only) every axis gives the same angle,
so the tables equal plain 1-D RoPE exactly.

numpy only, and nothing from the engine: the engine imports this module (an import back would be a cycle).
Taught in day21_2 (positions) and day18_3 (frequencies).
"""
from __future__ import annotations

import numpy as np

__all__ = ["mrope_positions", "mrope_cos_sin", "inv_freq", "axis_of_frequency", "image_token_count",
           "image_pad_runs"]


def image_token_count(grid_thw, merge_size: int = 2) -> int:
    """LLM tokens of one image: t·h·w / merge² (the pads it expands to). Taught in day21_1."""
    t, h, w = (int(x) for x in grid_thw)
    if t < 1 or h < 1 or w < 1:
        raise ValueError(f"grid_thw {tuple(grid_thw)}: every side must be ≥ 1")
    if h % merge_size or w % merge_size:
        raise ValueError(f"grid_thw {tuple(grid_thw)}: h and w must be multiples of merge_size={merge_size}")
    return t * h * w // (merge_size * merge_size)


def image_pad_runs(ids, image_pad_id: int) -> list[tuple[int, int]]:
    """(start, end) of every maximal run of image pads, in order: one run per image. Taught in day21_2."""
    is_pad = np.concatenate([[False], np.asarray(ids).reshape(-1) == image_pad_id, [False]])
    edges = np.flatnonzero(is_pad[1:] != is_pad[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[0::2], edges[1::2])]


def mrope_positions(input_ids, grid_thws, *, image_pad_id: int, merge_size: int = 2,
                    start: int = 0) -> tuple[np.ndarray, int]:
    """(3, seq) int64 positions (t, h, w) of a token sequence whose image pads are already expanded.

    ``grid_thws``: one (t, h, w) patch grid per image, in order of appearance; each image must be one
    contiguous run of exactly t·h·w/merge² pads (the chat template puts ``<|vision_start|>`` /
    ``<|vision_end|>`` around it). ``start``: the rope position of the first token — a later turn passes
    the position where the previous one stopped (the engine keeps it apart from the cache length).

    Returns (positions, delta) with delta = max position + 1 − (start + seq): the rope position of the
    next token is ``start + seq + delta``; with ``start`` = 0 this is transformers' ``rope_deltas``, and
    over several turns the deltas add up to the one of the whole conversation. Taught in day21_2.
    """
    ids = np.asarray(input_ids).reshape(-1)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"mrope_positions: input_ids must be integers, got dtype {ids.dtype}")
    if start < 0:
        raise ValueError(f"mrope_positions: start={start} must be ≥ 0")
    grids = [tuple(int(x) for x in g) for g in grid_thws]
    runs = image_pad_runs(ids, image_pad_id)
    if len(runs) != len(grids):
        raise ValueError(f"mrope_positions: {len(runs)} runs of image pads (id {image_pad_id}) in the ids "
                         f"but {len(grids)} image grids")
    out = np.empty((3, ids.size), dtype=np.int64)
    pos = start   # the next position (HF's current_pos)
    at = 0        # the next token index
    for k, ((a, b), (t, h, w)) in enumerate(zip(runs, grids)):
        n = image_token_count((t, h, w), merge_size)
        if b - a != n:
            raise ValueError(f"mrope_positions: image {k} (grid {(t, h, w)}) needs {n} pads, the run at token "
                             f"{a} has {b - a}")
        out[:, at:a] = np.arange(pos, pos + a - at)     # text before the image: t = h = w
        pos += a - at
        hh, ww = h // merge_size, w // merge_size
        tt, rr, cc = np.meshgrid(np.arange(t), np.arange(hh), np.arange(ww), indexing="ij")
        out[0, a:b] = pos + tt.reshape(-1)               # time_interval 1 for images
        out[1, a:b] = pos + rr.reshape(-1)
        out[2, a:b] = pos + cc.reshape(-1)
        pos += max(hh, ww)                               # HF: max(h, w) // merge, whatever t is
        at = b
    out[:, at:] = np.arange(pos, pos + ids.size - at)
    top = int(out.max()) + 1 if ids.size else start
    return out, top - (start + ids.size)


def axis_of_frequency(head_dim: int, mrope_section, interleaved: bool = True) -> np.ndarray:
    """For each of the head_dim/2 frequencies, the axis (0 t, 1 h, 2 w) whose position drives it.

    Interleaved (Qwen3-VL): t, h, w, t, h, w … over 3·sections[1] indices, the rest t. Chunked (Qwen2-VL's
    layout, for comparison): the first sections[0] t, the next sections[1] h, the rest w. Taught in day18_3.
    """
    half = head_dim // 2
    sec = [int(s) for s in mrope_section]
    if head_dim % 2 or len(sec) != 3 or sum(sec) != half:
        raise ValueError(f"mrope_section {sec} must be 3 numbers summing to head_dim/2 = {half}")
    axis = np.zeros(half, dtype=np.int64)
    if interleaved:
        for ax, offset in ((1, 1), (2, 2)):       # recomposition_frequencies: slice(offset, 3·sec[ax], 3)
            axis[offset:3 * sec[ax]:3] = ax
    else:
        axis[sec[0]:sec[0] + sec[1]] = 1
        axis[sec[0] + sec[1]:] = 2
    return axis


def inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """The head_dim/2 inverse frequencies ``theta^(-2i/D)``, float32, each the correctly rounded value.

    transformers computes ``theta ** (arange(0, D, 2) / D)`` with torch's float32 ``pow``, which is within
    an ulp of this (on this machine it differs for one of the 64 frequencies of head_dim 128); numpy's
    own float32 ``power`` is less exact, so the power is taken in float64 and rounded once.
    Taught in day18_3.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even for RoPE")
    expo = (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim))
    power = np.float64(theta) ** expo.astype(np.float64)
    return (np.float32(1.0) / power.astype(np.float32)).astype(np.float32)


def mrope_cos_sin(positions, head_dim: int, theta: float, mrope_section,
                  interleaved: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """float32 cos and sin, (n, head_dim), for 3-D positions (3, n): rotate-half RoPE with MRoPE.

    Computed as transformers does (float32 inverse frequencies, float32 angles), then the half is repeated
    (``cat(f, f)``) so row i rotates coordinates i and i + head_dim/2 by the same angle. Taught in day18_3.
    """
    p = np.asarray(positions)
    if p.ndim != 2 or p.shape[0] != 3:
        raise ValueError(f"mrope_cos_sin: positions must have shape (3, n), got {p.shape}")
    axis = axis_of_frequency(head_dim, mrope_section, interleaved)
    ang = p.astype(np.float32)[axis, :].T * inv_freq(head_dim, theta)[None, :]     # (n, half)
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
