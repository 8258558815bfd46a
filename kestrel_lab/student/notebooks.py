"""``kestrel-lab student notebooks [DIR]``: the lessons without their reference solutions, pointed at the workspace.

Each lesson is copied to ``DIR/dayDD/`` (the layout of ``notebooks/``, so links between lessons still work)
with every reference-solution cell — a cell tagged ``hide-input`` defining a ``ref_<name>`` function that an
``exercise.check(…)`` call takes as its reference — replaced by ``ref_<name> = None`` (the check then says
「还没写」 until the student writes the piece), every 「参考答案」 admonition replaced by a pointer to the book's
page of the lesson, outputs cleared, and a first code cell (tag ``student-setup``) that points
``KESTREL_STUDENT`` at the workspace. Cell ids, metadata and the parameters cell are kept. A notebook the
student has changed since this command wrote it is never overwritten: the new copy goes beside it as
``<name>.new.ipynb`` (the hashes of what was written are in ``DIR/.kestrel-student-notebooks.json``).

nbgrader's ``ClearSolutions`` / ``generate_assignment`` clears ``BEGIN SOLUTION … END SOLUTION`` regions of
cells its own metadata marks, inside its course layout; our solutions are whole ``ref_`` cells found from the
check calls and our answers MyST admonitions, and jupytext converts formats without touching content — so the
surgery is done here on nbformat, the well-kept library for notebook I/O. The student page (book/student.md)
explains where they go.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from kestrel_lab import __version__, seam, syllabus
from kestrel_lab.atomic import atomic_write, write_json
from kestrel_lab.paths import REPO_ROOT

MANIFEST = ".kestrel-student-notebooks.json"
SETUP_TAG = "student-setup"
SETUP_ID = "student-setup"
HIDDEN_TAG = "hide-input"
ANSWER_TITLE = "参考答案"
_FENCE_OPEN = re.compile(r"^(?P<fence>`{3,}|:{3,})\{admonition\}[ \t]*(?P<title>.*)$")
_MD_LINK = re.compile(r"(?P<head>!?\[[^\]\n]*\]\()(?P<target>[^)\s]+)(?P<tail>\))")
_HTML_LINK = re.compile(r"(?P<head>\b(?:href|src)=\")(?P<target>[^\"]+)(?P<tail>\")")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_CODE_FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")


def default_book_url(root: Path = REPO_ROOT) -> str:
    """The built book of this checkout (``make book`` writes ``_build/html/``), as a URL ending in ``/``."""
    return (root / "_build" / "html").resolve().as_uri() + "/"


@dataclass
class StudentNotebooksReport:
    """What ``write_student_notebooks`` did, notebook by notebook."""

    out_dir: Path
    workspace: Path | None
    written: list[str] = field(default_factory=list)        # new or refreshed (the student had not changed it)
    unchanged: list[str] = field(default_factory=list)      # already what would be written
    kept: list[tuple[str, str]] = field(default_factory=list)  # (the student's notebook, the .new.ipynb beside it)
    references: dict[str, list[str]] = field(default_factory=dict)   # notebook -> ref_ names replaced
    answers: dict[str, int] = field(default_factory=dict)            # notebook -> 参考答案 blocks removed
    links: list[tuple[str, str, str]] = field(default_factory=list)  # (notebook, old target, new target)
    kept_statements: list[tuple[str, str]] = field(default_factory=list)  # (notebook, a statement kept)

    def summary(self) -> str:
        n_ref = sum(len(v) for v in self.references.values())
        lines = [f"student notebooks in {self.out_dir}: {len(self.written)} written, {len(self.unchanged)} unchanged, "
                 f"{len(self.kept)} kept as you changed them; {n_ref} reference cells and "
                 f"{sum(self.answers.values())} 参考答案 blocks removed, {len(self.links)} links rewritten"]
        lines += [f"  kept {mine} (you changed it); the new copy is {new}" for mine, new in self.kept]
        lines += [f"  {nb}: kept `{stmt}` from a reference cell (other cells use it)"
                  for nb, stmt in self.kept_statements]
        if self.workspace is not None:
            lines.append(f"  their exercise checks use {self.workspace / seam.PACKAGE}/ (KESTREL_STUDENT in the "
                         "first code cell)")
        else:
            lines.append("  no workspace: `kestrel-lab student init`, then run this again to point them at it")
        return "\n".join(lines)


# --------------------------------------------------------------------------- reading the cells
def _parse(source: str) -> ast.Module | None:
    """A code cell's syntax tree; IPython magics (``%timeit``, ``!ls``) are turned into Python first."""
    try:
        return ast.parse(source)
    except SyntaxError:
        pass
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return ast.parse(TransformerManager().transform_cell(source))
    except (ImportError, SyntaxError):
        return None


def _is_check(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "check"
            and ((isinstance(f.value, ast.Name) and f.value.id == "exercise")
                 or (isinstance(f.value, ast.Attribute) and f.value.attr == "exercise")))


def reference_names(nb) -> set[str]:
    """The names passed as the reference (third argument, or ``reference=``) of every ``exercise.check`` call."""
    names = set()
    for cell in nb.cells:
        tree = _parse(cell.source) if cell.cell_type == "code" else None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call) and _is_check(node):
                ref = node.args[2] if len(node.args) > 2 else next(
                    (k.value for k in node.keywords if k.arg == "reference"), None)
                if isinstance(ref, ast.Name) and ref.id.startswith("ref_"):
                    names.add(ref.id)
    return names


def _defined(stmt: ast.stmt) -> set[str]:
    """Top-level names a statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}


def _loaded(nb, skip) -> set[str]:
    """Names read by the notebook's code cells other than ``skip``."""
    out = set()
    for cell in nb.cells:
        tree = _parse(cell.source) if cell.cell_type == "code" and cell is not skip else None
        out |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} if tree else set()
    return out


def reference_cells(nb, refs: set[str]) -> list[tuple[int, list[str], list[str]]]:
    """(cell index, the ref_ functions it defines, the statements other cells need) of each reference cell:
    a code cell tagged ``hide-input`` with a top-level ``def ref_<name>`` among ``refs``."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or HIDDEN_TAG not in cell.metadata.get("tags", []):
            continue
        tree = _parse(cell.source)
        if tree is None:
            continue
        names = [s.name for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and s.name in refs]
        if not names:
            continue
        used = _loaded(nb, cell) - set(names)
        keep = [ast.get_source_segment(cell.source, s) for s in tree.body
                if not (isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name in refs)
                and _defined(s) & used]
        found.append((i, names, keep))
    return found


# --------------------------------------------------------------------------- rewriting the cells
@dataclass
class _Lesson:
    """One lesson being converted: where it comes from and goes to, and where the book shows it."""

    id: str
    source: Path        # repo-relative, notebooks/dayDD/…
    book_url: str
    present: set[str]   # repo-relative posix paths of lessons that will be in DIR

    @property
    def rel(self) -> str:                # the path under DIR
        return self.source.relative_to("notebooks").as_posix()

    @property
    def page(self) -> str:
        return self.book_url + self.source.with_suffix(".html").as_posix()


def reference_stub(name: str, lesson: _Lesson) -> str:
    return (f"{name} = None  # 参考答案在书里（折叠）：{lesson.page} ；"
            f"也在仓库的 {lesson.source.as_posix()} 里")


def answer_pointer(lesson: _Lesson) -> str:
    return (f"*参考答案不在这份学生笔记本里：见书里本篇的页面 [{lesson.id}]({lesson.page})"
            f"（折叠的「{ANSWER_TITLE}」），或仓库的 `{lesson.source.as_posix()}`。*")


def strip_answers(text: str, pointer: str) -> tuple[str, int]:
    """``text`` with each ``{admonition} 参考答案`` block (backtick or colon fence) replaced by ``pointer``
    (once per run of adjacent blocks); returns the text and how many blocks went."""
    lines, out, n, i = text.split("\n"), [], 0, 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if not m or not m.group("title").strip().startswith(ANSWER_TITLE):
            out.append(lines[i])
            i += 1
            continue
        close = re.compile(re.escape(m.group("fence")) + r"[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), len(lines) - 1)
        n += 1
        filled = [line for line in out if line.strip()]
        if filled and filled[-1] == pointer:          # the block right after another one: one pointer for both
            while not out[-1].strip():
                out.pop()
        else:
            out.append(pointer)
        i = end + 1
    return "\n".join(out), n


def _new_target(target: str, lesson: _Lesson) -> str | None:
    """Where a relative link of the lesson must point from its copy in DIR (None: it still works)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target, re.I):
        return None
    path, _, anchor = target.partition("#")
    repo_path = posixpath.normpath(posixpath.join(lesson.source.parent.as_posix(), path))
    if repo_path.startswith("../"):
        return None                                   # outside the checkout: nothing we can say
    anchor = f"#{anchor}" if anchor else ""
    if repo_path.startswith("notebooks/") and repo_path.endswith(".ipynb"):
        if repo_path in lesson.present:
            return None                               # DIR mirrors notebooks/, so the relative link works
        return lesson.book_url + repo_path[:-len(".ipynb")] + ".html" + anchor
    if repo_path.startswith("book/") and repo_path.endswith((".md", ".ipynb")):
        return lesson.book_url + repo_path.rsplit(".", 1)[0] + ".html" + anchor
    return (REPO_ROOT / repo_path).resolve().as_uri() + anchor


def _rewrite_line(line: str, lesson: _Lesson, changed: list[tuple[str, str]]) -> str:
    """Rewrite the links of one line of Markdown, leaving inline code alone."""
    pieces, last = [], 0
    for m in _INLINE_CODE.finditer(line):
        pieces += [(line[last:m.start()], True), (m.group(0), False)]
        last = m.end()
    pieces.append((line[last:], True))

    def sub(m: re.Match) -> str:
        new = _new_target(m.group("target"), lesson)
        if new is None:
            return m.group(0)
        changed.append((m.group("target"), new))
        return m.group("head") + new + m.group("tail")

    return "".join(_HTML_LINK.sub(sub, _MD_LINK.sub(sub, text)) if prose else text for text, prose in pieces)


def rewrite_links(text: str, lesson: _Lesson) -> tuple[str, list[tuple[str, str]]]:
    """Relative links of a Markdown cell made to work from ``DIR/dayDD/``: a lesson that is not in DIR and a
    page of ``book/`` become the built book's page; other files of the checkout become ``file://`` URLs.
    Links inside code (fenced blocks, inline code) are left alone."""
    changed: list[tuple[str, str]] = []
    out, fence = [], None
    for line in text.split("\n"):
        m = _CODE_FENCE.match(line)
        if fence is None and m and not m.group(2).strip().startswith("{"):
            fence = m.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            line = _rewrite_line(line, lesson, changed)
        out.append(line)
    return "\n".join(out), changed


def setup_source(workspace: Path | None) -> str:
    """The ``student-setup`` cell: point the exercise checks at the workspace, or say how to make one."""
    head = "# student-setup (written by `kestrel-lab student notebooks`): "
    if workspace is None:
        return (head + "no workspace was given, so the exercise checks\n"
                "# use the one `kestrel-lab student init` records, if any, else this notebook's own cells.\n"
                "from kestrel_lab import seam\n\n"
                "if seam.configured() is None:\n"
                "    print(\"还没有工作区：运行 `kestrel-lab student init`，练习就会检查你的 mykestrel/。\")\n")
    return (head + "the exercise checks use the functions\n"
            "# of your workspace's mykestrel/ package. Another folder: change it here (\"off\": none).\n"
            "import os\n\n"
            f"os.environ[\"KESTREL_STUDENT\"] = {json.dumps(str(workspace), ensure_ascii=False)}\n"
            "print(\"练习检查的是你的工作区：\", os.environ[\"KESTREL_STUDENT\"])\n")


def convert(nb, lesson: _Lesson, workspace: Path | None, report: StudentNotebooksReport):
    """Turn one lesson (an nbformat notebook, changed in place) into its student copy; return it."""
    refs = reference_names(nb)
    for i, names, keep in reference_cells(nb, refs):
        nb.cells[i].source = "\n".join(keep + [reference_stub(n, lesson) for n in names])
        report.references.setdefault(lesson.id, []).extend(names)
        report.kept_statements += [(lesson.id, s.splitlines()[0]) for s in keep]
    pointer = answer_pointer(lesson)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source, n = strip_answers(cell.source, pointer)
            if n:
                report.answers[lesson.id] = report.answers.get(lesson.id, 0) + n
            cell.source, changed = rewrite_links(cell.source, lesson)
            report.links += [(lesson.id, old, new) for old, new in changed]
        elif cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    setup = nbformat.v4.new_code_cell(setup_source(workspace), metadata={"tags": [SETUP_TAG]})
    setup.id = SETUP_ID
    nb.cells.insert(first_code, setup)
    nb.metadata["kestrel_lab"] = {"student_copy_of": lesson.source.as_posix(), "made_by": f"kestrel_lab {__version__}"}
    nbformat.validate(nb)
    return nb


# --------------------------------------------------------------------------- writing, never over the student
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_manifest(out_dir: Path) -> dict[str, str]:
    try:
        files = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def _place(out_dir: Path, rel: str, data: bytes, manifest: dict[str, str], report: StudentNotebooksReport) -> None:
    """Write ``data`` at ``out_dir/rel`` unless the student changed the file there since we wrote it."""
    target = out_dir / rel
    if target.exists():
        have = _sha(target.read_bytes())
        if have == _sha(data):
            manifest[rel] = have
            report.unchanged.append(rel)
            return
        if have != manifest.get(rel):
            new = target.with_name(target.name[:-len(".ipynb")] + ".new.ipynb")
            with atomic_write(new) as fh:
                fh.write(data)
            report.kept.append((rel, new.relative_to(out_dir).as_posix()))
            return
    with atomic_write(target) as fh:
        fh.write(data)
    manifest[rel] = _sha(data)
    report.written.append(rel)


def resolve_workspace(workspace: str | os.PathLike | None) -> Path | None:
    """The workspace folder the notebooks point at: ``workspace``, else the configured one, else None."""
    path = Path(workspace).expanduser().resolve() if workspace is not None else seam.configured()
    if path is not None and not (Path(path) / seam.PACKAGE).is_dir():
        raise seam.WorkspaceError(f"{path}: no {seam.PACKAGE}/ package here (make one with "
                                  f"`kestrel-lab student init {path}`)")
    return None if path is None else Path(path).resolve()


def write_student_notebooks(out_dir: str | os.PathLike | None = None, workspace: str | os.PathLike | None = None,
                            notebooks: list[str] | None = None, *, book_url: str | None = None,
                            root: Path = REPO_ROOT) -> StudentNotebooksReport:
    """Write the student copies of the lessons ``notebooks`` (ids; default: every written lesson) into
    ``out_dir`` (default ``<workspace>/notebooks``), pointed at ``workspace`` (default: the configured one)."""
    ws = resolve_workspace(workspace)
    if out_dir is None:
        if ws is None:
            raise seam.WorkspaceError("no workspace is configured: give DIR, or run `kestrel-lab student init` first")
        out_dir = ws / "notebooks"
    out_dir = Path(out_dir).expanduser().resolve()
    found = syllabus.find_notebooks(root)
    ids = list(found) if notebooks is None else list(notebooks)
    unknown = [i for i in ids if i not in found]
    if unknown:
        raise ValueError(f"no lesson notebook for {', '.join(unknown)} under {root / 'notebooks'}")
    present = {found[i].as_posix() for i in ids}
    present |= {p.as_posix() for p in found.values() if (out_dir / p.relative_to("notebooks")).exists()}
    base = book_url or default_book_url(root)
    if not re.match(r"^[a-z][a-z0-9+.-]*:", base, re.I):       # a folder: the built book copied somewhere
        base = Path(base).expanduser().resolve().as_uri()
    base = base if base.endswith("/") else base + "/"
    report = StudentNotebooksReport(out_dir, ws)
    manifest = _read_manifest(out_dir)
    for nb_id in ids:
        lesson = _Lesson(nb_id, found[nb_id], base, present)
        nb = convert(nbformat.read(root / lesson.source, as_version=4), lesson, ws, report)
        _place(out_dir, lesson.rel, (nbformat.writes(nb) + "\n").encode("utf-8"), manifest, report)
    write_json(out_dir / MANIFEST, {"made_by": f"kestrel_lab {__version__}", "workspace": str(ws) if ws else None,
                                    "files": dict(sorted(manifest.items()))})
    return report
