"""Laptop-checkable exercises that keep the book build green and a student's wrong answer visible.

The convention (book/contributing.md, 「练习的写法」):

1. a **skeleton** cell the student fills in; until then it raises ``NotImplementedError``::

       def my_chain_offsets(sizes, data_offset):
           raise NotImplementedError("练习 A1：在这里写你的实现")

2. a **reference** solution in a cell tagged ``hide-input`` (folded in the book, below the skeleton);
3. a **checking** cell: ``exercise.check("A1", my_chain_offsets, ref_chain_offsets, test)`` where
   ``test(fn)`` calls the function and asserts against the package or a known value.

``check`` runs ``test`` on the student's function when it is implemented and on the reference
otherwise, and prints which one it checked. So every build executes every check (on the reference),
and in a student's own run a wrong answer raises ``AssertionError`` right there.

An exercise that is a **piece of the student's own engine** names it: ``check("A1", my_rmsnorm,
ref_rmsnorm, test, piece="layers.rmsnorm")``. When a student workspace is configured (``kestrel_lab.seam``:
``KESTREL_STUDENT`` or the file ``kestrel-lab student init`` writes) and its ``mykestrel/layers.py``
has ``rmsnorm`` written, the check runs on *that* function instead of the notebook's skeleton — the
student writes the piece once, in their package, and every lesson that checks it checks the same
code. In the student notebooks (``kestrel-lab student notebooks``) the reference cells are gone and
``reference`` is ``None``: an unwritten exercise then says so instead of checking the answer.
Taught in day01_3.
"""
from __future__ import annotations

from typing import Any, Callable

STUDENT = "你的实现"
WORKSPACE = "你的包里的实现"
REFERENCE = "参考答案"
NOT_STARTED = "还没写"


class ExerciseResult(str):
    """Which function was checked: ``STUDENT``, ``WORKSPACE``, ``REFERENCE`` or ``NOT_STARTED`` (a str, so it
    prints plainly)."""


def _from_workspace(piece: str | None):
    """The configured workspace's function for ``piece`` (None: no piece, no workspace, or still a skeleton)."""
    if piece is None:
        return None
    from kestrel_lab import seam

    if piece not in seam.BY_KEY:
        raise KeyError(f"exercise piece {piece!r} is not one of kestrel_lab.seam.PIECES")
    ws = seam.workspace()
    if ws is None:
        return None
    fn = ws.function(piece)
    return None if fn is None or seam.is_skeleton(fn) else fn


def check(label: str, student: Callable, reference: Callable | None, test: Callable[[Callable], Any],
          piece: str | None = None) -> ExerciseResult:
    """Run ``test`` on the student's function if it is implemented, else on ``reference``; print which one passed.

    With ``piece`` and a configured workspace that has written it, the workspace's function is the one
    tested (``WORKSPACE``). A ``NotImplementedError`` raised by the student's function means "not done
    yet": the check then runs on the reference solution so the build still proves the check itself
    works (without a reference it reports ``NOT_STARTED``). Any other failure of the student's function
    (a wrong value, an exception) propagates — the student sees it.
    """
    mine = _from_workspace(piece)
    if mine is not None:
        value = test(mine)
        _report(label, f"{WORKSPACE}（{piece}）", value)
        return ExerciseResult(WORKSPACE)
    try:
        value = test(student)
    except NotImplementedError:  # the skeleton's own error: the student has not started yet
        pass
    else:
        _report(label, STUDENT, value)
        return ExerciseResult(STUDENT)
    where = f"在包里的 {piece}（kestrel-lab student init）或" if piece else ""
    if reference is None:
        print(f"… 练习 {label}：还没写。{where}在上面的单元里写好，再运行本单元。")
        return ExerciseResult(NOT_STARTED)
    value = test(reference)
    _report(label, REFERENCE, value)
    print(f"  （{label}：你的函数还会抛出 NotImplementedError；{where}写好后重新运行本单元，检查的就是你的实现。）")
    return ExerciseResult(REFERENCE)


def _report(label: str, who: str, value: Any) -> None:
    tail = "" if value is None else f"：{value}"
    print(f"✔ 练习 {label} 检查通过，检查的是{who}{tail}")
