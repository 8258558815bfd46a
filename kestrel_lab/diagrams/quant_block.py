"""One Q4_0 / Q8_0 block drawn from its real bytes: the fp16 scale, then the packed quants.

The picture is read from the bytes the quantizer produced (``kestrel_lab.quant``), never from a
description of the format, so it changes when the packing does. Top panel: the block's bytes as a
strip (bytes 0–1: the fp16 scale ``d``; then, for Q4_0, byte ``2 + j`` holds value ``j`` in its low
nibble and value ``j + 16`` in its high nibble; for Q8_0, byte ``2 + i`` is the int8 of value ``i``).
Bottom panel: the 32 original values next to what the block decodes to.

Taught in day04_2 (Q4_0) and day04_1 (Q8_0); reused in day17_2.
"""
from __future__ import annotations

import numpy as np

QK = 32
Q4_0_BYTES = 18
Q8_0_BYTES = 34

# Colours: scale bytes, low nibble (values 0..15), high nibble (values 16..31).
_SCALE = "#f2c14e"
_LOW = "#8ecae6"
_HIGH = "#f4a6a6"
_INT8 = "#b5e48c"


def _scale(raw: bytes) -> float:
    return float(np.frombuffer(raw[:2], dtype=np.float16)[0])


def _check(raw: bytes, x: np.ndarray, nbytes: int, name: str) -> tuple[bytes, np.ndarray]:
    raw = bytes(np.asarray(bytearray(raw), dtype=np.uint8)) if not isinstance(raw, bytes) else raw
    if len(raw) != nbytes:
        raise ValueError(f"a {name} block is {nbytes} bytes, got {len(raw)}")
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if x.size != QK:
        raise ValueError(f"a {name} block encodes {QK} values, got {x.size}")
    return raw, x


def q4_0_fields(raw: bytes) -> tuple[float, np.ndarray, np.ndarray]:
    """``(d, low, high)`` read from one 18-byte Q4_0 block: ``low[j]`` / ``high[j]`` are the nibbles of
    byte ``2 + j`` (the quants of values ``j`` and ``j + 16``). Taught in day04_2."""
    raw, _ = _check(raw, np.zeros(QK), Q4_0_BYTES, "Q4_0")
    qs = np.frombuffer(raw[2:], dtype=np.uint8)
    return _scale(raw), qs & 0x0F, qs >> 4


def q8_0_fields(raw: bytes) -> tuple[float, np.ndarray]:
    """``(d, q)`` read from one 34-byte Q8_0 block (``q`` the 32 int8 quants). Taught in day04_1."""
    raw, _ = _check(raw, np.zeros(QK), Q8_0_BYTES, "Q8_0")
    return _scale(raw), np.frombuffer(raw[2:], dtype=np.int8).copy()


def _strip_axes(ax, nbytes: int) -> None:
    ax.set_xlim(-0.2, nbytes + 0.2)
    ax.set_yticks([])
    ax.set_xticks(np.arange(nbytes) + 0.5)
    ax.set_xticklabels([str(i) for i in range(nbytes)], fontsize=7)
    ax.set_xlabel("字节偏移（块内）")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _draw_scale(ax, raw: bytes, d: float, top: float) -> None:
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((0, 0), 2, top, facecolor=_SCALE, edgecolor="black"))
    ax.text(1, top * 0.72, f"d = {d:.4g}", ha="center", va="center", fontsize=7.5, weight="bold")
    ax.text(1, top * 0.3, f"{raw[0]:02x} {raw[1]:02x}\n(fp16 缩放)", ha="center", va="center", fontsize=7)


def _values_panel(ax, x: np.ndarray, decoded: np.ndarray, colors, quants, legend) -> None:
    """Bars: the original values; black ticks: the decoded ones; bottom row: each value's quant."""
    idx = np.arange(QK)
    from matplotlib.patches import Patch

    ax.bar(idx, x, color=colors, edgecolor="none")
    (line,) = ax.plot(idx, decoded, "k_", markersize=9, markeredgewidth=2, label="解码值")
    ax.axhline(0, color="grey", linewidth=0.6)
    span = float(np.max(np.abs(np.concatenate([x, decoded])))) or 1.0
    for i, q in enumerate(quants):
        ax.text(i, -1.22 * span, str(int(q)), ha="center", va="center", fontsize=6.5)
    ax.axhline(-1.1 * span, color="grey", linewidth=0.4)
    ax.set_ylim(-1.35 * span, 1.5 * span)
    ax.set_xlim(-0.7, QK - 0.3)
    ax.set_xticks(range(0, QK, 2))
    ax.set_xlabel("值在块内的下标 i")
    ax.set_ylabel("数值")
    handles = [Patch(facecolor=c, label=lab) for c, lab in legend] + [line]
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles))


def draw_q4_0_block(raw: bytes, x: np.ndarray):
    """Draw one Q4_0 block (``raw``: its 18 bytes, ``x``: the 32 float values it encodes).

    Bytes 0–1 are the fp16 scale ``d``; byte ``2 + j`` holds the 4-bit quant of value ``j`` in its
    low nibble and of value ``j + 16`` in its high nibble; value ``i`` decodes to ``d · (q_i − 8)``.
    Returns a matplotlib Figure (Chinese title and labels). Taught in day04_2.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    raw, x = _check(raw, x, Q4_0_BYTES, "Q4_0")
    d, low, high = q4_0_fields(raw)
    q = np.concatenate([low, high]).astype(np.int64)
    decoded = np.float32(d) * (q - 8).astype(np.float32)

    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(11, 6.2), gridspec_kw=dict(height_ratios=[1.1, 1.4]))
    _draw_scale(ax0, raw, d, 2.0)
    for j in range(16):
        b = raw[2 + j]
        ax0.add_patch(Rectangle((2 + j, 0), 1, 1, facecolor=_LOW, edgecolor="black"))
        ax0.add_patch(Rectangle((2 + j, 1), 1, 1, facecolor=_HIGH, edgecolor="black"))
        ax0.text(2.5 + j, 0.5, f"{int(low[j])}", ha="center", va="center", fontsize=9)
        ax0.text(2.5 + j, 1.5, f"{int(high[j])}", ha="center", va="center", fontsize=9)
        ax0.text(2.5 + j, 2.25, f"{b:02x}", ha="center", va="center", fontsize=7, family="monospace")
    ax0.text(18.3, 0.5, "低 4 位 = 值 j 的 q", ha="left", va="center", fontsize=8)
    ax0.text(18.3, 1.5, "高 4 位 = 值 j+16 的 q", ha="left", va="center", fontsize=8)
    ax0.text(18.3, 2.25, "字节（十六进制）", ha="left", va="center", fontsize=8)
    ax0.set_ylim(0, 2.6)
    _strip_axes(ax0, Q4_0_BYTES)
    ax0.set_xlim(-0.2, 23.5)
    ax0.set_title(f"一个 Q4_0 块的 18 个字节：fp16 缩放 d，再 16 字节、每字节两个 4 位量化值（d = {d:.4g}）")

    colors = [_LOW] * 16 + [_HIGH] * 16
    _values_panel(ax1, x, decoded, colors, q,
                  [(_LOW, "原始值（存在低 4 位）"), (_HIGH, "原始值（存在高 4 位）")])
    ax1.set_title("这 32 个值与解码值 d·(q−8)；最下一行是每个值的 4 位 q")
    fig.tight_layout()
    return fig


def draw_q8_0_block(raw: bytes, x: np.ndarray):
    """Draw one Q8_0 block (``raw``: its 34 bytes, ``x``: the 32 float values it encodes).

    Bytes 0–1 are the fp16 scale ``d``; byte ``2 + i`` is the int8 quant ``q_i`` of value ``i``, which
    decodes to ``d · q_i``. Returns a matplotlib Figure (Chinese title and labels). Taught in day04_1.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    raw, x = _check(raw, x, Q8_0_BYTES, "Q8_0")
    d, q = q8_0_fields(raw)
    decoded = np.float32(d) * q.astype(np.float32)

    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(12, 6.0), gridspec_kw=dict(height_ratios=[1.0, 1.4]))
    _draw_scale(ax0, raw, d, 2.0)
    for i in range(QK):
        b = raw[2 + i]
        ax0.add_patch(Rectangle((2 + i, 0), 1, 1.6, facecolor=_INT8, edgecolor="black"))
        ax0.text(2.5 + i, 0.8, f"{int(q[i])}", ha="center", va="center", fontsize=7, rotation=90)
        ax0.text(2.5 + i, 1.85, f"{b:02x}", ha="center", va="center", fontsize=6, family="monospace")
    ax0.set_ylim(0, 2.2)
    _strip_axes(ax0, Q8_0_BYTES)
    ax0.set_title(f"一个 Q8_0 块的 34 个字节：fp16 缩放 d，再 32 个 int8 量化值 q（d = {d:.4g}）")

    _values_panel(ax1, x, decoded, [_INT8] * QK, q, [(_INT8, "原始值 x")])
    ax1.set_title("这 32 个值与解码值 d·q（下方一行是每个值的 int8 q）")
    fig.tight_layout()
    return fig
