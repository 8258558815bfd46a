"""Cross-references: bare mentions become links to written parts and 「计划中」 for the others."""
from pathlib import Path

from kestrel_lab.book import links as booklinks

WRITTEN = {"day10_1": Path("notebooks/day10/day10_1_attention.ipynb"),
           "day17_1": Path("notebooks/day17/day17_1_convert.ipynb")}
PAGE = Path("notebooks/day03/day03_2_numba.ipynb")


def _fix(text, page=PAGE):
    return booklinks.fix(text, page, WRITTEN)


def test_written_parts_become_links_relative_to_the_page():
    assert _fix("见day10_1的热图") == "见[day10_1](../day10/day10_1_attention.ipynb)的热图"
    assert _fix("见 day10_1。", Path("book/formats/vqf.md")) == \
        "见 [day10_1](../../notebooks/day10/day10_1_attention.ipynb)。"
    assert _fix("`day10_1`") == "[`day10_1`](../day10/day10_1_attention.ipynb)"


def test_planned_parts_are_marked_and_markers_drop_once_written():
    assert _fix("day06_1 会讲 SIMD") == "day06_1（计划中） 会讲 SIMD"
    assert _fix("Day 06 · 2 与 day06–07") == "Day 06 · 2（计划中） 与 day06–07（计划中）"
    assert _fix("day10_1（计划中）讲过") == "[day10_1](../day10/day10_1_attention.ipynb)讲过"


def test_days_and_ranges_link_to_their_first_written_part():
    assert _fix("Day 17 的转换器") == "[Day 17](../day17/day17_1_convert.ipynb) 的转换器"
    assert _fix("第 16–18 天") == "[第 16–18 天](../day17/day17_1_convert.ipynb)"
    assert _fix("第 22 天") == "第 22 天（计划中）"


def test_code_paths_links_and_self_mentions_are_left_alone():
    for text in ("```\nrun day10_1\n```", "`kestrel-lab rerun --notebooks day10_1`", "data/ci/day10_1.json",
                 "day10_1_attention.ipynb", "[见这里](../day10/day10_1_attention.ipynb)",
                 "# Day 03 · 2｜numba", "本篇（day03_2）"):
        assert _fix(text) == text, text
        assert booklinks.problems(text, PAGE, WRITTEN) == [], text


def test_problems_name_the_page_line_and_the_fix():
    found = booklinks.problems("一\n见 day10_1\nday06_1 讲", PAGE, WRITTEN)
    assert found[0].startswith(f"{PAGE}:2: 'day10_1' is a bare mention")
    assert "day06_1（计划中）" in found[1]
    found = booklinks.problems("[day10_1](../day11/x.ipynb)", PAGE, WRITTEN)
    assert found[0].endswith("not to the notebook of day10_1")
    assert booklinks.problems(_fix("见 day10_1，day06_1 讲"), PAGE, WRITTEN) == []


def test_answers_inside_admonitions_are_prose_but_code_directives_are_not():
    text = "```{admonition} 参考答案\n:class: dropdown\n见 day10_1。\n```\n```{code-cell} python\nday10_1\n```\n"
    assert _fix(text) == text.replace("见 day10_1", "见 [day10_1](../day10/day10_1_attention.ipynb)")
    assert _fix("````md\n```{admonition} x\nday10_1\n```\n````") == "````md\n```{admonition} x\nday10_1\n```\n````"
