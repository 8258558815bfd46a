"""Qwen3-VL's data flow from a picture to the language model, with every shape computed from a config.

pixels → smart resize (a multiple of patch·merge) → 16×16 patches, each frame repeated ``temporal_patch_size``
times → patch embedding → ``depth`` vision blocks → after the blocks of ``deepstack_visual_indexes`` a
DeepStack merger (2×2 → the text width) → after the last block the main merger (2×2 → the text width) →
one ``<|image_pad|>`` per merged token in the prompt → the language model's layers, the DeepStack features
added after layers 0, 1, … . ``vl_stages`` computes each stage's shape with the package's own functions
(``vision.preprocess.smart_resize``, ``vision.positions.image_token_count``); ``draw_vl_flow`` draws it,
one column per config (the tiny VL model and Qwen3-VL-2B). Taught in day19_1.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One box of the flow: what it is (Chinese), its output shape in words, and its kind (for the colour)."""

    label: str
    shape: str
    kind: str        # "input", "vision", "merge", "deepstack", "text"


def vl_stages(config, image_hw: tuple[int, int] = (480, 640)) -> list[Stage]:
    """The stages of one picture of ``image_hw`` (height, width) through a Qwen3-VL ``config``.

    Every shape is computed here from the config (vision width, depth, patch, merge, DeepStack taps, text
    width and layers) and the package's resize rule; nothing is typed in. Taught in day19_1.
    """
    from kestrel_lab.vision.positions import image_token_count
    from kestrel_lab.vision.preprocess import smart_resize

    v = config.vision
    if v is None:
        raise ValueError("vl_stages: the config has no vision_config (not a Qwen3-VL model)")
    p, t, m = v.patch_size, v.temporal_patch_size, v.spatial_merge_size
    h, w = smart_resize(image_hw[0], image_hw[1], p * m)
    gh, gw = h // p, w // p
    n = gh * gw
    tokens = image_token_count((1, gh, gw), m)
    taps = list(v.deepstack_visual_indexes)
    text_w = v.out_hidden_size
    return [
        Stage("图片（RGB）", f"{image_hw[0]}×{image_hw[1]}×3 → 缩放到 {h}×{w}（{p * m} 的倍数）", "input"),
        Stage(f"切成 {p}×{p} 的 patch，每帧重复 {t} 次", f"{gh}×{gw} = {n} 个 patch × {3 * t * p * p} 个数", "input"),
        Stage("patch 嵌入（Conv3d = 矩阵乘）+ 位置表", f"{n} × {v.hidden_size}", "vision"),
        Stage(f"{v.depth} 个视觉块（LayerNorm、注意力、MLP）", f"{n} × {v.hidden_size}；第 "
              f"{'、'.join(str(i) for i in taps)} 块之后（从 0 数）引出 DeepStack", "vision"),
        Stage(f"DeepStack 合并器 ×{len(taps)}\n{m}×{m} 拼接 → 文本宽度", f"各 {tokens} × {text_w}", "deepstack"),
        Stage(f"主合并器：LayerNorm、{m}×{m} 拼接、MLP", f"{tokens} × {text_w}", "merge"),
        Stage(f"提示里的 {tokens} 个 <|image_pad|>", f"换成合并器的 {tokens} 行", "text"),
        Stage(f"语言模型 {config.num_hidden_layers} 层", f"DeepStack 特征加在第 "
              f"{'、'.join(str(i) for i in range(len(taps)))} 层之后", "text"),
    ]


COLOURS = {"input": "#d0d7e2", "vision": "#dd8452", "deepstack": "#8172b3", "merge": "#c44e52", "text": "#4c72b0"}


def draw_vl_flow(configs: dict, image_hw: tuple[int, int] = (480, 640)):
    """One column of boxes per config (name → ModelConfig), the stages of ``vl_stages`` top to bottom with their
    shapes, the DeepStack branch beside the main path. Returns the Figure. Taught in day19_1."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    items = list(configs.items())
    fig, axes = plt.subplots(1, len(items), figsize=(6.2 * len(items), 7.4), squeeze=False)
    for ax, (name, cfg) in zip(axes[0], items):
        stages = vl_stages(cfg, image_hw)
        main = [s for s in stages if s.kind != "deepstack"]
        side = next(s for s in stages if s.kind == "deepstack")
        ax.set_xlim(0, 10)
        ax.set_ylim(-0.5, len(main) * 1.25)
        ax.axis("off")
        ys = {}
        for i, s in enumerate(main):
            y = (len(main) - 1 - i) * 1.25
            ys[s.label] = y
            ax.add_patch(FancyBboxPatch((0.2, y), 6.0, 0.85, boxstyle="round,pad=0.04", fc=COLOURS[s.kind],
                                        ec="none", alpha=0.9))
            ink = "#222222" if s.kind == "input" else "white"
            ax.text(3.2, y + 0.56, s.label, ha="center", va="center", fontsize=9.5, color=ink, weight="bold")
            ax.text(3.2, y + 0.22, s.shape, ha="center", va="center", fontsize=8, color=ink)
            if i:
                ax.add_patch(FancyArrowPatch((3.2, y + 1.25), (3.2, y + 0.87), arrowstyle="-|>", mutation_scale=12,
                                             color="#555555"))
        blocks_y = ys[main[3].label]
        text_y = ys[main[-1].label]
        ax.add_patch(FancyBboxPatch((6.7, blocks_y - 1.6), 3.1, 1.1, boxstyle="round,pad=0.04",
                                    fc=COLOURS["deepstack"], ec="none", alpha=0.9))
        ax.text(8.25, blocks_y - 0.85, side.label, ha="center", va="center", fontsize=8.5, color="white",
                weight="bold", linespacing=1.3)
        ax.text(8.25, blocks_y - 1.38, side.shape, ha="center", va="center", fontsize=8, color="white")
        ax.add_patch(FancyArrowPatch((6.2, blocks_y + 0.4), (8.25, blocks_y - 0.45), arrowstyle="-|>",
                                     mutation_scale=12, color=COLOURS["deepstack"], connectionstyle="arc3,rad=-0.2"))
        ax.add_patch(FancyArrowPatch((8.25, blocks_y - 1.65), (6.25, text_y + 0.45), arrowstyle="-|>",
                                     mutation_scale=12, color=COLOURS["deepstack"], connectionstyle="arc3,rad=-0.2"))
        v = cfg.vision
        ax.set_title(f"{name}：视觉塔宽 {v.hidden_size}、{v.depth} 块，文本 {cfg.hidden_size} 宽、"
                     f"{cfg.num_hidden_layers} 层", fontsize=10)
    fig.suptitle(f"Qwen3-VL：一张 {image_hw[1]}×{image_hw[0]} 的图怎样进入语言模型", fontsize=12)
    fig.tight_layout()
    return fig
