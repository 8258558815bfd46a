"""Qwen3-VL's image side drawn from the package's own code: patch order, the token strip, MRoPE.

- ``patch_order`` runs ``vision.preprocess.patchify`` on an image whose pixels *are* their patch's
  number, so the order drawn is the order the preprocessor emits — not a second copy of the rule;
- ``draw_patch_grid``: a resized image with its 16-px patches, 2×2 merge blocks and emission order;
- ``draw_token_strip``: a prompt's tokens as coloured cells (text / vision start / image pad / vision end);
- ``draw_mrope_positions``: the (t, h, w) positions along the sequence, and one image's h and w grids;
- ``draw_frequency_axes``: which axis drives each rotary frequency, interleaved (Qwen3-VL) vs chunked.

Each returns a matplotlib Figure with Chinese labels (call ``kestrel_lab.plotting.setup()`` first).
Taught in day20_3, day21_1, day21_2 and day18_3.
"""
from __future__ import annotations

import numpy as np

from kestrel_lab.kernels.rope import axis_of_frequency
from kestrel_lab.vision.preprocess import patchify

AXIS_NAMES = ("t 时间", "h 行", "w 列")
AXIS_COLORS = ("#4c72b0", "#dd8452", "#55a868")
KIND_COLORS = {"text": "#d0d7e2", "vision_start": "#8172b3", "image_pad": "#dd8452", "vision_end": "#c44e52"}
KIND_NAMES = {"text": "文本", "vision_start": "<|vision_start|>", "image_pad": "<|image_pad|>",
              "vision_end": "<|vision_end|>"}


def patch_order(grid_h: int, grid_w: int, patch_size: int = 16, merge_size: int = 2) -> np.ndarray:
    """(grid_h, grid_w): the row of ``pixel_values`` that holds each patch (row, col) of the image.

    Computed by patchifying an index image with the package's ``patchify``. Taught in day20_3.
    """
    index = np.arange(grid_h * grid_w, dtype=np.float32).reshape(grid_h, grid_w)
    img = np.kron(index, np.ones((patch_size, patch_size), dtype=np.float32))[None]   # (1, H, W)
    rows, _ = patchify(img, patch_size, 1, merge_size)
    order = np.empty(grid_h * grid_w, dtype=np.int64)
    order[rows[:, 0].astype(np.int64)] = np.arange(rows.shape[0])
    return order.reshape(grid_h, grid_w)


def draw_patch_grid(resized_rgb: np.ndarray, patch_size: int = 16, merge_size: int = 2, label_first: int = 24,
                    title: str | None = None):
    """The resized image with its patch grid (thin), merge blocks (thick) and, in the first patches, the
    order the preprocessor emits them in. Taught in day20_3.
    """
    import matplotlib.pyplot as plt

    h, w = resized_rgb.shape[:2]
    gh, gw = h // patch_size, w // patch_size
    order = patch_order(gh, gw, patch_size, merge_size)
    fig, ax = plt.subplots(figsize=(min(11, 3 + w / 60), min(9, 2 + h / 60)))
    ax.imshow(resized_rgb, extent=(0, w, h, 0))
    for x in range(0, w + 1, patch_size):
        thick = x % (patch_size * merge_size) == 0
        ax.axvline(x, color="white" if thick else "#ffffff88", lw=1.8 if thick else 0.5)
    for y in range(0, h + 1, patch_size):
        thick = y % (patch_size * merge_size) == 0
        ax.axhline(y, color="white" if thick else "#ffffff88", lw=1.8 if thick else 0.5)
    for r in range(gh):
        for c in range(gw):
            if order[r, c] < label_first:
                ax.text((c + 0.5) * patch_size, (r + 0.5) * patch_size, str(order[r, c]), ha="center",
                        va="center", fontsize=7, color="black",
                        bbox=dict(boxstyle="round,pad=0.1", fc="#ffffffcc", ec="none"))
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_xlabel(f"宽 {w} 像素 = {gw} 个 patch")
    ax.set_ylabel(f"高 {h} 像素 = {gh} 个 patch")
    ax.set_title(title or f"patch 网格（细线 {patch_size} px）与 {merge_size}×{merge_size} 合并块（粗线）："
                          f"数字是 pixel_values 的行号")
    fig.tight_layout()
    return fig


def token_kinds(ids, *, image_pad_id: int, vision_start_id: int, vision_end_id: int) -> list[str]:
    """Each id's kind: "text", "vision_start", "image_pad" or "vision_end". Taught in day21_1."""
    names = {image_pad_id: "image_pad", vision_start_id: "vision_start", vision_end_id: "vision_end"}
    return [names.get(int(t), "text") for t in ids]


def draw_token_strip(kinds: list[str], labels: list[str] | None = None, per_row: int = 40, title: str | None = None):
    """The token sequence as cells, ``per_row`` to a line, coloured by kind; ``labels`` (optional) are
    written in the text cells. Taught in day21_1.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    n = len(kinds)
    rows = max(1, -(-n // per_row))
    fig, ax = plt.subplots(figsize=(12, 0.9 + 0.42 * rows))
    for i, k in enumerate(kinds):
        r, c = divmod(i, per_row)
        ax.add_patch(Rectangle((c, -r), 0.92, -0.85, color=KIND_COLORS[k]))
        if labels is not None and k == "text" and labels[i]:
            ax.text(c + 0.46, -r - 0.43, labels[i][:3], ha="center", va="center", fontsize=6)
    ax.set_xlim(-0.2, per_row + 0.2)
    ax.set_ylim(-rows - 0.1, 0.2)
    ax.set_axis_off()
    counts = {k: kinds.count(k) for k in KIND_COLORS}
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=f"{KIND_NAMES[k]} ×{counts[k]}") for k in KIND_COLORS],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=8, frameon=False)
    ax.set_title(title or f"{n} 个 token，每行 {per_row} 个")
    fig.tight_layout()
    return fig


def draw_mrope_positions(positions: np.ndarray, kinds: list[str], grid_thw=None, merge_size: int = 2,
                         title: str | None = None):
    """Left: t, h, w position of every token (image spans shaded). Right (with ``grid_thw``): the h and w
    positions of the first image's tokens on its merged grid. Taught in day21_2.
    """
    import matplotlib.pyplot as plt

    pos = np.asarray(positions)
    n = pos.shape[1]
    ncols = 3 if grid_thw is not None else 1
    fig, axes = plt.subplots(1, ncols, figsize=(12, 3.8), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1, 1][:ncols]})
    ax = axes[0, 0]
    pad = np.array([k == "image_pad" for k in kinds])
    edges = np.flatnonzero(np.diff(np.concatenate([[0], pad.astype(int), [0]])))
    for a, b in zip(edges[0::2], edges[1::2]):
        ax.axvspan(a - 0.5, b - 0.5, color=KIND_COLORS["image_pad"], alpha=0.15)
    for axis in (0, 1, 2):
        ax.plot(np.arange(n), pos[axis], ".", ms=3 if n > 200 else 5, color=AXIS_COLORS[axis],
                label=AXIS_NAMES[axis], alpha=0.8)
    ax.plot(np.arange(n), np.arange(n), "--", color="gray", lw=0.8, label="token 下标（KV cache 位置）")
    ax.set_xlabel("token 下标")
    ax.set_ylabel("RoPE 位置")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title or "MRoPE 三个分量沿序列（阴影 = 图像 pad）")
    if grid_thw is not None:
        t, h, w = (int(x) for x in grid_thw)
        hh, ww = h // merge_size, w // merge_size
        first = edges[0]
        block = pos[:, first:first + hh * ww]
        for j, (axis, name) in enumerate(((1, "h 分量"), (2, "w 分量"))):
            a2 = axes[0, 1 + j]
            im = a2.imshow(block[axis].reshape(hh, ww) - block[0, 0], cmap="viridis")
            a2.set_title(f"第一张图的 {name}（减去 s）", fontsize=9)
            a2.set_xlabel("列")
            a2.set_ylabel("行")
            fig.colorbar(im, ax=a2, fraction=0.046)
    fig.tight_layout()
    return fig


def draw_frequency_axes(head_dim: int, mrope_section, title: str | None = None):
    """Two strips of head_dim/2 cells: the axis driving each frequency, interleaved and chunked.

    Taught in day18_3.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    half = head_dim // 2
    fig, ax = plt.subplots(figsize=(12, 2.4))
    for row, (interleaved, name) in enumerate(((True, "交错（Qwen3-VL）"), (False, "分块（Qwen2-VL）"))):
        axis = axis_of_frequency(head_dim, mrope_section, interleaved)
        for i, a in enumerate(axis):
            ax.add_patch(Rectangle((i, -row), 0.92, -0.8, color=AXIS_COLORS[a]))
        ax.text(-1, -row - 0.4, name, ha="right", va="center", fontsize=9)
    ax.set_xlim(-14, half + 0.5)
    ax.set_xticks(range(0, half + 1, max(1, half // 8)))
    ax.set_ylim(-2.1, 0.4)
    ax.set_yticks([])
    ax.set_xlabel(f"频率下标 i（0 = 转得最快，{half - 1} = 最慢）")
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    ax.legend(handles=[Patch(color=AXIS_COLORS[a], label=AXIS_NAMES[a]) for a in range(3)], ncol=3,
              loc="upper right", fontsize=8, frameon=False, bbox_to_anchor=(1.0, 1.35))
    ax.set_title(title or f"mrope_section {list(mrope_section)}：每个频率由哪个位置分量驱动", loc="left")
    fig.tight_layout()
    return fig
