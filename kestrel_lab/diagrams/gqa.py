"""The query-head → KV-head grouping of grouped-query attention (GQA), drawn from model configs.

Query head ``h`` reads KV head ``h // group`` with ``group = num_attention_heads // num_key_value_heads``:
adjacent query heads form a group (as transformers' ``repeat_kv``), they are not interleaved. The
diagram draws, for each config, the query heads on top, the KV heads below and a line from each query
head to the KV head it reads, coloured by group. Taught in day10_2.
"""
from __future__ import annotations

from typing import Mapping


def kv_head_of(n_heads: int, n_kv_heads: int) -> list[int]:
    """The KV head each query head reads: ``[h // (n_heads // n_kv_heads) for h in range(n_heads)]``.

    Raises ``ValueError`` when the query heads do not split evenly into groups. Taught in day10_2.
    """
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads do not split into {n_kv_heads} equal groups")
    group = n_heads // n_kv_heads
    return [h // group for h in range(n_heads)]


def group_label(members: list[int]) -> str:
    """How a KV head's query heads are written under it: ``q0–q1`` (a range) or ``q3`` (one head)."""
    return f"q{members[0]}" if len(members) == 1 else f"q{members[0]}–q{members[-1]}"


def draw_gqa_grouping(configs: Mapping[str, object]):
    """One panel per model: which of its query heads share each KV head; returns the Figure.

    ``configs`` maps a model name to a ``kestrel_lab.config.ModelConfig`` (anything with
    ``num_attention_heads`` and ``num_key_value_heads``). Call ``kestrel_lab.plotting.setup()`` first
    for Chinese glyphs. Taught in day10_2.
    """
    import matplotlib.pyplot as plt

    items = list(configs.items())
    if not items:
        raise ValueError("no config to draw")
    fig, axes = plt.subplots(len(items), 1, figsize=(11, 2.3 * len(items) + 0.6), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, (name, c) in zip(axes[:, 0], items):
        H, KVH = int(c.num_attention_heads), int(c.num_key_value_heads)
        mapping = kv_head_of(H, KVH)
        group = H // KVH
        width = max(H, 1)
        qx = [(h + 0.5) * width / H for h in range(H)]
        kx = [(j + 0.5) * width / KVH for j in range(KVH)]
        for h, j in enumerate(mapping):
            ax.plot([qx[h], kx[j]], [1, 0], color=cmap(j % 10), lw=1.2, alpha=0.8, zorder=1)
        box = dict(boxstyle="round,pad=0.25", lw=0.8)
        fs = 8 if H <= 16 else 6.5
        for h, j in enumerate(mapping):
            ax.text(qx[h], 1, f"q{h}", ha="center", va="center", fontsize=fs, zorder=2,
                    bbox=dict(box, fc=cmap(j % 10), alpha=0.35, ec=cmap(j % 10)))
        for j in range(KVH):
            members = [h for h, m in enumerate(mapping) if m == j]
            ax.text(kx[j], 0, f"KV{j}", ha="center", va="center", fontsize=9, zorder=2,
                    bbox=dict(box, fc=cmap(j % 10), alpha=0.6, ec="k"))
            ax.text(kx[j], -0.32, group_label(members), ha="center", va="top", fontsize=7.5, color="0.25")
        ax.set_xlim(0, width)
        ax.set_ylim(-0.65, 1.3)
        ax.set_yticks([1, 0])
        ax.set_yticklabels(["查询头 q", "KV 头"])
        ax.set_xticks([])
        ax.set_xlabel(f"q 头 h 读 KV 头 h // {group}（相邻的 {group} 个 q 头一组）", fontsize=9)
        ax.set_title(f"{name}：{H} 个查询头，{KVH} 个 KV 头，每组 {group} 个", fontsize=10)
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
    fig.suptitle("GQA：哪几个查询头共用同一个 KV 头（取自各模型的 config.json）")
    fig.tight_layout()
    return fig
