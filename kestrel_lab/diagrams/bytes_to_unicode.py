"""GPT-2's 256-byte ``bytes_to_unicode`` map as a 16×16 grid, coloured by what vocab.bin does with it.

Drawn from the package's own tables (``kestrel_lab.vocab.bytelevel``), so the picture changes when
the code does. Row = high nibble, column = low nibble of the byte; each cell shows the character
tokenizer.json writes for that byte. Three classes:

- ``"self"``: a printable byte (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) written as itself; vocab.bin
  stores the byte itself;
- ``"back"``: a byte moved to U+0100+n that ``decode_token_str`` turns back into the single byte
  (0x7F, 0x80..0xA0, 0xAD);
- ``"mark"``: a byte moved to U+0100+n that vocab.bin keeps as the character's UTF-8 (0x00..0x20:
  ``Ġ`` = space, ``Ċ`` = newline), the engine's two-byte marks.

Taught in day18_2.
"""
from __future__ import annotations

import numpy as np

CLASSES = ("self", "back", "mark")
CLASS_LABELS = {
    "self": "可打印字节：写成它自己，vocab.bin 存该字节",
    "back": "借用 U+0100+n，vocab.bin 解码回单字节（0x7F、0x80..0xA0、0xAD）",
    "mark": "借用 U+0100+n，vocab.bin 保留 UTF-8 两字节标记（0x00..0x20，如 Ġ、Ċ）",
}
CLASS_COLORS = {"self": "#dbe9f6", "back": "#f4b183", "mark": "#a9d18e"}


def byte_classes() -> list[str]:
    """The class (``CLASSES``) of each byte 0..255, computed from ``BYTE_TO_UNICODE`` and
    ``decode_token_str``. Taught in day18_2."""
    from kestrel_lab.vocab.bytelevel import BYTE_TO_UNICODE, decode_token_str

    out = []
    for b in range(256):
        ch = BYTE_TO_UNICODE[b]
        if ord(ch) == b:
            out.append("self")
        elif decode_token_str(ch) == bytes([b]):
            out.append("back")
        else:
            out.append("mark")
    return out


def class_counts() -> dict[str, int]:
    """How many bytes fall in each class. Taught in day18_2."""
    cls = byte_classes()
    return {c: cls.count(c) for c in CLASSES}


def draw_bytes_to_unicode():
    """The 16×16 grid of the byte→character map (Chinese title and legend); returns the Figure.

    Taught in day18_2.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    from kestrel_lab.vocab.bytelevel import BYTE_TO_UNICODE

    cls = byte_classes()
    counts = class_counts()
    fig, ax = plt.subplots(figsize=(11, 11.6))
    for b in range(256):
        r, c = divmod(b, 16)
        ch = BYTE_TO_UNICODE[b]
        ax.add_patch(Rectangle((c, r), 1, 1, facecolor=CLASS_COLORS[cls[b]], edgecolor="white", lw=1.5))
        # DejaVu Sans covers every character of the map (Latin-1 and Latin Extended-A); CJK fonts do not.
        ax.text(c + 0.5, r + 0.42, ch, ha="center", va="center", fontsize=13, family="DejaVu Sans",
                weight="bold" if cls[b] != "self" else "normal")
        ax.text(c + 0.5, r + 0.83, f"U+{ord(ch):04X}" if cls[b] != "self" else f"{b:02X}",
                ha="center", va="center", fontsize=6, color="#444444", family="monospace")
    ax.set_xlim(0, 16)
    ax.set_ylim(16, 0)
    ax.set_xticks(np.arange(16) + 0.5, [f"{c:X}" for c in range(16)], family="monospace")
    ax.set_yticks(np.arange(16) + 0.5, [f"{r:X}_" for r in range(16)], family="monospace")
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("字节的低 4 位")
    ax.set_ylabel("字节的高 4 位")
    ax.set_aspect("equal")
    for side in ax.spines.values():
        side.set_visible(False)
    handles = [Patch(facecolor=CLASS_COLORS[k], label=f"{CLASS_LABELS[k]}：{counts[k]} 个") for k in CLASSES]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=1, fontsize=9, frameon=False)
    ax.set_title("bytes_to_unicode：256 个字节在 tokenizer.json 里写成的字符\n"
                 "（格内大字 = 字符；小字 = 字节的十六进制，或借用字符的码点）", pad=28)
    fig.tight_layout()
    return fig
