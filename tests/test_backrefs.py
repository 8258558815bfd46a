"""Back-references that cannot lie: a docstring's "Taught in dayDD_P" names a part of the syllabus,
and a written part's notebook really imports or names that module; every ``# kestrel_lab.x.y``
comment in a notebook (the book's "this cell calls …" convention) resolves to a real definition."""
import importlib
import re

import pytest

from kestrel_lab import syllabus
from kestrel_lab.book.cache import Project, imported_modules, notebook_code
from kestrel_lab.paths import REPO_ROOT

PROJECT = Project(REPO_ROOT)
PARTS = {p.id: p for p in syllabus.load_parts()}
TAUGHT = re.compile(r"[Tt]aught in ([^.]*)")
PART_ID = re.compile(r"day\d\d_[1-3]")
COMMENT_REF = re.compile(r"#.*?\b(kestrel_lab(?:\.\w+)+)")


CODE = {pid: notebook_code(REPO_ROOT / p.notebook) for pid, p in PARTS.items() if p.written}


def _imported_from(code: str) -> set[str]:
    """Modules whose definitions the notebook imports, also through a package's re-export
    (``from kestrel_lab.engine import Qwen3Engine`` uses ``kestrel_lab.engine.model``)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PROJECT.package):
            mod = importlib.import_module(node.module)
            found.add(node.module)
            for alias in node.names:
                obj = getattr(mod, alias.name, None)
                found.add(obj.__name__ if hasattr(obj, "__path__") or type(obj).__name__ == "module"
                          else getattr(obj, "__module__", node.module))
    return found


def _commands(module: str) -> list[str]:
    """The ``kestrel-lab`` sub-commands a CLI module registers (``add_parser("name"``)."""
    return re.findall(r"add_parser\(\s*\"([a-z-]+)\"", PROJECT.modules()[module].read_text(encoding="utf-8"))


def _uses(code: str, module: str) -> bool:
    """The notebook imports the module (or a name from it, also re-exported), names it in full, or —
    for a command module — runs one of its commands (``kestrel-lab NAME`` or ``cli.main(["NAME"``)."""
    if module in imported_modules(code, PROJECT.package) or module in _imported_from(code) \
            or re.search(rf"\b{re.escape(module)}\b", code):
        return True
    return any(re.search(rf"kestrel-lab {c}\b|main\(\[\s*[\"']{c}[\"']", code) for c in _commands(module))


def _back_references():
    for module, path in PROJECT.modules().items():
        source = path.read_text(encoding="utf-8")
        for m in TAUGHT.finditer(source):
            line = source.count("\n", 0, m.start()) + 1
            for pid in PART_ID.findall(m.group(1)):
                yield module, line, pid


REFS = list(_back_references())


def test_there_are_back_references():
    assert len(REFS) > 200


def test_every_taught_in_names_a_part_that_teaches_the_module():
    wrong = []
    for module, line, pid in REFS:
        where = f"{PROJECT.modules()[module].relative_to(REPO_ROOT)}:{line}"
        if pid not in PARTS:
            wrong.append(f"{where}: {pid} is not a part of the syllabus")
        elif PARTS[pid].written and not _uses(CODE[pid], module):
            wrong.append(f"{where}: says 'Taught in {pid}', but {PARTS[pid].notebook.name} neither imports "
                         f"nor names {module}")
    assert not wrong, "\n".join(wrong)


def _resolve(ref: str) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("nb_id", sorted(CODE))
def test_every_named_function_in_a_notebook_exists(nb_id):
    refs = sorted({m.group(1) for m in COMMENT_REF.finditer(CODE[nb_id])})
    missing = [r for r in refs if not _resolve(r)]
    assert not missing, f"{nb_id}: comments name what does not exist: {missing}"
