"""The KV cache's memory layout: ``(layers, kv_heads, pos, head_dim)`` strides and the 2 MiB huge pages.

Read from a real ``kestrel_lab.engine.kv.KVCache``: its array's shape, dtype, strides and address. One
(layer, head) row holds all positions of one head contiguously; the huge-page boundaries sit at
addresses that are multiples of 2 MiB, which need not coincide with the start of a row (the array
starts wherever the allocator put it). The diagram shows, for the first rows, which huge page each
position falls in. Taught in day11_1.
"""
from __future__ import annotations

from dataclasses import dataclass

HUGE_PAGE = 2 * 2**20
AXES = ("层", "KV 头", "位置", "head_dim")


@dataclass(frozen=True)
class KVLayout:
    """What the diagram draws, computed from one cache array (``cache.k`` by default)."""

    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    dtype: str
    itemsize: int
    row_bytes: int            # one (layer, head): max_context × head_dim × itemsize
    position_bytes: int       # one position of one head: head_dim × itemsize
    huge_page: int
    start_in_page: int        # the array's first byte, as an offset inside its huge page

    @property
    def positions_per_page(self) -> float:
        """How many positions of one (layer, head) a huge page holds."""
        return self.huge_page / self.position_bytes

    @property
    def rows_per_page(self) -> float:
        """How many (layer, head) rows one huge page spans (< 1: one row needs several pages)."""
        return self.huge_page / self.row_bytes

    def page_of(self, layer: int, head: int, pos: int) -> int:
        """Index of the huge page (counted from the one holding the array's first byte) of an element."""
        s = self.strides
        return (self.start_in_page + layer * s[0] + head * s[1] + pos * s[2]) // self.huge_page


def kv_layout(array, huge_page: int = HUGE_PAGE) -> KVLayout:
    """The layout of one KV cache array (``KVCache.k`` or ``.v``). Taught in day11_1."""
    if array.ndim != 4:
        raise ValueError(f"expected a (layers, kv_heads, pos, head_dim) array, got shape {array.shape}")
    layers, heads, ctx, dim = array.shape
    return KVLayout(tuple(int(n) for n in array.shape), tuple(int(s) for s in array.strides), str(array.dtype),
                    int(array.itemsize), int(ctx * dim * array.itemsize), int(dim * array.itemsize), int(huge_page),
                    int(array.ctypes.data % huge_page))


def boundary_note(lay: KVLayout) -> str:
    """Where the huge-page boundaries fall relative to the (layer, head) rows, in words."""
    first = (lay.huge_page - lay.start_in_page) % lay.huge_page      # bytes from the array start to a boundary
    row, at = divmod(first, lay.row_bytes)
    if at == 0:
        return "大页边界落在行首（地址对齐）"
    where = f"pos {at / lay.position_bytes:.1f}"
    if lay.rows_per_page > 1:
        return f"第一个边界在第 {row} 行的 {where}（地址未对齐）"
    return f"每行在 {where} 处跨进下一个大页（地址未对齐）"


def stride_lines(lay: KVLayout) -> list[str]:
    """One line per axis: its length and stride in bytes (what the diagram prints)."""
    return [f"{name}：{n:,} 个，stride {s:,} B" for name, n, s in zip(AXES, lay.shape, lay.strides)]


def draw_kv_layout(cache, max_rows: int = 12, huge_page: int = HUGE_PAGE, name: str = "k"):
    """Draw the layout of ``cache.k`` (or ``cache.v`` with ``name="v"``); returns the Figure.

    Left: the axes with their strides. Right: the first ``max_rows`` (layer, head) rows along the
    positions, each position coloured by the huge page it falls in (alternating shades, boundaries
    in black). Call ``kestrel_lab.plotting.setup()`` first for Chinese glyphs. Taught in day11_1.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    array = getattr(cache, name)
    lay = kv_layout(array, huge_page)
    layers, heads, ctx, dim = lay.shape
    n_rows = min(max_rows, layers * heads)
    rows = [(r // heads, r % heads) for r in range(n_rows)]
    pos = np.arange(ctx)
    grid = np.array([(lay.start_in_page + layer * lay.strides[0] + h * lay.strides[1] + pos * lay.strides[2])
                     // huge_page for layer, h in rows])

    fig, (ax_t, ax) = plt.subplots(1, 2, figsize=(12, 0.42 * n_rows + 2.4), gridspec_kw=dict(width_ratios=[1, 2.4]))
    ax_t.axis("off")
    mib = huge_page / 2**20
    lines = [f"cache.{name}: shape {lay.shape}, dtype {lay.dtype}（{lay.itemsize} B）", ""] + stride_lines(lay) + [
        "",
        f"一个 (层, 头) 行 = {ctx:,} × {dim} × {lay.itemsize} B = {lay.row_bytes / 2**20:g} MiB",
        f"一个 {mib:g} MiB 大页 = 一个头的 {lay.positions_per_page:g} 个位置",
        (f"一个大页 = {lay.rows_per_page:g} 个 (层, 头) 行" if lay.rows_per_page >= 1
         else f"一行要 {1 / lay.rows_per_page:g} 个大页"),
        f"数组起点在大页内的偏移：{lay.start_in_page:,} B",
        boundary_note(lay),
    ]
    ax_t.text(0, 1, "\n".join(lines), va="top", ha="left", fontsize=9.5, transform=ax_t.transAxes)
    ax_t.set_title("布局与步长（字节）", fontsize=10)

    shade = (grid - grid.min()) % 2
    ax.imshow(shade, aspect="auto", cmap=plt.matplotlib.colors.ListedColormap(["#cfe3f5", "#f6d9b8"]),
              interpolation="nearest", extent=(-0.5, ctx - 0.5, n_rows - 0.5, -0.5))
    cuts = set()
    for r in range(n_rows):
        for b in np.flatnonzero(np.diff(grid[r])) + 1:        # first position of a new huge page
            ax.plot([b - 0.5, b - 0.5], [r - 0.5, r + 0.5], color="k", lw=2.5)
            cuts.add(int(b))
        first, last = int(grid[r, 0] - grid.min()), int(grid[r, -1] - grid.min())
        ax.text(ctx * 1.01, r, f"大页 {first}" if first == last else f"大页 {first}–{last}", va="center", fontsize=7.5)
    if cuts:
        r0 = next(r for r in range(n_rows) if np.any(np.diff(grid[r])))
        b = int(np.flatnonzero(np.diff(grid[r0]))[0] + 1)
        side = -1 if b > ctx * 0.7 else 1
        ax.annotate(f"pos {b}：进入下一个大页", xy=(b, r0), xytext=(b + side * ctx * 0.08, r0), va="center",
                    ha="left" if side > 0 else "right", fontsize=8, arrowprops=dict(arrowstyle="->", lw=1))
    for r in range(1, n_rows):
        ax.axhline(r - 0.5, color="white", lw=0.6)
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels([f"层 {layer} · 头 {h}" for layer, h in rows], fontsize=8)
    ax.set_xlim(-0.5, ctx - 0.5)
    ax.set_xlabel(f"位置 pos（每个位置 {lay.position_bytes} B；黑线：{mib:g} MiB 大页的边界）")
    ax.set_ylabel("(层, KV 头) 行，按内存顺序")
    ax.set_title(f"前 {n_rows} 行落在哪些 {mib:g} MiB 大页里（两种底色交替）", fontsize=10)
    fig.suptitle(f"KV 缓存 (layers, kv_heads, pos, head_dim) 的内存布局：{layers}×{heads}×{ctx:,}×{dim} {lay.dtype}")
    fig.tight_layout()
    return fig
