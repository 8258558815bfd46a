"""The capstone's engine: the workspace's pieces where written, the lessons' reference answers elsewhere.

Every piece comes from the student's workspace where it is written and from the lesson's reference answer where
it is not, each one counted as the package calls it.

``assemble`` says for every piece where its function comes from; ``Assembled.counting`` swaps them all in
and counts the calls, so the capstone's table can show which pieces a whole conversation really ran.
Taught in day30_1.
"""
from __future__ import annotations

import contextlib
import functools
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from kestrel_lab import seam

YOURS, REFERENCE = "yours", "reference"


@functools.lru_cache(maxsize=1)
def _reference_workspace() -> seam.Workspace:
    """A workspace holding the lessons' reference answers (made once per process, in a temp folder)."""
    from kestrel_lab.student import solutions

    root = Path(tempfile.mkdtemp(prefix="kestrel-reference-")) / "ws"
    solutions.fill(root)
    return seam.Workspace(root)


@dataclass
class Assembled:
    """The capstone's pieces: ``functions`` {key: function}, ``origin`` {key: YOURS or REFERENCE}, and how many
    times each was called inside ``counting``."""

    functions: dict[str, Callable]
    origin: dict[str, str]
    workspace: Path | None
    calls: Counter = field(default_factory=Counter)

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Swap every piece in for the block, each wrapped to count its calls in ``calls``."""
        def counted(key: str, fn: Callable) -> Callable:
            @functools.wraps(fn)
            def call(*args, **kwargs):
                self.calls[key] += 1
                return fn(*args, **kwargs)
            return call

        with seam.swapped({k: counted(k, fn) for k, fn in self.functions.items()}):
            yield

    def rows(self) -> list[tuple[str, str, str, int]]:
        """(piece, lesson, origin, calls) in the order of ``seam.PIECES``."""
        return [(p.key, p.lesson, self.origin[p.key], self.calls[p.key]) for p in seam.PIECES]


def assemble(workspace: seam.Workspace | None = None) -> Assembled:
    """Every piece: the workspace's function where the student has written it (no longer the skeleton), else
    the lesson's reference answer."""
    mine = workspace.implemented() if workspace is not None else {}
    ref = _reference_workspace()
    functions, origin = {}, {}
    for key in seam.BY_KEY:
        if key in mine:
            functions[key], origin[key] = mine[key], YOURS
        else:
            functions[key], origin[key] = ref.function(key), REFERENCE
    return Assembled(functions, origin, workspace.root if workspace is not None else None)
