"""Model facts stated in the lessons' prose, checked against the files that hold them.

A sentence like 「视觉塔 6 块，第 1、3 块之后引出 DeepStack」 is true only while the model's ``config.json`` says so;
retrain or regenerate the model and the sentence goes stale without a word. Trained facts (accuracy, agreement,
the kinds of errors) are glued into the prose from their JSON files; structural facts (block counts, DeepStack
taps, widths, the resize multiple) may be written out, and this module reads every such statement in the
notebooks' Markdown and compares it with the file. ``FACTS`` is the table: the file and field, what the prose
says it with (a pattern with the stated value as group ``v``), and which sentences speak of that model (those
naming it, and in the lessons that run it, those naming no other model). ``stale`` lists each statement that
disagrees; ``sources`` swaps a file for a copy, which is how a test proves the check bites.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from kestrel_lab.paths import REPO_ROOT

TINY_VL = "data/models/qwen3-tiny-vl/config.json"
VL_2B = "data/configs/qwen3-vl-2b-instruct.config.json"
TINY_WORDS = ("tiny-VL", "tiny VL", "qwen3-tiny-vl", "tiny 配置")
TINY_LESSONS = ("day21_3", "day25_3", "day30_1")         # lessons whose model, by default, is the tiny VL
OTHER_FOR_TINY = ("2B", "0.6B", "30B", "Qwen3-VL-2B")
VL_2B_LESSONS = ("day19_1", "day19_2", "day20_1", "day20_2")   # lessons that speak of Qwen3-VL as the 2B model
OTHER_FOR_2B = ("tiny", "小模型")
SENTENCE = re.compile(r"[^。；;\n]+")
BLOCKS = r"(?<![第、×\d.,])(?P<v>\d+)\s*(?:个)?\s*(?:视觉|ViT)?\s*(?:块|block)(?!\s*之后)"
TAPS = r"第\s*(?P<v>\d+(?:\s*[、,，和]\s*\d+)*)\s*(?:个)?\s*(?:块|block)\s*之后"


@dataclass(frozen=True)
class Fact:
    """One fact: ``field`` of ``source`` (a dotted path; ``a*b`` multiplies two), stated by ``pattern`` in a
    sentence that holds one of ``context``; counted in sentences naming one of ``words``, and in ``lessons``
    in sentences naming none of ``other``."""

    name: str
    source: str
    field: str
    pattern: str
    context: tuple[str, ...]
    words: tuple[str, ...]
    lessons: tuple[str, ...] = ()
    other: tuple[str, ...] = ()

    def value(self, doc: dict):
        if "*" in self.field:
            a, b = self.field.split("*")
            return _get(doc, a) * _get(doc, b)
        return _get(doc, self.field)


def _get(doc: dict, dotted: str):
    for key in dotted.split("."):
        doc = doc[key]
    return doc


def _facts_of(model: str, source: str, words, lessons, other) -> list[Fact]:
    v = "vision_config"
    return [
        Fact(f"{model}: vision depth", source, f"{v}.depth", BLOCKS, ("视觉塔", "视觉块", "视觉 block"), words,
             lessons, other),
        Fact(f"{model}: DeepStack taps", source, f"{v}.deepstack_visual_indexes", TAPS, ("DeepStack",), words,
             lessons, other),
        Fact(f"{model}: vision width", source, f"{v}.hidden_size", r"视觉塔[^，,。]{0,12}宽\s*(?P<v>\d+)",
             ("视觉塔",), words, lessons, other),
        Fact(f"{model}: text layers", source, "text_config.num_hidden_layers",
             r"(?:文本塔|语言模型)\s*(?:有|共|是)?\s*(?P<v>\d+)\s*层", ("文本塔", "语言模型"), words, lessons, other),
        Fact(f"{model}: resize multiple", source, f"{v}.patch_size*{v}.spatial_merge_size",
             r"(?P<v>\d+)\s*的倍数", ("缩放", "resize", "边长", "两边"), words, lessons, other),
    ]


FACTS: list[Fact] = (_facts_of("qwen3-tiny-vl", TINY_VL, TINY_WORDS, TINY_LESSONS, OTHER_FOR_TINY)
                     + _facts_of("Qwen3-VL-2B", VL_2B, ("2B",), VL_2B_LESSONS, OTHER_FOR_2B))


@dataclass(frozen=True)
class Finding:
    """A statement that disagrees with its file."""

    lesson: str
    cell: int
    sentence: str
    fact: str
    stated: object
    actual: object

    def __str__(self) -> str:
        return (f"{self.lesson} cell {self.cell}: 「{self.sentence.strip()}」 states {self.fact} = {self.stated}, "
                f"but the file says {self.actual}")


def _parse(text: str):
    nums = [int(n) for n in re.findall(r"\d+", text)]
    return nums if len(nums) > 1 else nums[0]


def _applies(fact: Fact, lesson: str, sentence: str) -> bool:
    if not any(c in sentence for c in fact.context):
        return False
    if any(w in sentence for w in fact.words):
        return True
    return lesson in fact.lessons and not any(o in sentence for o in fact.other)


def statements(markdown: str, lesson: str, fact: Fact) -> list[tuple[str, object]]:
    """(sentence, stated value) of every statement of ``fact`` in ``markdown``."""
    out = []
    for m in SENTENCE.finditer(re.sub(r"\{glue:[a-z]+\}`[^`]*`", "", markdown)):   # a glued value is no statement
        s = m.group(0)
        if _applies(fact, lesson, s):
            out += [(s, _parse(g.group("v"))) for g in re.finditer(fact.pattern, s)]
    return out


def stale(root: Path = REPO_ROOT, sources: dict[str, Path] | None = None, facts=None) -> list[Finding]:
    """Every prose statement of a fact in ``notebooks/`` that disagrees with its file (``sources`` maps a
    fact's source to another file, e.g. a modified copy)."""
    import nbformat

    facts = FACTS if facts is None else facts
    docs = {}
    for f in facts:
        path = Path((sources or {}).get(f.source, root / f.source))
        docs.setdefault(f.source, json.loads(path.read_text(encoding="utf-8")))
    found = []
    for nb_path in sorted((root / "notebooks").glob("day*/day*.ipynb")):
        lesson = nb_path.name[:7]
        cells = nbformat.read(nb_path, as_version=4).cells
        for i, cell in enumerate(cells):
            if cell.cell_type != "markdown":
                continue
            for f in facts:
                actual = f.value(docs[f.source])
                for sentence, stated in statements(cell.source, lesson, f):
                    if stated != actual:
                        found.append(Finding(lesson, i, sentence, f.name, stated, actual))
    return found
