"""The lessons' reference solutions of the student's pieces, as workspace code.

Every piece of ``kestrel_lab.seam.PIECES`` is the exercise of its lesson. The lesson's check cell names it,
``exercise.check("A1", my_rmsnorm, ref_rmsnorm, test_rmsnorm, piece="layers.rmsnorm")``, and the cell tagged
``hide-input`` that defines ``ref_rmsnorm`` runs alone: numpy as ``np``, the standard library and
``cryptography`` imported inside it, and helpers of its own (named ``_<piece name>_…``, so two pieces of one
module never collide). ``exercises`` finds those cells, ``reference_sources`` gives each one with
``ref_<name>`` renamed ``<name>``, and ``fill`` writes them into a workspace made by ``student init`` — a
workspace whose every piece is the book's answer, which ``kestrel-lab student check`` must pass.
``tests/test_student_solutions.py`` holds the lessons to this.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kestrel_lab import seam
from kestrel_lab.paths import REPO_ROOT

HIDE = "hide-input"


@dataclass(frozen=True)
class PieceExercise:
    """One lesson exercise that is a piece: its check call and the folded cell holding its reference."""

    key: str              # the piece, ``module.name``
    notebook: Path        # the lesson's notebook
    label: str            # the exercise's label ("A1")
    student: str          # the skeleton's name (``my_<name>``)
    reference: str        # the reference's name (``ref_<name>``)
    test: str             # the test function's name
    check_cell: int       # index of the cell that calls exercise.check
    reference_cell: int   # index of the hide-input cell that defines the reference
    source: str           # that cell's source

    def workspace_source(self) -> str:
        """The reference cell with ``ref_<name>`` renamed to the piece's function name."""
        name = seam.BY_KEY[self.key].name
        return re.sub(rf"\b{re.escape(self.reference)}\b", name, self.source).strip() + "\n"


def _cells(notebook: Path) -> list:
    import nbformat

    return nbformat.read(notebook, as_version=4).cells


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:                  # a cell with IPython syntax (magics) holds no exercise
        return None


def _check_calls(tree: ast.Module):
    """The ``exercise.check(label, my_fn, ref_fn, test, piece="…")`` calls of a cell."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "check"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "exercise"):
            continue
        piece = next((k.value for k in node.keywords if k.arg == "piece"), None)
        if not isinstance(piece, ast.Constant) or len(node.args) < 4:
            continue
        label, student, ref, test = node.args[:4]
        names = [a.id if isinstance(a, ast.Name) else None for a in (student, ref, test)]
        yield (piece.value, label.value if isinstance(label, ast.Constant) else None, *names)


def _defines(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def exercises(notebook: str | os.PathLike) -> list[PieceExercise]:
    """Every piece exercise of ``notebook``: each ``exercise.check(…, piece=…)`` with the hide-input cell that
    defines the reference it names (``reference_cell`` -1 and ``source`` empty when no such cell exists)."""
    notebook = Path(notebook)
    cells = _cells(notebook)
    trees = [_parse(c.source) if c.cell_type == "code" else None for c in cells]
    found = []
    for i, tree in enumerate(trees):
        for key, label, student, ref, test in (_check_calls(tree) if tree is not None else ()):
            where = [j for j, t in enumerate(trees) if t is not None and ref and _defines(t, ref)
                     and HIDE in cells[j].metadata.get("tags", [])]
            j = where[-1] if where else -1
            found.append(PieceExercise(key, notebook, label, student, ref, test, i, j,
                                       cells[j].source if j >= 0 else ""))
    return found


def lesson_notebook(key: str, root: Path = REPO_ROOT) -> Path:
    """The notebook of the lesson that teaches piece ``key``."""
    from kestrel_lab import syllabus

    lesson = seam.BY_KEY[key].lesson
    found = syllabus.find_notebooks(root)
    if lesson not in found:
        raise LookupError(f"piece {key}: its lesson {lesson} has no notebook")
    return root / found[lesson]


def exercise_of(key: str, root: Path = REPO_ROOT) -> PieceExercise:
    """The one exercise of ``key``'s lesson that checks piece ``key`` (LookupError: none, several, no reference)."""
    path = lesson_notebook(key, root)
    mine = [e for e in exercises(path) if e.key == key]
    if len(mine) != 1:
        raise LookupError(f"piece {key}: {path.name} has {len(mine)} exercise.check(…, piece={key!r}) cells, "
                          f"expected exactly one")
    if mine[0].reference_cell < 0:
        raise LookupError(f"piece {key}: {path.name} has no {HIDE} cell that defines {mine[0].reference}")
    return mine[0]


def reference_sources(root: Path = REPO_ROOT) -> dict[str, str]:
    """{piece key: the lesson's reference cell with ``ref_<name>`` renamed ``<name>``}, for every piece."""
    cache: dict[Path, list[PieceExercise]] = {}
    out = {}
    for piece in seam.PIECES:
        path = lesson_notebook(piece.key, root)
        mine = [e for e in cache.setdefault(path, exercises(path)) if e.key == piece.key]
        if len(mine) != 1 or mine[0].reference_cell < 0:
            exercise_of(piece.key, root)          # raises, saying what is wrong
        out[piece.key] = mine[0].workspace_source()
    return out


def module_text(module: str, sources: dict[str, str]) -> str:
    """A workspace module holding the reference solutions of ``module``'s pieces."""
    head = (f'"""{seam.PACKAGE}.{module}: the lessons\' reference solutions '
            f'(written by kestrel_lab.student.solutions.fill)."""\nimport numpy as np  # noqa: F401\n')
    return head + "".join("\n\n" + sources[p.key] for p in seam.PIECES if p.module == module)


def fill(workspace_root: str | os.PathLike, root: Path = REPO_ROOT) -> list[Path]:
    """Make (or complete) the workspace at ``workspace_root`` with ``student init`` (no config file) and rewrite
    each module of it as the reference solutions of its pieces. Returns the module files written. Meant for a
    throwaway workspace (tests): what a student wrote there is replaced."""
    from kestrel_lab.atomic import atomic_write
    from kestrel_lab.student import workspace

    rep = workspace.init(workspace_root, write_config=False)
    sources = reference_sources(root)
    written = []
    for module in seam.MODULES:
        path = rep.root / seam.PACKAGE / f"{module}.py"
        with atomic_write(path, "w") as fh:
            fh.write(module_text(module, sources))
        written.append(path)
    return written
