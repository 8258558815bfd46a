"""The Qwen3-VL vision tower: image patches → merged tokens for the language model, plus DeepStack features.

Exactly transformers' ``Qwen3VLVisionModel.forward`` (5.24), in this order:

1. **patch embedding** — the Conv3d (kernel = stride = (T=2, 16, 16)) is one matmul per patch:
   ``x = pixels (N, C·T·P·P) @ v_patch.T + b`` (the VQF stores the kernel flattened to a matrix);
2. **learned position table**, ``num_position_embeddings`` = side² entries (48×48 for the 2B model),
   resampled bilinearly with ``align_corners=True`` to each image's (h, w) patch grid and added;
   patches are in 2×2-merge-block order, as the preprocessor emits them (``patch_rows_cols``);
3. **2-D RoPE**: the head dimension is split in two; the first half rotates with the patch row, the
   second with its column, ``head_dim/4`` frequencies each at theta 10,000 (rotate-half pairing);
4. ``depth`` pre-norm blocks: ``x += proj(attn(LN1(x)))``, ``x += fc2(gelu_tanh(fc1(LN2(x))))`` —
   LayerNorm with bias (eps 1e-6), fused qkv with bias, **bidirectional** attention inside each
   image (``cu_seqlens``: patches of different images never see each other);
5. after the blocks listed in ``deepstack_visual_indexes``, a **DeepStack merger** (2×2 concat first,
   then LayerNorm(4·width), fc1 → exact GELU → fc2 to the text width) keeps a feature per LLM token;
6. the **main merger**: LayerNorm per patch, 2×2 concat, fc1 → exact GELU → fc2.

Weights are read where the VQF put them: the four block matrices (qkv, proj, fc1, fc2) in the file's
qtype — Q8_0 in a quantized file, as the article's — through the engine's kernel registry's ``gemm``
call: for Q8_0 the int8 GEMM of ``kernels.q8gemm`` (the activations quantized to Q8_0 once per matmul,
the weights regrouped 16 rows at a time when the tower is built, ``vpdpbusd`` on an AVX-512 VNNI host,
``vpmaddubsw`` on AVX2, a portable twin elsewhere, with the bias — and for fc1 the tanh GELU — applied as
each tile is written). The attention is ``kernels.vit_attention.attend_segments_tiled``: register tiles of
queries × keys inside each image, never the n×n matrix. Everything else is F32 (numpy matmuls).
Shapes come from ``vqf.layout.vision_specs``. Taught in day19_1, day19_2, day20_1 and day20_2.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from kestrel_lab import quant as Q
from kestrel_lab import seam
from kestrel_lab.config import ModelConfig
from kestrel_lab.kernels import q8gemm, registry
from kestrel_lab.kernels import vision as VK
from kestrel_lab.kernels import vit_attention as VA
from kestrel_lab.kernels.linear import Activation, Linear
from kestrel_lab.kernels.rope import apply_rope
from kestrel_lab.threads import numba_threads, resolve_threads
from kestrel_lab.vision.positions import image_token_count
from kestrel_lab.vqf.layout import vision_specs

LN_EPS = 1e-6          # hard-coded in transformers' vision blocks and mergers
VISION_THETA = 10000.0  # the vision RoPE's theta (transformers' default_theta; no config key)
BLOCK_MATRICES = ("v_q8_qkv", "v_q8_proj", "v_q8_fc1", "v_q8_fc2")


@dataclass
class VisionOutput:
    """What the tower returns for a batch of images.

    ``embeds`` (tokens, out_hidden): the main merger's output, one row per ``<|image_pad|>``, images
    in order; ``deepstack``: one (tokens, out_hidden) array per DeepStack merger, in the order they are
    added to the language model (after decoder layers 0, 1, …); ``tokens``: LLM tokens per image;
    ``seconds``: wall time of the encode. Taught in day20_2.
    """

    embeds: np.ndarray
    deepstack: list[np.ndarray]
    tokens: list[int]
    seconds: float = 0.0
    grid_thw: list[tuple[int, int, int]] = field(default_factory=list)

    def split(self) -> list["VisionOutput"]:
        """One ``VisionOutput`` per image (views into this one's arrays)."""
        out, a = [], 0
        for n, g in zip(self.tokens, self.grid_thw):
            out.append(VisionOutput(self.embeds[a:a + n], [d[a:a + n] for d in self.deepstack], [n],
                                    self.seconds * n / max(1, sum(self.tokens)), [g]))
            a += n
        return out


# --------------------------------------------------------------------------- geometry (numpy, small)
def check_grids(grid_thw, merge: int, n_rows: int | None = None) -> np.ndarray:
    """``grid_thw`` as an int64 (images, 3) array, checked: positive, h and w multiples of ``merge``,
    and (when ``n_rows`` is given) t·h·w summing to the number of patch rows. Taught in day19_1."""
    g = np.asarray(grid_thw, dtype=np.int64)
    if g.ndim == 1:
        g = g.reshape(1, -1)
    if g.ndim != 2 or g.shape[1] != 3 or g.shape[0] == 0:
        raise ValueError(f"grid_thw must be (t, h, w) triples, got shape {g.shape}")
    if (g <= 0).any():
        raise ValueError(f"grid_thw {g.tolist()}: every t, h, w must be ≥ 1")
    if (g[:, 1:] % merge).any():
        raise ValueError(f"grid_thw {g.tolist()}: h and w must be multiples of the merge size {merge}")
    if n_rows is not None and int(g.prod(axis=1).sum()) != n_rows:
        raise ValueError(f"grid_thw {g.tolist()} describes {int(g.prod(axis=1).sum())} patches, "
                         f"pixel_values has {n_rows} rows")
    return g


def patch_rows_cols(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of each patch of an h×w grid in 2×2-merge-block order (block by block, row-major
    inside a block) — the order the preprocessor emits patches in. Taught in day19_1."""
    r, c = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return (r.reshape(shape).transpose(0, 2, 1, 3).reshape(-1),
            c.reshape(shape).transpose(0, 2, 1, 3).reshape(-1))


def _axis_taps(idx: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear taps (floor, floor+1, clamped) and weights of ``align_corners=True`` resampling."""
    src = idx.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    fl = np.floor(src)
    raw = fl.astype(np.int64)[:, None] + np.arange(2)[None, :]
    dist = np.abs(src[:, None] - fl[:, None] - np.arange(2, dtype=np.float32)[None, :])
    return np.clip(raw, 0, side - 1), np.maximum(np.float32(1.0) - dist, np.float32(0.0)).astype(np.float32)


def pos_interpolation(grid_thw, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (N, 4) into the side×side position table and weights (N, 4) for every patch.

    Per axis ``src = i·(side−1)/(size−1)``; taps ``floor(src)`` and ``floor(src)+1`` clamped to the
    table, weight ``1 − |src − tap|``; the 2-D taps are the outer product. A frame's table repeats
    for every t. Taught in day19_3.
    """
    idx, wts = [], []
    for t, h, w in check_grids(grid_thw, merge):
        r, c = patch_rows_cols(int(h), int(w), merge)
        ht, hw = _axis_taps(r, int(h), side)
        wt, ww = _axis_taps(c, int(w), side)
        i = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
        x = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
        idx.append(np.tile(i, (int(t), 1)))
        wts.append(np.tile(x, (int(t), 1)))
    return np.concatenate(idx), np.concatenate(wts)


def rotary_cos_sin(grid_thw, head_dim: int, merge: int, theta: float = VISION_THETA):
    """cos, sin (N, head_dim/2) float32 of the 2-D vision RoPE, for ``rope.apply_rope``.

    ``inv_freq = theta^(−2i/(head_dim/2))`` for ``i < head_dim/4``; the angle table is
    ``[row·inv_freq, col·inv_freq]``: the first half of each rotated pair set follows the patch row,
    the second the column. Taught in day19_2.
    """
    spatial = head_dim // 2
    inv = (np.float32(1.0) / (np.float32(theta) ** (np.arange(0, spatial, 2).astype(np.float32)
                                                     / np.float32(spatial)))).astype(np.float32)
    rows, cols = [], []
    for t, h, w in check_grids(grid_thw, merge):
        r, c = patch_rows_cols(int(h), int(w), merge)
        rows.append(np.tile(r, int(t)))
        cols.append(np.tile(c, int(t)))
    r = np.concatenate(rows).astype(np.float32)
    c = np.concatenate(cols).astype(np.float32)
    ang = np.concatenate([r[:, None] * inv[None, :], c[:, None] * inv[None, :]], axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def cu_seqlens(grid_thw) -> np.ndarray:
    """Start offsets of every attention segment plus the end: one segment per frame (h·w patches).

    Taught in day19_2.
    """
    g = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    lens = np.repeat(g[:, 1] * g[:, 2], g[:, 0])
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def attend_segments(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu: np.ndarray) -> np.ndarray:
    """Bidirectional multi-head attention inside each segment: q, k, v (N, heads, D) → (N, heads·D).

    Scores ``q·k/√D`` for every pair of patches of the same segment (no causal mask), softmax over
    keys, weighted sum of values: ``kernels.vit_attention.attend_segments_tiled``, tiles of 8 queries ×
    16 keys kept in registers, one (head, query tile) per work item, so the n×n score matrix is never
    stored. (``kernels.vision.attend_bidirectional``, one (head, patch) pair and one key at a time, is
    the plain version the lesson writes first.) Taught in day19_2.
    """
    return VA.attend_segments_tiled(q, k, v, cu)


def matmul(w: Linear, x: np.ndarray, bias: np.ndarray | None = None, gelu: bool = False) -> np.ndarray:
    """``gelu_tanh?(x @ W.T + bias)`` (T, rows) float32 with the registry's ``gemm`` kernel for the weight's
    layout (bias and GELU fused into its epilogue), else ``many``/``one`` and the epilogue after.

    Taught in day19_2."""
    k = registry.select(w.layout, "gemm")
    if k is None:
        out = w(Activation(x))
        if bias is not None:
            VK.add_bias(out, bias)
        if gelu:
            VK.gelu_tanh(out)
        return out
    out = np.empty((x.shape[0], w.rows), np.float32)
    k(w, Activation(x), out, bias, gelu)
    return out


# --------------------------------------------------------------------------- the tower
class VisionTower:
    """The vision tower of a Qwen3-VL model, on the VQF tensors (zero copy).

    ``encode(pixel_values, grid_thw)`` → ``VisionOutput``. ``pixel_values``: (patches, C·T·P·P)
    float32, images one after the other, each in merge-block order (what the preprocessor returns);
    ``grid_thw``: (t, h, w) per image. Taught in day20_2.
    """

    def __init__(self, config: ModelConfig, tensors, *, threads: int | None = None, source: str = "<tensors>"):
        self.merge_piece = seam.get("vision.merge")    # a student's main merger (``kestrel_lab.seam``), else ours
        if config.vision is None:
            raise ValueError(f"{source}: the config has no vision_config (not a Qwen3-VL model)")
        v = self.vc = config.vision
        if v.hidden_act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"{source}: vision hidden_act {v.hidden_act!r} is not supported "
                             f"(Qwen3-VL uses gelu_pytorch_tanh)")
        if v.hidden_size % v.num_heads or (v.hidden_size // v.num_heads) % 4:
            raise ValueError(f"{source}: vision hidden_size {v.hidden_size} / num_heads {v.num_heads} must give "
                             f"a head dim divisible by 4 (2-D RoPE)")
        side = int(round(v.num_position_embeddings ** 0.5))
        if side * side != v.num_position_embeddings:
            raise ValueError(f"{source}: num_position_embeddings {v.num_position_embeddings} is not a square")
        self.config, self.source, self.side = config, source, side
        self.threads = resolve_threads(threads)
        self.heads, self.head_dim = v.num_heads, v.hidden_size // v.num_heads
        self.merge = v.spatial_merge_size
        specs = {s.name: s for s in vision_specs(config)}
        for name, spec in specs.items():
            if name not in tensors:
                raise ValueError(f"{source}: vision tensor {name!r} is missing (a Qwen3-VL file needs "
                                 f"{', '.join(specs)})")
            t = tensors[name]
            if (t.rows, t.cols) != (spec.rows, spec.cols):
                raise ValueError(f"{source}: vision tensor {name!r} is {t.rows}×{t.cols}, the config needs "
                                 f"{spec.rows}×{spec.cols}")
            if name not in BLOCK_MATRICES and t.qtype != Q.F32.id:
                raise ValueError(f"{source}: vision tensor {name!r} has qtype {Q.qtype(t.qtype).name}, expected F32")
        self.specs = specs

        def f32(name):
            t = tensors[name]
            return t.data.view("<f4").reshape(t.rows, t.cols)

        self.patch_w, self.patch_b = f32("v_patch"), f32("v_patch_b")[0]
        self.pos = f32("v_pos")
        L = v.depth
        self.qkv_b, self.proj_b = f32("v_qkv_b"), f32("v_proj_b")
        self.fc1_b, self.fc2_b = f32("v_fc1_b"), f32("v_fc2_b")
        self.norm1, self.norm1_b = f32("v_norm1"), f32("v_norm1_b")
        self.norm2, self.norm2_b = f32("v_norm2"), f32("v_norm2_b")
        self.blocks = []
        for layer in range(L):
            mats = {}
            for name in BLOCK_MATRICES:
                t = tensors[name]
                rows = t.rows // L
                bpr = t.data.size // t.rows
                data = t.data.reshape(-1)[layer * rows * bpr:(layer + 1) * rows * bpr]
                mats[name] = Linear(t.qtype, rows, t.cols, data, f"{name}[{layer}]")
                if t.qtype == Q.Q8_0.id:
                    q8gemm.pack(mats[name])      # the int8 GEMM's 16-row groups, made once here
            self.blocks.append(mats)
        self.merger = dict(norm=f32("v_merger_norm")[0], norm_b=f32("v_merger_norm_b")[0],
                           fc1=f32("v_merger_fc1"), fc1_b=f32("v_merger_fc1_b")[0],
                           fc2=f32("v_merger_fc2"), fc2_b=f32("v_merger_fc2_b")[0])
        nds = len(v.deepstack_visual_indexes)
        md, out = v.merged_dim, v.out_hidden_size
        self.ds_mergers = []
        if nds:
            fc1, fc2 = f32("v_ds_fc1"), f32("v_ds_fc2")
            for k in range(nds):
                self.ds_mergers.append(dict(norm=f32("v_ds_norm")[k], norm_b=f32("v_ds_norm_b")[k],
                                            fc1=fc1[k * md:(k + 1) * md], fc1_b=f32("v_ds_fc1_b")[k],
                                            fc2=fc2[k * out:(k + 1) * out], fc2_b=f32("v_ds_fc2_b")[k]))
        for layer in v.deepstack_visual_indexes:
            if not 0 <= layer < L:
                raise ValueError(f"{source}: deepstack_visual_indexes {v.deepstack_visual_indexes} names "
                                 f"block {layer}, the tower has {L}")
        self.weight_qtypes = {name: Q.qtype(tensors[name].qtype).name for name in BLOCK_MATRICES}

    @classmethod
    def from_vqf(cls, path, threads: int | None = None) -> "VisionTower":
        """Open a Qwen3-VL VQF file (mmap) and bind its vision tensors. Taught in day20_2."""
        from kestrel_lab.vqf.reader import open_vqf

        f = open_vqf(path)
        tower = cls(f.config, f.tensors, threads=threads, source=str(path))
        tower._keepalive = f
        return tower

    # ------------------------------------------------------------------ steps (each testable alone)
    def embed_patches(self, pixel_values: np.ndarray) -> np.ndarray:
        """Conv3d as a matmul: (N, C·T·P·P) @ W.T + b → (N, width). Taught in day19_1."""
        x = np.ascontiguousarray(pixel_values, dtype=np.float32) @ self.patch_w.T
        VK.add_bias(x, self.patch_b)
        return x

    def position_embeddings(self, grid_thw) -> np.ndarray:
        """The learned table resampled to every image's grid (N, width), merge-block order. Taught in day19_3."""
        idx, w = pos_interpolation(grid_thw, self.side, self.merge)
        return (self.pos[idx] * w[:, :, None]).sum(axis=1, dtype=np.float32)

    def block(self, layer: int, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, cu: np.ndarray) -> None:
        """One pre-norm ViT block, ``x`` (N, width) updated in place. Taught in day19_2."""
        m = self.blocks[layer]
        N, W = x.shape
        H, D = self.heads, self.head_dim
        y = np.empty_like(x)
        VK.layernorm(x, self.norm1[layer], self.norm1_b[layer], LN_EPS, y)
        qkv = matmul(m["v_q8_qkv"], y, self.qkv_b[layer])
        qkv = qkv.reshape(N, 3, H, D)
        q, k, v = (np.ascontiguousarray(qkv[:, i]) for i in range(3))
        apply_rope(q, cos, sin)
        apply_rope(k, cos, sin)
        o = attend_segments(q, k, v, cu)
        x += matmul(m["v_q8_proj"], o, self.proj_b[layer])
        VK.layernorm(x, self.norm2[layer], self.norm2_b[layer], LN_EPS, y)
        g = matmul(m["v_q8_fc1"], y, self.fc1_b[layer], gelu=True)
        x += matmul(m["v_q8_fc2"], g, self.fc2_b[layer])

    def merge_tokens(self, x: np.ndarray, m: dict, postshuffle: bool) -> np.ndarray:
        """A patch merger: LayerNorm (per patch, or after the 2×2 concat when ``postshuffle``), then
        fc1 → exact GELU → fc2. (N, width) → (N/4, out). Taught in day20_1."""
        md = self.vc.merged_dim
        if postshuffle:
            x = np.ascontiguousarray(x).reshape(-1, md)
            y = np.empty_like(x)
            VK.layernorm(x, m["norm"], m["norm_b"], LN_EPS, y)
        else:
            y = np.empty_like(x)
            VK.layernorm(x, m["norm"], m["norm_b"], LN_EPS, y)
            y = y.reshape(-1, md)
        h = y @ m["fc1"].T
        VK.add_bias(h, m["fc1_b"])
        VK.gelu_erf(h)
        out = h @ m["fc2"].T
        VK.add_bias(out, m["fc2_b"])
        return out

    def encode(self, pixel_values: np.ndarray, grid_thw) -> VisionOutput:
        """The whole tower on one or several images. Taught in day20_2."""
        v = self.vc
        px = np.asarray(pixel_values)
        if px.ndim != 2 or px.shape[1] != v.patch_dim:
            raise ValueError(f"pixel_values must be (patches, {v.patch_dim}), got shape {px.shape}")
        g = check_grids(grid_thw, self.merge, px.shape[0])
        t0 = time.perf_counter()
        with numba_threads(self.threads):
            x = self.embed_patches(px)
            x += self.position_embeddings(g)
            cos, sin = rotary_cos_sin(g, self.head_dim, self.merge)
            cu = cu_seqlens(g)
            feats = []
            for layer in range(v.depth):
                self.block(layer, x, cos, sin, cu)
                if layer in v.deepstack_visual_indexes:
                    k = v.deepstack_visual_indexes.index(layer)
                    feats.append(self.merge_tokens(x, self.ds_mergers[k], postshuffle=True))
            embeds = (self.merge_tokens(x, self.merger, postshuffle=False) if self.merge_piece is None else
                      np.asarray(self.merge_piece(x.copy(), self.merger), dtype=np.float32))
        tokens = [image_token_count(r, self.merge) for r in g]
        return VisionOutput(embeds, feats, tokens, time.perf_counter() - t0, [tuple(int(a) for a in r) for r in g])

    def encode_images(self, images) -> VisionOutput:
        """``encode`` for preprocessed images (objects with ``pixel_values`` and ``grid_thw``), in order.

        Taught in day21_3.
        """
        images = list(images)
        if not images:
            raise ValueError("encode_images: no images")
        px = np.concatenate([np.asarray(im.pixel_values, np.float32) for im in images])
        return self.encode(px, [tuple(im.grid_thw) for im in images])

    def flops(self, grid_thw) -> int:
        """Multiply-adds × 2 of one encode (linear layers and attention) for these grids. Taught in day20_2."""
        v = self.vc
        g = check_grids(grid_thw, self.merge)
        N = int(g.prod(axis=1).sum())
        W, inter, md, out = v.hidden_size, v.intermediate_size, v.merged_dim, v.out_hidden_size
        lin = N * v.patch_dim * W + v.depth * N * (3 * W * W + W * W + 2 * W * inter)
        merged = sum(image_token_count(r, self.merge) for r in g)
        lin += merged * (md * md + md * out) * (1 + len(v.deepstack_visual_indexes))
        seg = np.repeat(g[:, 1] * g[:, 2], g[:, 0])
        att = v.depth * int((seg.astype(np.int64) ** 2).sum()) * 2 * W
        return 2 * (lin + att)


__all__ = ["VisionTower", "VisionOutput", "matmul", "check_grids", "patch_rows_cols", "pos_interpolation",
           "rotary_cos_sin", "cu_seqlens", "attend_segments", "LN_EPS", "VISION_THETA"]
