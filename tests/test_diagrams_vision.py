"""The vision diagrams draw the package's own data: the patch order comes from ``patchify`` itself."""
import matplotlib

matplotlib.use("Agg")

import numpy as np

from kestrel_lab import plotting
from kestrel_lab.diagrams import vision
from kestrel_lab.vision import positions, prompt

plotting.setup()


def test_patch_order_is_the_merge_block_order():
    order = vision.patch_order(4, 6)
    assert order[:2, :2].tolist() == [[0, 1], [2, 3]] and order[0, 2] == 4 and order[2, 0] == 12
    assert sorted(order.ravel().tolist()) == list(range(24))
    for k in range(24):   # block-major, then row-major inside the 2x2 block
        block, inner = divmod(k, 4)
        r, c = (block // 3) * 2 + inner // 2, (block % 3) * 2 + inner % 2
        assert order[r, c] == k


def test_figures_are_drawn_with_chinese_titles():
    ids = [1, prompt.VISION_START] + [prompt.IMAGE_PAD] * 6 + [prompt.VISION_END, 2]
    kinds = vision.token_kinds(ids, image_pad_id=prompt.IMAGE_PAD, vision_start_id=prompt.VISION_START,
                               vision_end_id=prompt.VISION_END)
    assert kinds.count("image_pad") == 6 and kinds[1] == "vision_start"
    pos, _ = positions.mrope_positions(ids, [(1, 4, 6)], image_pad_id=prompt.IMAGE_PAD)
    figs = [vision.draw_patch_grid(np.zeros((64, 96, 3), np.uint8)), vision.draw_token_strip(kinds),
            vision.draw_mrope_positions(pos, kinds, grid_thw=(1, 4, 6)), vision.draw_frequency_axes(128, [24, 20, 20])]
    for fig in figs:
        title = fig.axes[0].get_title() or fig.axes[0].get_title(loc="left")
        assert any("\u4e00" <= ch <= "\u9fff" for ch in title), title
