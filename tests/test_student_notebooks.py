"""``kestrel-lab student notebooks``: the lessons without their answers, pointed at the student's workspace."""
from __future__ import annotations

import re

import nbformat
import pytest

from kestrel_lab import cli, syllabus
from kestrel_lab.paths import REPO_ROOT
from kestrel_lab.student import notebooks as S
from kestrel_lab.student.workspace import init

LESSONS = ["day08_1", "day14_3", "day16_3", "day28_2"]   # day28_2 links to book/rerun.md
BOOK = "https://book.example/"


@pytest.fixture
def ws(tmp_path, monkeypatch):
    root = tmp_path / "ws"
    init(root, write_config=False)
    monkeypatch.setenv("KESTREL_STUDENT", str(root))
    return root.resolve()


def _nb(path):
    return nbformat.read(path, as_version=4)


def _source(nb_id):
    return _nb(REPO_ROOT / syllabus.find_notebooks()[nb_id])


def _target(out, nb_id):
    return out / syllabus.find_notebooks()[nb_id].relative_to("notebooks")


def test_the_lessons_lose_their_answers_and_keep_their_checks(ws, tmp_path):
    out = tmp_path / "out"
    report = S.write_student_notebooks(out, notebooks=LESSONS, book_url=BOOK)
    assert report.workspace == ws and sorted(report.written) == sorted(
        str(_target(out, i).relative_to(out)) for i in LESSONS)
    for nb_id in LESSONS:
        src, nb = _source(nb_id), _nb(_target(out, nb_id))
        code = [c for c in nb.cells if c.cell_type == "code"]
        text = "\n".join(c.source for c in nb.cells)
        assert not re.search(r"^def ref_\w+", text, re.M), f"{nb_id}: a reference solution is left"
        assert "{admonition} 参考答案" not in text and f"[{nb_id}]({BOOK}notebooks/" in text
        checks = [c.source for c in src.cells if "exercise.check(" in c.source]
        assert checks and checks == [c.source for c in nb.cells if "exercise.check(" in c.source]
        for name in report.references[nb_id]:
            assert re.search(rf"^{name} = None  # 参考答案在书里", text, re.M)
        assert code[0].metadata["tags"] == [S.SETUP_TAG] and f'"KESTREL_STUDENT"] = "{ws}"' in code[0].source
        assert "parameters" in code[1].metadata["tags"]
        assert [c.id for c in nb.cells if c.id != S.SETUP_ID] == [c.id for c in src.cells]
        assert all(c.outputs == [] and c.execution_count is None for c in code)
    helper = _nb(_target(out, "day14_3"))
    stub = next(c for c in helper.cells if "ref_incomplete_tail_len = None" in c.source)
    assert "SECOND" not in stub.source, "a helper only the reference used goes with it"
    assert ("../../book/rerun.md", f"{BOOK}book/rerun.html") in [(a, b) for nb, a, b in report.links
                                                                 if nb == "day28_2"]


def test_a_statement_other_cells_need_stays_with_the_stub():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("TABLE = {1: 2}\nimport re\n\ndef ref_f(x):\n    return TABLE[x]",
                                  metadata={"tags": ["hide-input"]}),
        nbformat.v4.new_code_cell("def my_f(x):\n    raise NotImplementedError\n\nexercise.check('A1', my_f, ref_f, "
                                  "lambda fn: fn(1))\nprint(TABLE)")])
    assert S.reference_names(nb) == {"ref_f"}
    assert S.reference_cells(nb, {"ref_f"}) == [(0, ["ref_f"], ["TABLE = {1: 2}"])]


def test_answer_blocks_of_either_fence_become_one_pointer():
    text = ("问题。\n\n```{admonition} 参考答案\n:class: dropdown\n答案一\n```\n\n"
            ":::{admonition} 参考答案（A2）\n:class: dropdown\n答案二\n:::\n\n```{admonition} 注意\n留下\n```")
    out, n = S.strip_answers(text, "POINTER")
    assert n == 2 and out == "问题。\n\nPOINTER\n\n```{admonition} 注意\n留下\n```"


def test_links_work_from_the_copy_or_go_to_the_book():
    lesson = S._Lesson("day08_1", syllabus.find_notebooks()["day08_1"], BOOK,
                       {"notebooks/day09/day09_1_rope_idea.ipynb"})
    text = ("[a](../day09/day09_1_rope_idea.ipynb) [b](../day10/day10_1_single_head_attention.ipynb#x) "
            "[c](../../book/formats/vqf.md) `[d](../../book/rerun.md)` [e](https://x.org/)\n"
            "```python\n[f](../../book/rerun.md)\n```")
    out, changed = S.rewrite_links(text, lesson)
    assert out == ("[a](../day09/day09_1_rope_idea.ipynb) "
                   f"[b]({BOOK}notebooks/day10/day10_1_single_head_attention.html#x) "
                   f"[c]({BOOK}book/formats/vqf.html) `[d](../../book/rerun.md)` [e](https://x.org/)\n"
                   "```python\n[f](../../book/rerun.md)\n```")
    assert len(changed) == 2


def test_a_second_run_never_overwrites_what_the_student_changed(ws, tmp_path):
    out = tmp_path / "out"
    S.write_student_notebooks(out, notebooks=["day08_1", "day16_3"])
    again = S.write_student_notebooks(out, notebooks=["day08_1", "day16_3"])
    assert not again.written and len(again.unchanged) == 2
    mine = _target(out, "day08_1")
    nb = _nb(mine)
    skeleton = next(c for c in nb.cells if "def my_rmsnorm" in c.source)
    skeleton.source = skeleton.source.replace('raise NotImplementedError("练习 A1：在这里写你的实现")', "return x")
    nbformat.write(nb, mine)
    edited = mine.read_bytes()
    other = tmp_path / "ws2"
    init(other, write_config=False)
    third = S.write_student_notebooks(out, workspace=other, notebooks=["day08_1", "day16_3"])
    new = mine.with_name(mine.name.replace(".ipynb", ".new.ipynb"))
    assert mine.read_bytes() == edited and new.exists() and str(other.resolve()) in new.read_text(encoding="utf-8")
    assert third.kept == [(str(mine.relative_to(out)), str(new.relative_to(out)))]
    assert third.written == [str(_target(out, "day16_3").relative_to(out))]   # untouched: refreshed
    assert "kept day08" in third.summary()


def test_the_command(ws, tmp_path, capsys, monkeypatch):
    assert cli.main(["student", "notebooks", str(tmp_path / "o"), "--days", "8", "--book-url", BOOK]) == 0
    assert "3 written" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "o" / "day08").iterdir()) == sorted(
        p.name for p in (REPO_ROOT / "notebooks" / "day08").glob("*.ipynb"))
    monkeypatch.setenv("KESTREL_STUDENT", "off")
    assert cli.main(["student", "notebooks"]) == 1
    assert "student init" in capsys.readouterr().out


def test_a_converted_lesson_runs_and_says_not_started(ws, tmp_path, monkeypatch):
    """The student's copy of day08_1 runs top to bottom in a kernel, and its check cell says 「还没写」."""
    from nbclient import NotebookClient

    from kestrel_lab import measure

    monkeypatch.setenv(measure.STAGE_ENV, str(tmp_path / "stage"))   # the Recorder writes there, not data/
    monkeypatch.setenv("KESTREL_STUDENT", "off")                     # the setup cell must turn it on
    monkeypatch.delenv("MPLBACKEND", raising=False)
    out = tmp_path / "out"
    S.write_student_notebooks(out, workspace=ws, notebooks=["day08_1"])
    path = _target(out, "day08_1")
    nb = _nb(path)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()

    def printed(cell):
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")

    assert str(ws) in printed(nb.cells[[c.id for c in nb.cells].index(S.SETUP_ID)])
    check = next(c for c in nb.cells if "exercise.check(" in c.source)
    assert "还没写" in printed(check), printed(check)
