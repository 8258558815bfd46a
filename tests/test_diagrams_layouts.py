"""The Q4 layout diagrams are read from the package's real repack code (day06_2, day06_3, day07_1)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from kestrel_lab import plotting
from kestrel_lab.diagrams import layouts

plotting.setup()


@pytest.mark.parametrize("layout", sorted(layouts.ROWS))
def test_every_layout_is_a_pure_reordering(layout):
    m = layouts.source_map(layout, blocks=2)
    assert m["nbytes"] == layouts.ROWS[layout] * 2 * 18
    layouts.check_permutation(m)


def test_q4_8x8l_map_matches_the_documented_order():
    m = layouts.source_map("Q4_8X8L")
    # the 8 rows' fp16 scales first, in row order
    assert m["row"][:16].tolist() == [r for r in range(8) for _ in range(2)]
    assert m["byte"][:16].tolist() == [0, 1] * 8
    # tile t holds quant bytes [8t, 8t+8) of row r at 16 + 64t + 8r + k
    for t in range(2):
        for r in range(8):
            for k in range(8):
                i = 16 + 64 * t + 8 * r + k
                assert (m["row"][i], m["byte"][i]) == (r, 2 + 8 * t + k)


def test_r32_and_v16_maps_put_rows_side_by_side():
    r32 = layouts.source_map("Q4_0_R32")
    # column j of the nibble plane: byte j of the block of each of the 32 rows
    assert r32["row"][:32].tolist() == list(range(32)) and set(r32["byte"][:32].tolist()) == {2}
    assert r32["byte"][32] == 3
    assert set(r32["byte"][512:].tolist()) == {0, 1}          # then the scale plane
    v16 = layouts.source_map("Q4_0_V16")
    for k in range(4):
        for r in range(16):
            for i in range(4):
                assert (v16["row"][64 * k + 4 * r + i], v16["byte"][64 * k + 4 * r + i]) == (r, 2 + 4 * k + i)


def test_a_duplicate_byte_is_caught():
    m = layouts.source_map("Q4_0_V16")
    m["byte"] = m["byte"].copy()
    m["byte"][5] = m["byte"][4]
    with pytest.raises(ValueError, match="twice"):
        layouts.check_permutation(m)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="layout"):
        layouts.source_map("Q4_1")
    with pytest.raises(ValueError, match="blocks"):
        layouts.source_map("Q4_0", blocks=15)
    with pytest.raises(ValueError, match="same length"):
        layouts.draw_map(np.zeros(3), np.zeros(4), "x")


def test_the_drawing_has_chinese_labels_and_one_cell_per_byte():
    fig = layouts.draw("Q4_8X8L")
    ax = fig.axes[0]
    assert len(ax.patches) == 144
    assert "存储" in ax.get_ylabel() and "颜色" in ax.get_title()
    plt.close(fig)
