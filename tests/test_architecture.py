"""The package's import graph has no circle: module-level and function-level imports both count.

A circle works in Python only by accident of which module is imported first, and it hides which floor
of the house a module belongs to. This test builds the graph from the sources with ``ast`` and prints
every circle it finds."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "kestrel_lab"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def module_names() -> dict[str, Path]:
    """Every module of the package, dotted name -> file (a package is its ``__init__.py``)."""
    names = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source (top level or inside a function).

    ``from a.b import c`` counts as importing ``a.b.c`` when that is a module, else ``a.b``; importing
    a submodule does not count as importing its parent packages (their ``__init__`` runs, but an
    ``__init__`` that imports nothing back cannot close a circle)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # ``import a.b.c`` of a module; names of objects fall back
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one circle's members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _path_in(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One circle through the component's first module, for the message: a -> b -> … -> a."""
    start, members = comp[0], set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    assert "kestrel_lab.cli" in graph and "kestrel_lab.paths" in graph["kestrel_lab"]
    # engine/cli.py imports the engine only inside its command functions
    assert "kestrel_lab.engine.generate" in graph["kestrel_lab.engine.cli"]


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert _path_in(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_circle_among_the_package_modules():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles in the package:\n" + "\n".join(
        f"  {' -> '.join(_path_in(graph, comp))}   (all of {', '.join(comp)})" for comp in found)


# --------------------------------------------------------------------------- floors
# The package is a house of floors. A module imports from its own floor and the floors below, never from
# above: the text engine and the vision tower stand on the kernels, the measuring tools on the engine,
# the command lines and the book on everything. The first rule that matches a module gives its floor
# (``fnmatch`` patterns on the dotted name); a module no rule names fails the test, so a new module is
# placed on purpose.
FLOORS = ("base", "formats", "kernels", "vision", "engine", "measures", "apps")
RULES = (
    ("kestrel_lab.__main__", "apps"), ("kestrel_lab.cli", "apps"), ("kestrel_lab.*.cli", "apps"),
    ("kestrel_lab.*_cli", "apps"), ("kestrel_lab.book", "apps"), ("kestrel_lab.book.*", "apps"),
    ("kestrel_lab.diagrams", "apps"), ("kestrel_lab.diagrams.*", "apps"), ("kestrel_lab.fuzz", "apps"),
    ("kestrel_lab.student", "apps"), ("kestrel_lab.student.*", "apps"),
    ("kestrel_lab.bench", "measures"), ("kestrel_lab.bench.*", "measures"), ("kestrel_lab.eval", "measures"),
    ("kestrel_lab.golden", "measures"), ("kestrel_lab.roofline", "measures"),
    ("kestrel_lab.engine", "engine"), ("kestrel_lab.engine.*", "engine"),
    ("kestrel_lab.vision", "vision"), ("kestrel_lab.vision.*", "vision"),
    ("kestrel_lab.kernels", "kernels"), ("kestrel_lab.kernels.*", "kernels"),
    ("kestrel_lab.vocab", "formats"), ("kestrel_lab.vocab.*", "formats"), ("kestrel_lab.vqf", "formats"),
    ("kestrel_lab.vqf.*", "formats"), ("kestrel_lab.config", "formats"), ("kestrel_lab.config_fields", "formats"),
    ("kestrel_lab.rope_scaling", "formats"),
    ("kestrel_lab.safetensors", "formats"), ("kestrel_lab.tiny_model", "formats"), ("kestrel_lab.convert", "formats"),
    ("kestrel_lab.models", "formats"), ("kestrel_lab.training_record", "formats"),
    ("kestrel_lab", "base"), ("kestrel_lab.paths", "base"), ("kestrel_lab.atomic", "base"),
    ("kestrel_lab.limits", "base"),
    ("kestrel_lab.quant", "base"), ("kestrel_lab.memory_check", "base"), ("kestrel_lab.procfs", "base"),
    ("kestrel_lab.machine", "base"), ("kestrel_lab.threads", "base"), ("kestrel_lab.cgroup", "base"),
    ("kestrel_lab.plotting", "base"), ("kestrel_lab.exercise", "base"), ("kestrel_lab.chat_blocks", "base"),
    ("kestrel_lab.cgroup_launch", "base"),
    ("kestrel_lab.syllabus", "base"), ("kestrel_lab.measure", "base"), ("kestrel_lab.imports", "base"),
    ("kestrel_lab.seam", "base"),
)


def floor_of(name: str, rules=RULES) -> str | None:
    from fnmatch import fnmatchcase

    return next((floor for pattern, floor in rules if fnmatchcase(name, pattern)), None)


def back_arrows(graph: dict[str, set[str]], rules=RULES) -> list[str]:
    """Every import from a lower floor to a higher one, as 'a (floor) -> b (floor)'."""
    level = {f: i for i, f in enumerate(FLOORS)}
    out = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            fa, fb = floor_of(a, rules), floor_of(b, rules)
            if fa and fb and level[fb] > level[fa]:
                out.append(f"{a} ({fa}) -> {b} ({fb})")
    return out


def test_every_module_has_a_floor():
    missing = [m for m in import_graph() if floor_of(m) is None]
    assert not missing, f"modules no rule of RULES places on a floor: {missing}"


def test_the_floor_check_finds_a_planted_back_arrow():
    graph = {"kestrel_lab.kernels.ops": {"kestrel_lab.engine.model"},
             "kestrel_lab.engine.model": {"kestrel_lab.kernels.ops"}}
    assert back_arrows(graph) == ["kestrel_lab.kernels.ops (kernels) -> kestrel_lab.engine.model (engine)"]
    assert floor_of("kestrel_lab.vqf.cli") == "apps" and floor_of("kestrel_lab.vqf.reader") == "formats"


def test_no_import_runs_back_up_a_floor():
    arrows = back_arrows(import_graph())
    assert not arrows, "imports that run back up a floor:\n  " + "\n  ".join(arrows)


# --------------------------------------------------------------------------- function length
# A function that does not fit on a screen does several things; name them. The numba kernel factories
# are the exception: a factory defines its kernels inside it (numba freezes the factory's argument in the
# closure and compiles one variant per value), so it is as long as its kernels together.
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS_ALLOWED = {
    "kestrel_lab/kernels/ops.py::_make_q4_0_kernels",   # numba kernel factory
    "kestrel_lab/kernels/v16.py::_make_kernels",        # numba kernel factory
    "kestrel_lab/kernels/v16.py::_make_intrinsics",     # numba kernel factory
}


def long_functions(root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """Every function or method under ``root`` longer than ``limit`` lines (``end_lineno - lineno + 1``,
    decorators not counted), as 'path::name' (methods 'path::Class.name') -> lines."""
    found = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    found[f"{path}::{prefix}{child.name}"] = lines
                visit(child, path, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for file in sorted(root.rglob("*.py")):
        rel = file.relative_to(root.parent).as_posix()
        visit(ast.parse(file.read_text(encoding="utf-8"), str(file)), rel, "")
    return found


def test_the_length_check_finds_a_planted_long_function(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))   # def line + 80 = 81 lines
    (pkg / "sub" / "m.py").write_text(f"class C:\n    def long(self):\n{body.replace('    ', '        ')}"
                                      f"\n\ndef short():\n    return 1\n\n\ndef long():\n{body}", encoding="utf-8")
    assert long_functions(pkg) == {f"{PACKAGE}/sub/m.py::C.long": 81, f"{PACKAGE}/sub/m.py::long": 81}


def test_no_function_is_longer_than_80_lines():
    found = long_functions()
    too_long = {name: n for name, n in found.items() if name not in LONG_FUNCTIONS_ALLOWED}
    assert not too_long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n  "
                          + "\n  ".join(f"{name}: {n} lines" for name, n in sorted(too_long.items())))
    gone = sorted(LONG_FUNCTIONS_ALLOWED - set(found))
    assert not gone, f"no longer over {MAX_FUNCTION_LINES} lines, drop them from LONG_FUNCTIONS_ALLOWED: {gone}"
