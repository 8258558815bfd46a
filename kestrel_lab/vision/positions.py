"""Qwen3-VL's 3-D rotary positions (MRoPE) for a prompt with images: where each token sits on (t, h, w).

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

The frequency side — which of the head_dim/2 frequencies follows t, h or w, and the cos/sin tables — is
``kernels.rope`` (``axis_of_frequency``, ``mrope_cos_sin``): one function for the engine and the lessons.
numpy only. Taught in day21_1 and day21_2.
"""
from __future__ import annotations

import numpy as np

__all__ = ["mrope_positions", "image_token_count", "image_pad_runs"]


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
                    start: int = 0, image_positions=None) -> tuple[np.ndarray, int]:
    """(3, seq) int64 positions (t, h, w) of a token sequence whose image pads are already expanded.

    ``grid_thws``: one (t, h, w) patch grid per image, in order of appearance; each image must be one
    contiguous run of exactly t·h·w/merge² pads (the chat template puts ``<|vision_start|>`` /
    ``<|vision_end|>`` around it). ``start``: the rope position of the first token — a later turn passes
    the position where the previous one stopped (the engine keeps it apart from the cache length).

    Returns (positions, delta) with delta = max position + 1 − (start + seq): the rope position of the
    next token is ``start + seq + delta``; with ``start`` = 0 this is transformers' ``rope_deltas``, and
    over several turns the deltas add up to the one of the whole conversation. ``image_positions``: a
    student's ``vision.image_positions`` piece to place each image with (``kestrel_lab.seam``).
    Taught in day21_2.
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
        if image_positions is not None:                  # a student's piece (``kestrel_lab.seam``)
            img, nxt = image_positions(pos, (t, h, w), merge_size)
            out[:, a:b] = np.asarray(img, np.int64).reshape(3, b - a)
            pos = int(nxt)
            at = b
            continue
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
