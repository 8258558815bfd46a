"""Where each stored byte of a Q4 layout comes from, drawn by running the package's own repack code.

The trick: repack a plain Q4_0 matrix whose every byte is its own *row index*, then one whose every
byte is its *offset in the row* (block ``b``, byte ``j`` → ``18·b + j``). Read back in storage order,
the two outputs say, for every byte of the layout, which row and which byte of that row's Q4_0 block
it is. Nothing here describes a format: change a repack function and the picture follows.

Layouts: ``Q4_0`` (plain rows, 18 bytes per block), ``Q4_8X8L`` (``quant.repack_q4_8x8l``: 8 rows,
scales then two 8×8 tiles), ``Q4_0_R32`` (``kernels.ops.repack_q4_0_to_r32``: 32 rows, nibble plane
then scale plane) and ``Q4_0_V16`` (``kernels.v16.repack_q4_0_to_v16``: 16 rows, 4 chunks of 64 bytes
per block, then the scale plane). ``draw_map`` draws any such map, e.g. one a notebook derives itself.
Taught in day06_2, day06_3 and day07_1.
"""
from __future__ import annotations

import numpy as np

from kestrel_lab.kernels import variants

QK = 32
Q4_BYTES = 18
# rows of one group as drawn: 8 of plain Q4_0, Q4_8X8L's 8, and each row-grouped variant's group
ROWS = {"Q4_0": 8, "Q4_8X8L": 8, **variants.PLANE_LAYOUTS}
MAX_BLOCKS = 255 // Q4_BYTES                                        # byte tags must fit in a uint8


def _repack(layout: str, src: np.ndarray) -> np.ndarray:
    """``src`` (rows, nb·18) uint8 in ``layout``'s storage order, as one flat uint8 array."""
    from kestrel_lab import quant

    rows, rb = src.shape
    nb = rb // Q4_BYTES
    if layout == "Q4_0":
        return src.reshape(-1).copy()
    if layout == "Q4_8X8L":
        return quant.repack_q4_8x8l(src, rows, nb * QK)
    if layout not in variants.PLANE_LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(ROWS)}")
    G = variants.PLANE_LAYOUTS[layout]
    nib = np.empty((rows // G, nb * 16 * G), np.uint8)
    sc = np.empty((rows // G, nb * G), np.uint16)
    variants.repack_for(layout)(src, nib, sc, 1)
    return np.concatenate([nib.reshape(-1), sc.astype("<u2").view(np.uint8).reshape(-1)])


def source_map(layout: str, blocks: int = 1) -> dict:
    """For one row group of ``layout`` and ``blocks`` block columns: ``row`` and ``byte`` (int arrays
    in storage order: which row, and which byte of that row's Q4_0 block, each stored byte is),
    ``block`` (which block column), ``rows`` and ``nbytes``. Taught in day06_2."""
    if layout not in ROWS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(ROWS)}")
    if not 1 <= blocks <= MAX_BLOCKS:
        raise ValueError(f"blocks={blocks}: expected 1..{MAX_BLOCKS} (byte tags are uint8)")
    rows = ROWS[layout]
    rb = blocks * Q4_BYTES
    row_tags = np.repeat(np.arange(rows, dtype=np.uint8)[:, None], rb, axis=1)
    off_tags = np.repeat(np.arange(rb, dtype=np.uint8)[None, :], rows, axis=0)
    row = _repack(layout, np.ascontiguousarray(row_tags)).astype(np.int64)
    off = _repack(layout, np.ascontiguousarray(off_tags)).astype(np.int64)
    if row.size != rows * rb:
        raise AssertionError(f"{layout}: {row.size} bytes stored for {rows * rb} source bytes")
    return {"layout": layout, "rows": rows, "row": row, "byte": off % Q4_BYTES, "block": off // Q4_BYTES,
            "nbytes": row.size}


def check_permutation(m: dict) -> None:
    """Raise if a source map does not hold every (row, block, byte) exactly once: a layout is a pure
    reordering, the same 18 bytes per 32 weights. Taught in day06_3."""
    keys = (m["row"] * 1000 + m["block"]) * Q4_BYTES + m["byte"]
    if np.unique(keys).size != keys.size:
        raise ValueError(f"{m.get('layout', 'map')}: some source byte is stored twice (or one is missing)")


def draw_map(row, byte, title: str, width: int = 16, rows: int | None = None, ax=None):
    """The stored bytes as a grid, ``width`` per line: colour = source row, label = byte of that row's
    Q4_0 block (0–1 the fp16 scale, outlined in black; 2–17 the nibble bytes).
    Returns the Figure. Taught in day07_1."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    row, byte = np.asarray(row), np.asarray(byte)
    if row.shape != byte.shape or row.ndim != 1:
        raise ValueError("row and byte must be 1-D arrays of the same length")
    n = row.size
    rows = int(rows or row.max() + 1)
    lines = -(-n // width)
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(14.0, 0.42 * width + 1.6), 0.36 * lines + 1.4))
    else:
        fig = ax.figure
    cmap = plt.get_cmap("tab20" if rows <= 20 else "hsv", max(rows, 2))
    for i in range(n):
        y, x = divmod(i, width)
        face = cmap(int(row[i]) % cmap.N)
        scale = byte[i] < 2
        ax.add_patch(Rectangle((x, -y - 1), 1, 1, facecolor=face, edgecolor="white" if not scale else "black",
                               lw=0.6 if not scale else 1.2, alpha=0.55 if scale else 0.9))
        if width <= 64:
            ax.text(x + 0.5, -y - 0.5, f"{int(byte[i])}", ha="center", va="center",
                    fontsize=4.5 if width > 48 else 6 if width > 24 else 7)
    ax.set_xlim(0, width)
    ax.set_ylim(-lines, 0)
    step = 1 if lines <= 20 else 4
    ax.set_yticks([-y - 0.5 for y in range(0, lines, step)], [f"{y * width}" for y in range(0, lines, step)],
                  fontsize=7)
    ax.set_xticks([x + 0.5 for x in range(0, width, 4)], [str(x) for x in range(0, width, 4)], fontsize=7)
    ax.set_xlabel("存储偏移 mod 每行格数（字节）")
    ax.set_ylabel("每行首字节的存储偏移")
    ax.set_title(title, fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


def draw(layout: str, blocks: int = 1, width: int | None = None, ax=None):
    """``source_map(layout, blocks)`` drawn with ``draw_map``. Taught in day06_2."""
    m = source_map(layout, blocks)
    width = width or {"Q4_0": 18, "Q4_8X8L": 16, "Q4_0_R32": 32, "Q4_0_V16": 64}[layout]
    title = (f"{layout}：一组 {m['rows']} 行 × {blocks} 个块的 {m['nbytes']} 字节，按存储顺序\n"
             "颜色 = 来源行，数字 = 该行 Q4_0 块内的字节号（0–1 是 fp16 scale，黑框）")
    return draw_map(m["row"], m["byte"], title, width=width, rows=m["rows"], ax=ax)
