"""The GQA grouping and KV-cache layout diagrams are drawn from real data (day10_2, day11_1)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from kestrel_lab import paths, plotting
from kestrel_lab.config import ModelConfig
from kestrel_lab.diagrams import gqa, kv_cache
from kestrel_lab.engine import KVCache

plotting.setup()


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts + [ax.title, ax.xaxis.label, ax.yaxis.label]
            + ax.get_yticklabels()] + ([fig._suptitle.get_text()] if fig._suptitle else [])


def test_kv_head_of_groups_adjacent_query_heads():
    assert gqa.kv_head_of(16, 8) == [h // 2 for h in range(16)]
    assert gqa.kv_head_of(32, 4)[:9] == [0] * 8 + [1]
    with pytest.raises(ValueError):
        gqa.kv_head_of(6, 4)


def test_gqa_diagram_shows_the_real_mapping():
    cfg = ModelConfig.from_hf(paths.configs_dir() / "qwen3-0.6b.config.json")
    vl = ModelConfig.from_hf(paths.configs_dir() / "qwen3-vl-2b-instruct.config.json")
    fig = gqa.draw_gqa_grouping({"qwen3-0.6b": cfg, "qwen3-vl-2b-instruct": vl})
    assert isinstance(fig, matplotlib.figure.Figure)
    texts = _texts(fig)
    assert "q0–q1" in texts and "q14–q15" in texts and "KV7" in texts and "q15" in texts
    assert any("16 个查询头，8 个 KV 头" in t for t in texts)
    plt.close(fig)


def test_kv_layout_reads_the_real_strides():
    cache = KVCache(28, 8, 128, 4096)
    lay = kv_cache.kv_layout(cache.k)
    assert lay.strides == cache.k.strides == (8 * 4096 * 128 * 4, 4096 * 128 * 4, 128 * 4, 4)
    assert lay.row_bytes == 2 * 2**20 and lay.positions_per_page == 4096 and lay.rows_per_page == 1
    small = kv_cache.kv_layout(KVCache(4, 2, 64, 1024).k)
    assert small.rows_per_page == 8 and small.positions_per_page == 8192


def test_kv_diagram_prints_strides_and_pages():
    cache = KVCache(4, 2, 64, 1024)
    fig = kv_cache.draw_kv_layout(cache, max_rows=8)
    assert isinstance(fig, matplotlib.figure.Figure)
    text = "\n".join(_texts(fig))
    for s in cache.k.strides:
        assert f"stride {s:,} B" in text
    assert "一个大页 = 8 个 (层, 头) 行" in text and "层 3 · 头 1" in text and "float32" in text
    plt.close(fig)
