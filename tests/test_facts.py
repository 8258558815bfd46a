"""Model facts in the lessons' prose agree with the files that hold them (kestrel_lab.book.facts), and the check
bites: change a fact in a copy of its file and every lesson that states the old value is named."""
from __future__ import annotations

import json

from kestrel_lab.book import facts
from kestrel_lab.paths import REPO_ROOT


def _copy_with(tmp_path, source: str, change) -> dict:
    doc = json.loads((REPO_ROOT / source).read_text(encoding="utf-8"))
    change(doc)
    out = tmp_path / "config.json"
    out.write_text(json.dumps(doc), encoding="utf-8")
    return {source: out}


def test_changing_the_2b_vision_depth_names_every_lesson_that_states_it(tmp_path):
    sources = _copy_with(tmp_path, facts.VL_2B, lambda d: d["vision_config"].__setitem__("depth", 25))
    named = {f.lesson for f in facts.stale(sources=sources) if f.fact == "Qwen3-VL-2B: vision depth"}
    assert {"day19_1", "day19_2", "day21_3", "day30_1"} <= named, named
    assert all(f.stated == 24 and f.actual == 25 for f in facts.stale(sources=sources)
               if f.fact == "Qwen3-VL-2B: vision depth")


def test_statements_read_counts_lists_and_skip_other_models_and_glue():
    depth = next(f for f in facts.FACTS if f.name == "qwen3-tiny-vl: vision depth")
    taps = next(f for f in facts.FACTS if f.name == "qwen3-tiny-vl: DeepStack taps")
    md = ("tiny-VL 的视觉塔 6 块。第 1、3 块之后的 DeepStack 分支各给一组特征。"
          "2B 的视觉塔有 24 块。视觉塔 {glue:text}`depth` 块。")
    assert [v for _, v in facts.statements(md, "day21_3", depth)] == [6]
    assert [v for _, v in facts.statements(md, "day21_3", taps)] == [[1, 3]]
    assert facts.statements("视觉塔有 5 块。", "day02_1", depth) == []      # a lesson that is not about this model
