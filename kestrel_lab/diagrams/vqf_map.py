"""The VQF file drawn to scale from the planner: header | VQFSig | directory | pad | tensors | trailer.

Everything is computed from a ``kestrel_lab.vqf.planner.FilePlan`` (``.entries``, ``.data_offset``,
``.file_len``) and the format constants, so the picture follows the layout code. Tensors differ in
size by orders of magnitude (a 64-byte-aligned 8 KB norm next to a 622 MB embedding), so the figure
has two rows: the whole file to scale, and a zoom of its first bytes (header, VQFSig, directory, pad,
the start of the first tensor). Taught in day16_3.
"""
from __future__ import annotations

from dataclasses import dataclass

from kestrel_lab.vqf import format as F

SIG_OFFSET = F.HEADER_FIELD["sig_magic"].offset   # 200: where VQFSig starts
ZOOM_BYTES = 8192

# Colours: one per kind of region, tensors coloured by their qtype.
REGION_COLOURS = {"header": "#4c72b0", "VQFSig": "#8172b3", "gap": "#dddddd", "directory": "#dd8452",
                  "pad": "#eeeeee", "trailer": "#c44e52"}
QTYPE_COLOURS = {"F16": "#55a868", "F32": "#937860", "Q8_0": "#da8bc3", "Q4_0": "#64b5cd", "Q4_8X8L": "#ccb974"}
REGION_LABELS = {"header": "头部 VQFHeader", "VQFSig": "签名块 VQFSig", "gap": "对齐空隙", "directory": "目录",
                 "pad": "填充（到页边界）", "trailer": "FNV 尾部"}


@dataclass(frozen=True)
class Region:
    start: int
    end: int
    kind: str     # header, VQFSig, gap, directory, pad, tensor, trailer
    label: str    # the tensor's name for a tensor, else the kind
    qtype: str = ""

    @property
    def size(self) -> int:
        return self.end - self.start


def regions(fp) -> list[Region]:
    """The file as consecutive byte ranges, from offset 0 to ``file_len + 8``. Taught in day16_3."""
    dir_end = F.DIR_OFFSET + F.ENTRY_SIZE * len(fp.entries)
    out = [Region(0, SIG_OFFSET, "header", "header"), Region(SIG_OFFSET, F.HEADER_END, "VQFSig", "VQFSig")]
    if F.DIR_OFFSET > F.HEADER_END:
        out.append(Region(F.HEADER_END, F.DIR_OFFSET, "gap", "gap"))
    out.append(Region(F.DIR_OFFSET, dir_end, "directory", "directory"))
    if fp.data_offset > dir_end:
        out.append(Region(dir_end, fp.data_offset, "pad", "pad"))
    pos = fp.data_offset
    for e in fp.entries:
        if e.offset > pos:
            out.append(Region(pos, e.offset, "pad", "pad"))
        out.append(Region(e.offset, e.end, "tensor", e.spec.name, e.spec.qtype_name))
        pos = e.end
    out.append(Region(fp.file_len, fp.file_len + F.TRAILER_BYTES, "trailer", "trailer"))
    return out


def _colour(r: Region) -> str:
    return QTYPE_COLOURS.get(r.qtype, "#999999") if r.kind == "tensor" else REGION_COLOURS[r.kind]


def draw_vqf_map(fp, zoom_bytes: int = ZOOM_BYTES, title: str | None = None):
    """Two rows: the whole file to scale (tensors coloured by qtype), and its first ``zoom_bytes``.

    ``fp`` is a ``FilePlan`` (``kestrel_lab.vqf.planner.plan_file(config)``). Returns the Figure.
    Taught in day16_3.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    regs = regions(fp)
    total = regs[-1].end
    fig, (ax_all, ax_zoom) = plt.subplots(2, 1, figsize=(12, 5.2), gridspec_kw={"hspace": 0.9})
    mb = 1e6

    # Row 1: the whole file, in MB.
    for r in regs:
        ax_all.broken_barh([(r.start / mb, r.size / mb)], (0, 1), facecolors=_colour(r),
                           edgecolors="white", linewidth=0.4)
    big = sorted((r for r in regs if r.kind == "tensor"), key=lambda r: -r.size)[:8]
    for r in big:
        if r.size / total > 0.03:
            ax_all.text((r.start + r.size / 2) / mb, 0.5, r.label, ha="center", va="center", fontsize=7,
                        rotation=90 if r.size / total < 0.06 else 0)
    ax_all.set_xlim(0, total / mb)
    ax_all.set_ylim(0, 1)
    ax_all.set_yticks([])
    ax_all.set_xlabel("文件偏移（MB）")
    ax_all.set_title(f"整个文件按比例：{len(fp.entries)} 个张量，file_len = {fp.file_len:,} B"
                     f"（头部、签名块、目录只占前 {fp.data_offset:,} B，这一行里看不见）", fontsize=10)

    # Row 2: the first zoom_bytes, in bytes.
    for r in regs:
        if r.start >= zoom_bytes:
            break
        end = min(r.end, zoom_bytes)
        ax_zoom.broken_barh([(r.start, end - r.start)], (0, 1), facecolors=_colour(r),
                            edgecolors="white", linewidth=0.6)
        if r.kind == "tensor":
            text = f"{r.label} @ {r.start:,} →"
        else:
            text = f"{REGION_LABELS[r.kind]}\n{r.start}–{r.end}"
        if end - r.start >= 0.04 * zoom_bytes:
            ax_zoom.text((r.start + end) / 2, 0.5, text, ha="center", va="center", fontsize=8)
        elif end - r.start >= 0.015 * zoom_bytes:   # narrow (header, VQFSig): the label stands upright
            ax_zoom.text((r.start + end) / 2, 0.5, text.replace("\n", " "), ha="center", va="center",
                         fontsize=7, rotation=90, color="white")
    ax_zoom.axvline(fp.data_offset, color="black", linestyle="--", linewidth=0.8)
    ax_zoom.text(fp.data_offset, 0.06, f" data_offset = {fp.data_offset:,}", ha="left", va="bottom", fontsize=8)
    ax_zoom.set_xlim(0, zoom_bytes)
    ax_zoom.set_ylim(0, 1)
    ax_zoom.set_yticks([])
    ax_zoom.set_xlabel("文件偏移（字节）")
    ax_zoom.set_title(f"放大前 {zoom_bytes:,} 字节：头部 | 签名块 | 目录（{len(fp.entries)} × 64 B） | 填充 | "
                      "第一个张量", fontsize=10)

    qtypes = sorted({r.qtype for r in regs if r.kind == "tensor"})
    handles = [Patch(color=REGION_COLOURS[k], label=REGION_LABELS[k])
               for k in ("header", "VQFSig", "directory", "pad", "trailer")]
    handles += [Patch(color=QTYPE_COLOURS.get(q, "#999999"), label=f"张量 {q}") for q in qtypes]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    fig.suptitle(title or "VQF 文件布局（按规划器的目录，按比例绘制）", fontsize=12)
    fig.subplots_adjust(bottom=0.22, top=0.86)
    return fig
