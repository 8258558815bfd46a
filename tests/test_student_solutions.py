"""Every piece of the student's engine is one exercise of its lesson, and its folded reference runs alone.

``kestrel_lab.seam.PIECES`` is the contract; each lesson's ``exercise.check(…, piece="module.name")`` names the
skeleton ``my_<name>``, the reference ``ref_<name>`` and the test ``test_<name>``. The hide-input cell defining
``ref_<name>`` must run in a namespace holding only numpy as ``np`` (``kestrel_lab.student.solutions`` copies
it into a workspace), and ``solutions.fill`` turns a fresh workspace into one whose every piece is written.
"""
import ast
import builtins
import dis
import types

import nbformat
import numpy
import pytest

from kestrel_lab import seam, syllabus
from kestrel_lab.paths import REPO_ROOT
from kestrel_lab.student import solutions

KEYS = [p.key for p in seam.PIECES]


def _free_globals(ns: dict) -> set[tuple[str, str]]:
    """(function, name) of every global a function of ``ns`` loads that neither ``ns`` nor builtins define."""
    bad = set()
    for fname, obj in ns.items():
        if not isinstance(obj, types.FunctionType):
            continue
        todo = [obj.__code__]
        while todo:
            code = todo.pop()
            for ins in dis.get_instructions(code):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval not in ns \
                        and not hasattr(builtins, ins.argval):
                    bad.add((fname, ins.argval))
            todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return bad


def _params(args: ast.arguments) -> tuple:
    """A signature without annotations: parameter names and defaults."""
    return ([a.arg for a in args.posonlyargs + args.args], [ast.unparse(d) for d in args.defaults],
            args.vararg and args.vararg.arg, [a.arg for a in args.kwonlyargs], args.kwarg and args.kwarg.arg)


def _function(source: str, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name), None)


@pytest.mark.parametrize("key", KEYS)
def test_each_piece_is_one_exercise_of_its_lesson_whose_reference_runs_alone(key):
    piece = seam.BY_KEY[key]
    ex = solutions.exercise_of(key)                  # exactly one check with piece=key in its lesson, with a reference
    assert (ex.student, ex.reference, ex.test) == (f"my_{piece.name}", f"ref_{piece.name}", f"test_{piece.name}")
    cells = nbformat.read(ex.notebook, as_version=4).cells
    assert "hide-input" in cells[ex.reference_cell].metadata.get("tags", [])
    ns = {"np": numpy}
    exec(compile(ex.source, f"{ex.notebook.name} cell {ex.reference_cell}", "exec"), ns)
    assert callable(ns.get(ex.reference)), f"{ex.notebook.name}: the reference cell does not define {ex.reference}"
    assert not _free_globals(ns), (f"{ex.notebook.name} cell {ex.reference_cell} uses notebook globals: "
                                   f"{sorted(_free_globals(ns))} — copy them into the cell (named _{piece.name}_…)")
    want = _params(ast.parse(f"def f({piece.signature}): pass").body[0].args)
    assert _params(_function(ex.source, ex.reference).args) == want, f"{ex.reference} is not ({piece.signature})"
    skeletons = [c.source for c in cells if c.cell_type == "code" and _function(c.source, ex.student)]
    assert len(skeletons) == 1, f"{ex.notebook.name}: {len(skeletons)} cells define {ex.student}"
    assert _params(_function(skeletons[0], ex.student).args) == want, f"{ex.student} is not ({piece.signature})"
    assert f'raise NotImplementedError("练习 {ex.label}' in skeletons[0]


def test_every_piece_named_in_the_book_exists():
    for nb_id, path in syllabus.find_notebooks().items():
        for ex in solutions.exercises(REPO_ROOT / path):
            assert ex.key in seam.BY_KEY, f"{nb_id}: exercise {ex.label} names piece {ex.key!r}, not in seam.PIECES"


def test_reference_sources_are_the_pieces_functions():
    sources = solutions.reference_sources()
    assert list(sources) == KEYS
    for key, src in sources.items():
        name = seam.BY_KEY[key].name
        assert _function(src, name) is not None and f"ref_{name}" not in src, key


def test_exercises_reports_a_reference_outside_a_folded_cell(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def ref_route(logits, k, norm):\n    return 0"),
                nbformat.v4.new_code_cell('exercise.check("A1", my_route, ref_route, test_route, piece="moe.route")')]
    nbformat.write(nb, tmp_path / "x.ipynb")
    (ex,) = solutions.exercises(tmp_path / "x.ipynb")
    assert (ex.key, ex.label, ex.reference, ex.reference_cell, ex.source) == ("moe.route", "A1", "ref_route", -1, "")
    nb.cells[0].metadata["tags"] = ["hide-input"]
    nbformat.write(nb, tmp_path / "x.ipynb")
    assert solutions.exercises(tmp_path / "x.ipynb")[0].reference_cell == 0


def test_fill_writes_every_piece_into_a_workspace(tmp_path):
    root = tmp_path / "ws"
    written = solutions.fill(root)
    assert {p.stem for p in written} == set(seam.MODULES)
    ws = seam.workspace(root)
    assert sorted(ws.implemented()) == sorted(KEYS)
    assert ws.function("quant.quantize_q8_0")(numpy.zeros(32, numpy.float32)) == bytes(34)
    assert ws.function("vqf.chain_offsets")([10, 100], 4096) == ([4096, 4160], 4260)
