"""Every notebook follows book/contributing.md, and the generated book sources are up to date."""
import ast
import re

import nbformat
import pytest

from kestrel_lab import syllabus
from kestrel_lab.book import links as booklinks, sources
from kestrel_lab.paths import REPO_ROOT

NOTEBOOKS = syllabus.find_notebooks()
CJK = re.compile(r"[\u4e00-\u9fff]")


def test_syllabus_has_90_parts_in_order():
    parts = syllabus.load_parts()
    assert [p.id for p in parts] == [f"day{d:02d}_{k}" for d in range(1, 31) for k in (1, 2, 3)]
    assert {p.id for p in parts if p.seed} == {"day16_3", "day18_2"}


def test_generated_sources_are_current():
    for path, text in sources.generated_sources():
        assert path.read_text(encoding="utf-8") == text, \
            f"{path.relative_to(REPO_ROOT)} is stale: run `kestrel-lab book sources`"


def test_toc_captions_promise_only_written_topics():
    toc = (REPO_ROOT / "_toc.yml").read_text(encoding="utf-8")
    parts = syllabus.load_parts()
    written_days = {p.day for p in parts if p.written}
    for week in syllabus.WEEK_TOPICS:
        for name, first, last in week:
            if not any(first <= d <= last for d in written_days):
                assert not re.search(rf"caption: .*[·、]\s*{re.escape(name)}(、|$)", toc, re.M), \
                    f"_toc.yml promises {name} (days {first}–{last}) but none of its parts is written"


def test_syllabus_page_marks_written_parts_honestly():
    text = syllabus.syllabus_markdown()
    for part in syllabus.load_parts():
        row = next(line for line in text.splitlines() if line.startswith(f"| {part.id}"))
        assert row.endswith("已写成 |" if part.written else "计划中 |"), row


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("nb_id", sorted(NOTEBOOKS))
def test_notebook_follows_conventions(nb_id):
    path = REPO_ROOT / NOTEBOOKS[nb_id]
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    cells = nb.cells
    assert cells[0].cell_type == "markdown" and cells[0].source.lstrip().startswith("# Day"), \
        f"{path.name}: the first cell is the title '# Day DD · P｜…'"
    code = [c for c in cells if c.cell_type == "code"]
    params = code[0]
    assert "parameters" in params.metadata.get("tags", []), f"{path.name}: first code cell must be tagged 'parameters'"
    assigned = {t.id: ast.literal_eval(node.value) for node in ast.parse(params.source).body
                if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    assert assigned.get("runner") == "local" and assigned.get("quick") is True, \
        f"{path.name}: parameters need runner = 'local' and quick = True"
    for c in code:
        assert not c.get("outputs") and c.get("execution_count") is None, \
            f"{path.name}: commit notebooks without outputs"
    markdown = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    assert len(CJK.findall(markdown)) > 200, f"{path.name}: the prose is in Simplified Chinese"
    for heading in ("## 练习", "A 档", "B 档", "## 小结"):
        assert heading in markdown, f"{path.name}: missing '{heading}'"
    source = "\n".join(c.source for c in code)
    assert re.search(rf"Recorder\(\s*[\"']{nb_id}[\"']", source), f"{path.name}: records as {nb_id}"
    assert "rec.save()" in source and re.search(rf"compare\(\s*[\"']{nb_id}[\"']", source), \
        f"{path.name}: ends with rec.save() and measure.compare('{nb_id}')"


@pytest.mark.parametrize("nb_id", sorted(NOTEBOOKS))
def test_papermill_sees_every_parameter(nb_id):
    """`kestrel-lab rerun -p NAME VALUE` relies on papermill reading the parameters cell: a line it
    cannot parse (e.g. a comment containing '=') makes the parameter invisible to it."""
    import papermill

    path = REPO_ROOT / NOTEBOOKS[nb_id]
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    names = {t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    assert set(papermill.inspect_notebook(str(path))) == names, \
        f"{path.name}: papermill cannot parse some parameter lines (no '=' inside their comments)"


# --------------------------------------------------------------------------- the book's reading bar
RECORDING = re.compile(r"\brec\.(record|not_measured|computed)\(")
HIDDEN = {"hide-input", "remove-input"}


def _nb(nb_id):
    return nbformat.read(REPO_ROOT / NOTEBOOKS[nb_id], as_version=4)


@pytest.mark.parametrize("nb_id", sorted(NOTEBOOKS))
def test_notebook_opens_with_goals_and_neighbours(nb_id):
    """学习目标 and a 前置 / 下一步 line in the title cell, so a student knows where they are."""
    title = _nb(nb_id).cells[0].source
    for word in ("学习目标", "前置", "下一步"):
        assert word in title, f"{nb_id}: the title cell needs '{word}' (see book/contributing.md)"


@pytest.mark.parametrize("nb_id", sorted(NOTEBOOKS))
def test_notebook_has_a_laptop_checkable_exercise(nb_id):
    """book/contributing.md 「练习的写法」: skeleton raising NotImplementedError, a folded reference,
    and exercise.check(...) — so every build runs the check, on the reference until a student fills in."""
    cells = _nb(nb_id).cells
    code = [c for c in cells if c.cell_type == "code"]
    assert any("raise NotImplementedError" in c.source for c in code), f"{nb_id}: no exercise skeleton"
    assert any("exercise.check(" in c.source for c in code), f"{nb_id}: no exercise.check(...) cell"
    assert any("hide-input" in c.metadata.get("tags", []) and "def " in c.source
               and "raise NotImplementedError" not in c.source for c in code), \
        f"{nb_id}: the reference solution belongs in a cell tagged hide-input"


@pytest.mark.parametrize("nb_id", sorted(NOTEBOOKS))
def test_recording_is_kept_out_of_the_teaching_cells(nb_id):
    """Bookkeeping (rec.record / not_measured / computed) lives in cells the book folds."""
    for i, c in enumerate(_nb(nb_id).cells):
        if c.cell_type == "code" and RECORDING.search(c.source):
            assert HIDDEN & set(c.metadata.get("tags", [])), \
                f"{nb_id} cell {i}: a cell that records figures is tagged hide-input"


@pytest.mark.parametrize("page", booklinks.prose_pages(), ids=str)
def test_every_mention_of_another_part_is_a_link_or_planned(page):
    found = booklinks.page_problems(page)
    assert not found, "\n".join(found[:10]) + "\n(run `kestrel-lab book links --fix PAGE`)"


# The package owns "a model to run on" (kestrel_lab.models): a notebook asks it, never defines its own.
OWNED_BY_MODELS = re.compile(r"^\s*def (default_vqf|evict)\(", re.M)


@pytest.mark.parametrize("nb_id", sorted(NOTEBOOKS))
def test_notebook_defines_no_model_factory(nb_id):
    nb = nbformat.read(REPO_ROOT / NOTEBOOKS[nb_id], as_version=4)
    found = [m.group(1) for c in nb.cells if c.cell_type == "code" for m in OWNED_BY_MODELS.finditer(c.source)]
    assert not found, (f"{nb_id} defines {', '.join(found)}: use kestrel_lab.models.default_bench_vqf "
                       f"/ kestrel_lab.models.evict")
