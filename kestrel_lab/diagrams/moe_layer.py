"""One Qwen3-MoE layer drawn with a config's numbers: router → softmax → top-k → k experts → weighted sum.

The numbers come from the config (``num_experts``, ``num_experts_per_tok``, ``hidden_size``,
``moe_intermediate_size``, ``norm_topk_prob``) and from the package's own byte and parameter counts
(``engine.moe.active_bytes`` / ``active_params``): how many of the layer's experts one token reads and what
that costs, beside what the whole layer holds. Taught in day22_1.
"""
from __future__ import annotations


def moe_numbers(config, quant: str = "q4_0") -> dict:
    """The figures the drawing labels, all computed from ``config``: per layer the experts, k, the widths, one
    expert's bytes at ``quant``, the bytes a token reads vs the layer's; for the model the active parameters."""
    from kestrel_lab.engine.moe import active_bytes, active_params
    from kestrel_lab.vqf.layout import plan

    if not config.moe_layers:
        raise ValueError("moe_numbers: the config has no MoE layer")
    E, k = config.num_experts, config.num_experts_per_tok
    h, m = config.hidden_size, config.moe_intermediate_size
    exps = sum(s.nbytes for s in plan(config, quant) if s.name.endswith("_exps"))
    per_layer = exps // len(config.moe_layers)
    ab, ap = active_bytes(config, quant), active_params(config)
    return {"E": E, "k": k, "hidden": h, "expert_width": m, "layers": config.num_hidden_layers,
            "moe_layers": len(config.moe_layers), "norm": bool(config.norm_topk_prob),
            "expert_bytes": per_layer // E, "layer_expert_bytes": per_layer, "token_expert_bytes": per_layer * k // E,
            "active_params": ap["total"], "all_params": sum(config.param_counts().values()),
            "token_bytes": ab["total"], "file_bytes": ab["file"]}


def draw_moe_layer(config, name: str, quant: str = "q4_0"):
    """The layer as boxes: x → router (E logits) → softmax → top-k → k of E experts (the rest greyed) →
    weighted sum → + residual, labelled with ``moe_numbers``. Returns the Figure. Taught in day22_1."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    n = moe_numbers(config, quant)
    fig, ax = plt.subplots(figsize=(12, 5.4))
    ax.set_xlim(0, 12)
    ax.set_ylim(0, 6.2)
    ax.axis("off")

    def box(x, y, w, hgt, text, fc, ink="white", size=9):
        ax.add_patch(FancyBboxPatch((x, y), w, hgt, boxstyle="round,pad=0.04", fc=fc, ec="none"))
        ax.text(x + w / 2, y + hgt / 2, text, ha="center", va="center", fontsize=size, color=ink, linespacing=1.35)

    def arrow(a, b, colour="#555555"):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, color=colour))

    box(0.1, 2.6, 1.5, 1.0, f"x\n1 × {n['hidden']}", "#4c72b0")
    box(2.0, 2.6, 1.8, 1.0, f"路由器 W_router\n{n['E']} × {n['hidden']}（F32）", "#8172b3")
    box(4.2, 2.6, 1.7, 1.0, f"softmax\n→ 取最大的 {n['k']} 个", "#8172b3")
    arrow((1.6, 3.1), (2.0, 3.1))
    arrow((3.8, 3.1), (4.2, 3.1))
    shown = min(n["E"], 16)
    chosen = set(range(0, shown, max(1, shown // n["k"])))
    chosen = set(sorted(chosen)[:n["k"]]) if n["k"] <= shown else set(range(shown))
    for i in range(shown):
        y = 0.3 + i * (5.6 / shown)
        on = i in chosen
        box(6.4, y, 2.4, 5.6 / shown * 0.8, f"专家 {i}" if i < shown - 1 or shown == n["E"] else f"… 专家 {n['E'] - 1}",
            "#dd8452" if on else "#e6e6e6", ink="white" if on else "#999999", size=7)
        if on:
            arrow((5.9, 3.1), (6.4, y + 5.6 / shown * 0.4), "#dd8452")
            arrow((8.8, y + 5.6 / shown * 0.4), (9.3, 3.1), "#dd8452")
    box(9.3, 2.6, 1.2, 1.0, "加权求和\nΣ w·y", "#c44e52")
    box(10.8, 2.6, 1.1, 1.0, "+ 残差", "#4c72b0")
    arrow((10.5, 3.1), (10.8, 3.1))
    mb = 1e6
    ax.text(7.6, 6.05, f"每个专家 = SwiGLU：{n['hidden']} → {n['expert_width']} → {n['hidden']}，"
            f"{quant.upper()} 下 {n['expert_bytes'] / mb:.2f} MB", ha="center", fontsize=9)
    note = (f"这一层 {n['E']} 个专家共 {n['layer_expert_bytes'] / mb:.0f} MB，一个 token 只读其中 {n['k']} 个："
            f"{n['token_expert_bytes'] / mb:.1f} MB。整个模型 {n['layers']} 层（{n['moe_layers']} 层 MoE）："
            f"每个 token 读 {n['token_bytes'] / 1e9:.2f} GB，文件 {n['file_bytes'] / 1e9:.1f} GB；"
            f"激活参数 {n['active_params'] / 1e9:.2f} B / 共 {n['all_params'] / 1e9:.1f} B。"
            + ("权重 w 在选中的 k 个里重新归一（norm_topk_prob）。" if n["norm"] else "权重 w 不重新归一。"))
    ax.text(6.0, -0.25, note, ha="center", va="top", fontsize=8.5, wrap=True)
    ax.set_title(f"{name} 的一个 MoE 层：路由器挑 {n['k']} / {n['E']} 个专家", fontsize=11)
    fig.tight_layout()
    return fig
