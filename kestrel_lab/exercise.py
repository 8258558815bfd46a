"""Laptop-checkable exercises that keep the book build green and a student's wrong answer visible.

The convention (book/contributing.md, 「练习的写法」):

1. a **skeleton** cell the student fills in; until then it raises ``NotImplementedError``::

       def my_chain_offsets(sizes, n_entries):
           raise NotImplementedError("练习 A1：在这里写你的实现")

2. a **reference** solution in a cell tagged ``hide-input`` (folded in the book, below the skeleton);
3. a **checking** cell: ``exercise.check("A1", my_chain_offsets, ref_chain_offsets, test)`` where
   ``test(fn)`` calls the function and asserts against the package or a known value.

``check`` runs ``test`` on the student's function when it is implemented and on the reference
otherwise, and prints which one it checked. So every build executes every check (on the reference),
and in a student's own run a wrong answer raises ``AssertionError`` right there. Taught in day01_3.
"""
from __future__ import annotations

from typing import Any, Callable

STUDENT = "你的实现"
REFERENCE = "参考答案"


class ExerciseResult(str):
    """Which function was checked: ``STUDENT`` or ``REFERENCE`` (a str, so it prints plainly)."""


def check(label: str, student: Callable, reference: Callable, test: Callable[[Callable], Any]) -> ExerciseResult:
    """Run ``test`` on ``student`` if it is implemented, else on ``reference``; print which one passed.

    A ``NotImplementedError`` raised by the student's function means "not done yet": the check then
    runs on the reference solution so the build still proves the check itself works. Any other
    failure of the student's function (a wrong value, an exception) propagates — the student sees it.
    """
    try:
        value = test(student)
    except NotImplementedError:  # the skeleton's own error: the student has not started yet
        pass
    else:
        _report(label, STUDENT, value)
        return ExerciseResult(STUDENT)
    value = test(reference)
    _report(label, REFERENCE, value)
    print(f"  （{label}：你的函数还会抛出 NotImplementedError；写好后重新运行本单元，检查的就是你的实现。）")
    return ExerciseResult(REFERENCE)


def _report(label: str, who: str, value: Any) -> None:
    tail = "" if value is None else f"：{value}"
    print(f"✔ 练习 {label} 检查通过，检查的是{who}{tail}")
