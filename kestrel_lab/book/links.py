"""Cross-references between parts of the book: every mention is a link, or says 「计划中」.

A student reads the book in a browser, so "see day10_1" must be a link when day10_1 is written, and
must say plainly that it is not written yet otherwise (「day06_1（计划中）」). This module finds the
mentions in prose — ``dayDD_P``, ``Day DD · P``, ``dayDD``, ``Day DD``, ``第 N 天`` and ranges such as
``day06–07`` — skipping code blocks, inline code (except a code span that is exactly an id), link
targets and a page's mentions of itself. ``problems`` lists what is wrong; ``fix`` rewrites bare
mentions into links or 「计划中」 markers, and drops a stale 「计划中」 once the part is written.

Used by ``kestrel-lab book links`` and by the test that guards every notebook and hand-written page.
Taught in day28_1 (how the book is put together).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kestrel_lab import syllabus
from kestrel_lab.paths import REPO_ROOT

PLANNED = "（计划中）"
# Hand-written pages whose prose is checked; generated pages (syllabus, dashboard) are not prose.
GENERATED_PAGES = ("book/syllabus.md", "book/dashboard.md")

_DASH = r"\s*[–—\-~]\s*"
_B = r"(?<![0-9A-Za-z_/.\-])"  # not inside a word, a path or a file name (Chinese may touch it)
_E = r"(?![0-9A-Za-z_]|\.[A-Za-z])"
_MENTION = re.compile(
    rf"(?P<part>{_B}day(?P<pd>\d\d)_(?P<pp>[1-3]){_E})"
    rf"|(?P<tpart>{_B}Day\s*(?P<td>\d{{1,2}})\s*·\s*(?P<tp>[1-3]){_E})"
    rf"|(?P<range>{_B}[Dd]ays?\s*(?P<ra>\d{{1,2}}){_DASH}(?:[Dd]ay\s*)?(?P<rb>\d{{1,2}}){_E})"
    rf"|(?P<zrange>第\s*(?P<za>\d{{1,2}}){_DASH}(?P<zb>\d{{1,2}})\s*天)"
    rf"|(?P<day>{_B}[Dd]ays?\s*(?P<dd>\d{{1,2}})(?![\d_]|\s*·\s*[1-3]|\.[A-Za-z]|[A-Za-z]))"
    r"|(?P<zday>第\s*(?P<zd>\d{1,2})\s*天)"
)
_FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})\s*(.*)$")


def _code_blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of fenced code blocks. A MyST directive fence such as ```{admonition}
    holds prose (the exercises' answers): its body is scanned like the text, while ```python,
    ```{code-cell} and bare ``` blocks are code. Nested fences close in order."""
    blocks, stack, pos = [], [], 0  # stack: (fence, is_code, start)
    for line in text.splitlines(keepends=True):
        m = _FENCE_LINE.match(line)
        if m:
            fence, info = m.group(1), m.group(2).strip()
            if stack and not info and fence[0] == stack[-1][0][0] and len(fence) >= len(stack[-1][0]):
                f, is_code, start = stack.pop()
                if is_code and not any(c for _, c, _ in stack):
                    blocks.append((start, pos + len(line)))
            else:
                is_code = not (info.startswith("{") and not info.startswith("{code"))
                stack.append((fence, is_code, pos))
        pos += len(line)
    blocks += [(start, len(text)) for _, is_code, start in stack[:1] if is_code]  # unclosed: code to the end
    return blocks


_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]*)\)")
_HTML_TAG = re.compile(r"<[^>\n]+>")
_ID_ONLY = re.compile(r"^day\d\d_[1-3]$")


@dataclass(frozen=True)
class Mention:
    start: int
    end: int
    text: str
    parts: tuple[str, ...]  # the part ids it may refer to, in order (a day or a range: all its parts)
    linked_to: str | None = None  # the link target when the mention is a link's text
    code: bool = False  # a code span that is exactly an id (`day10_1`)


def _part_ids(m: re.Match) -> tuple[str, ...]:
    if m.group("part"):
        return (f"day{m.group('pd')}_{m.group('pp')}",)
    if m.group("tpart"):
        return (f"day{int(m.group('td')):02d}_{m.group('tp')}",)
    if m.group("range") or m.group("zrange"):
        a, b = (int(m.group("ra")), int(m.group("rb"))) if m.group("range") else \
               (int(m.group("za")), int(m.group("zb")))
        days = range(min(a, b), max(a, b) + 1)
    else:
        days = [int(m.group("dd") or m.group("zd"))]
    return tuple(f"day{d:02d}_{k}" for d in days for k in (1, 2, 3))


def _masked(text: str) -> tuple[str, list[tuple[int, int, str, str]]]:
    """Blank out what is not prose (same length, so offsets stay valid); return the links found."""
    chars = list(text)

    def blank(a: int, b: int) -> None:
        for i in range(a, b):
            if chars[i] != "\n":
                chars[i] = " "

    for a, b in _code_blocks(text):
        blank(a, b)
    pos = 0
    for line in text.splitlines(keepends=True):  # directive fence lines: markup, not prose
        if _FENCE_LINE.match(line):
            blank(pos, pos + len(line))
        pos += len(line)
    # Math, HTML tags and MyST directive option lines are not prose either.
    for m in _HTML_TAG.finditer(text):
        blank(m.start(), m.end())
    links = []
    masked = "".join(chars)
    for m in _LINK.finditer(masked):
        links.append((m.start(), m.end(), m.group("text"), m.group("target")))
        blank(m.start("target") - 1, m.end())
    return "".join(chars), links


def mentions(text: str) -> list[Mention]:
    """Every mention of a part or day in the prose of ``text`` (Markdown)."""
    masked, links = _masked(text)
    found: list[Mention] = []
    spans = []  # code spans: an id-only span is a mention, any other is skipped
    for m in _CODE_SPAN.finditer(masked):
        spans.append((m.start(), m.end(), m.group(2)))

    def in_span(i):
        return next((s for s in spans if s[0] <= i < s[1]), None)

    for m in _MENTION.finditer(masked):
        span = in_span(m.start())
        code = False
        start, end = m.start(), m.end()
        if span:
            if not _ID_ONLY.match(span[2].strip()):
                continue
            start, end, code = span[0], span[1], True
            if found and found[-1].start == start:
                continue
        link = next((lk for lk in links if lk[0] <= start < lk[1]), None)
        found.append(Mention(start, end, text[start:end], _part_ids(m),
                             linked_to=link[3] if link else None, code=code))
    return found


def _written() -> dict[str, Path]:
    return {p.id: p.notebook for p in syllabus.load_parts() if p.written}


def _target(part: str, page: Path, written: dict[str, Path]) -> str:
    """Relative link from ``page`` (repo-relative) to the notebook of ``part``."""
    return Path(os.path.relpath(REPO_ROOT / written[part], (REPO_ROOT / page).parent)).as_posix()


def _self_ids(page: Path) -> set[str]:
    m = syllabus.NOTEBOOK_FILE.match(page.name)
    return {m.group(1)} if m else set()


def _resolve(target: str, page: Path) -> Path | None:
    target = target.split("#")[0]
    if not target or "://" in target:
        return None
    return Path(os.path.normpath((REPO_ROOT / page).parent / target)).relative_to(REPO_ROOT) \
        if not target.startswith("/") else None


def problems(text: str, page: Path, written: dict[str, Path] | None = None) -> list[str]:
    """What is wrong with the cross-references of ``text`` on ``page`` (repo-relative path)."""
    written = _written() if written is None else written
    out = []
    own = _self_ids(page)
    for mt in mentions(text):
        if own & set(mt.parts) and len(mt.parts) <= 3 and not mt.linked_to:
            continue  # the page naming itself (its title, "本篇")
        line = text.count("\n", 0, mt.start) + 1
        here = [p for p in mt.parts if p in written]
        after = text[mt.end:mt.end + len(PLANNED)]
        if mt.linked_to is not None:
            dest = _resolve(mt.linked_to, page)
            if dest is None or dest.with_suffix("") not in {written[p].with_suffix("") for p in here}:
                out.append(f"{page}:{line}: {mt.text!r} links to {mt.linked_to!r}, "
                           f"not to the notebook of {'/'.join(here) or mt.parts[0]}")
            elif after == PLANNED:
                out.append(f"{page}:{line}: {mt.text!r} is written now: drop 「计划中」")
        elif here:
            what = "is marked 计划中 but is written" if after == PLANNED else "is a bare mention"
            out.append(f"{page}:{line}: {mt.text!r} {what}: link it to {_target(here[0], page, written)}")
        elif after != PLANNED:
            out.append(f"{page}:{line}: {mt.text!r} is not written yet: write it as "
                       f"「{mt.text}{PLANNED}」")
    return out


def fix(text: str, page: Path, written: dict[str, Path] | None = None) -> str:
    """``text`` with bare mentions linked (or marked 「计划中」) and stale markers dropped."""
    written = _written() if written is None else written
    own = _self_ids(page)
    pieces, pos = [], 0
    for mt in mentions(text):
        if mt.linked_to is not None or (own & set(mt.parts) and len(mt.parts) <= 3):
            continue
        here = [p for p in mt.parts if p in written]
        end = mt.end
        has_marker = text[end:end + len(PLANNED)] == PLANNED
        pieces.append(text[pos:mt.start])
        if here:
            pieces.append(f"[{mt.text}]({_target(here[0], page, written)})")
            if has_marker:
                end += len(PLANNED)
        else:
            pieces.append(mt.text + ("" if has_marker else PLANNED))
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces)


# --------------------------------------------------------------------------- pages of the book
def prose_pages(root: Path = REPO_ROOT) -> list[Path]:
    """Repo-relative paths whose prose is checked: every notebook and the hand-written book pages."""
    pages = [p for p in syllabus.find_notebooks(root).values()]
    pages += sorted(p.relative_to(root) for p in (root / "book").rglob("*.md")
                    if p.relative_to(root).as_posix() not in GENERATED_PAGES)
    return pages


def page_problems(page: Path, written: dict[str, Path] | None = None) -> list[str]:
    import nbformat

    path = REPO_ROOT / page
    if page.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return [p for c in nb.cells if c.cell_type == "markdown" for p in problems(c.source, page, written)]
    return problems(path.read_text(encoding="utf-8"), page, written)


def fix_page(page: Path, written: dict[str, Path] | None = None) -> bool:
    """Rewrite ``page`` in place (atomically); True if it changed."""
    import nbformat

    from kestrel_lab.atomic import atomic_write

    path = REPO_ROOT / page
    if page.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        changed = False
        for c in nb.cells:
            if c.cell_type == "markdown":
                new = fix(c.source, page, written)
                changed |= new != c.source
                c.source = new
        if changed:
            with atomic_write(path, "w") as fh:
                nbformat.write(nb, fh)
        return changed
    old = path.read_text(encoding="utf-8")
    new = fix(old, page, written)
    if new != old:
        with atomic_write(path, "w") as fh:
            fh.write(new)
    return new != old
