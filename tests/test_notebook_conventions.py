"""Every notebook follows book/contributing.md, and the generated book sources are up to date."""
import ast
import re

import nbformat
import pytest

from kestrel_lab import syllabus
from kestrel_lab.paths import REPO_ROOT

NOTEBOOKS = syllabus.find_notebooks()
CJK = re.compile(r"[\u4e00-\u9fff]")


def test_syllabus_has_90_parts_in_order():
    parts = syllabus.load_parts()
    assert [p.id for p in parts] == [f"day{d:02d}_{k}" for d in range(1, 31) for k in (1, 2, 3)]
    assert {p.id for p in parts if p.seed} == {"day16_3", "day18_2"}


def test_generated_sources_are_current():
    assert (REPO_ROOT / "_toc.yml").read_text(encoding="utf-8") == syllabus.toc_yaml(), \
        "_toc.yml is stale: run `kestrel-lab book sources`"
    assert (REPO_ROOT / "book" / "syllabus.md").read_text(encoding="utf-8") == syllabus.syllabus_markdown(), \
        "book/syllabus.md is stale: run `kestrel-lab book sources`"


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
