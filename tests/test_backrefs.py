"""Back-references that cannot lie: a docstring's "Taught in dayDD_P" names a part of the syllabus,
and a written part's notebook really imports or names that module; every ``# kestrel_lab.x.y``
comment in a notebook (the book's "this cell calls …" convention) resolves to a real definition."""
import importlib
import re
from functools import lru_cache

import pytest

from kestrel_lab import syllabus
from kestrel_lab.book.cache import Project, notebook_code
from kestrel_lab.imports import imported_modules
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


@lru_cache(maxsize=None)
def _imports_of(code: str) -> frozenset[str]:
    return frozenset(imported_modules(code, PROJECT.package) | _imported_from(code))


@lru_cache(maxsize=None)
def _commands_of(module: str) -> tuple[str, ...]:
    return tuple(_commands(module))


def _uses(code: str, module: str) -> bool:
    """The notebook imports the module (or a name from it, also re-exported), names it in full, or —
    for a command module — runs one of its commands (``kestrel-lab NAME`` or ``cli.main(["NAME"``)."""
    if module in _imports_of(code) or re.search(rf"\b{re.escape(module)}\b", code):
        return True
    return any(re.search(rf"kestrel-lab {c}\b|main\(\[\s*[\"']{c}[\"']", code) for c in _commands_of(module))


def _owners(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of every function and class whose docstring is in ``source``: a
    "Taught in" inside one is a claim about that object, not just its module."""
    import ast

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and ast.get_docstring(node):
            doc = node.body[0]
            name = node.name
            if name == "__init__":
                continue                       # a constructor's claim is its class's: the class docstring says it
            out.append((doc.lineno, doc.end_lineno, name))
    return out


def _back_references():
    """(module, line, part id, object name or None) of every "Taught in" in the package."""
    for module, path in PROJECT.modules().items():
        source = path.read_text(encoding="utf-8")
        owners = _owners(source)
        for m in TAUGHT.finditer(source):
            line = source.count("\n", 0, m.start()) + 1
            inside = [o for o in owners if o[0] <= line <= o[1]]
            obj = min(inside, key=lambda o: o[1] - o[0])[2] if inside else None
            for pid in PART_ID.findall(m.group(1)):
                yield module, line, pid, obj


REFS = list(_back_references())


def test_there_are_back_references():
    assert len(REFS) > 200


def _definitions():
    """Every function, class, method and module-level constant of the package: {(module, name): the names
    its body or value refers to}. Methods are keyed by their own name; a class refers to what its methods
    refer to; a table (``BOUNDS = (Bound(…), …)``) to what builds it."""
    import ast

    def refs(node) -> set[str]:
        return ({n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)})

    defs: dict[tuple[str, str], set[str]] = {}
    for module, path in PROJECT.modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs.setdefault((module, node.name), set()).update(refs(node) - {node.name})
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in (t for t in targets if isinstance(t, ast.Name)):
                    defs.setdefault((module, t.id), set()).update(refs(node.value) - {t.id})
    return defs


DEFS = _definitions()
IMPORTS = {m: imported_modules(p.read_text(encoding="utf-8"), PROJECT.package) | {m}
           for m, p in PROJECT.modules().items()}


def reached(code: str) -> set[tuple[str, str]]:
    """The package objects a notebook's code reaches: those it names in a module it uses (every object of a
    command module whose command it runs), then everything they refer to, by name, in their own module or
    a module it imports (a lesson that calls ``engine_speed`` teaches the ``prompt_ids`` that calls)."""
    words = set(re.findall(r"[A-Za-z_]\w*", code))
    used = {m for m in PROJECT.modules() if _uses(code, m)}
    run = {m for m in used if _commands_of(m) and m not in _imports_of(code)}   # a command it runs
    todo = [(m, n) for (m, n) in DEFS if m in used and (n in words or m in run)]
    seen: set[tuple[str, str]] = set()
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        module = key[0]
        for name in DEFS[key]:
            todo.extend((m, name) for m in IMPORTS.get(module, ()) if (m, name) in DEFS and (m, name) not in seen)
    return seen


def taught_in_problems(refs, code_of) -> list[str]:
    """Every claim of ``refs`` that is false: a part that does not exist, or a written part whose notebook
    neither uses the module nor — for a claim made in a function's or class's docstring — reaches the
    object (``reached``)."""
    wrong, reach = [], {}
    for module, line, pid, obj in refs:
        where = f"{PROJECT.modules()[module].relative_to(REPO_ROOT)}:{line}"
        if pid not in PARTS:
            wrong.append(f"{where}: {pid} is not a part of the syllabus")
        elif not PARTS[pid].written:
            continue
        elif not _uses(code_of(pid), module):
            wrong.append(f"{where}: says 'Taught in {pid}', but {PARTS[pid].notebook.name} neither imports "
                         f"nor names {module}")
        elif obj is not None and (module, obj) not in reach.setdefault(pid, reached(code_of(pid))):
            wrong.append(f"{where}: {obj}'s docstring says 'Taught in {pid}', but {PARTS[pid].notebook.name} "
                         f"neither calls {obj} nor anything that does")
    return wrong


def test_every_taught_in_names_a_part_that_teaches_the_module_and_the_object():
    wrong = taught_in_problems(REFS, CODE.get)
    assert not wrong, "\n".join(wrong)


def test_a_claim_about_an_object_the_lesson_never_uses_is_caught():
    """A function's "Taught in" is checked against the function, not only its module: a lesson that
    imports the module but never calls the function does not teach it."""
    module = "kestrel_lab.quant"
    lesson = next(pid for mod, _, pid, obj in REFS if mod == module and obj is None)
    fake = [(module, 1, lesson, "a_function_no_lesson_calls")]
    assert taught_in_problems(fake, CODE.get) and not taught_in_problems([(module, 1, lesson, None)], CODE.get)


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


def test_every_builds_entry_of_the_syllabus_is_a_module_the_lesson_uses():
    """data/syllabus.tsv's ``builds`` column names modules (``kernels.ops, roofline``) or says ``—``: a module
    that moves or is renamed must move here too, and the lesson's own code uses it."""
    wrong = []
    for p in PARTS.values():
        for name in p.builds.split(", "):
            module = f"{PROJECT.package}.{name}"
            if name == "—":
                continue
            if module not in PROJECT.modules() and f"{module}.__init__" not in PROJECT.modules():
                wrong.append(f"{p.id}: {name} is no module of the package")
            elif p.written and not _uses(CODE[p.id], module):
                wrong.append(f"{p.id}: its notebook never uses {module}")
    assert not wrong, "\n".join(wrong)
