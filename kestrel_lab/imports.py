"""Which of the package's source files a piece of code depends on: its imports, followed through the package.

Two caches key on it: the book's execution cache (``book.cache``: a notebook re-runs when a module it
reaches changes) and the generated-model cache (``models``: a random VQF is rebuilt when the code that
writes it changes). Both read the imports from the sources with ``ast`` (module level and inside
functions), so a module added to a chain of imports is followed without a hand-kept list.
"""
from __future__ import annotations

import ast
from pathlib import Path


def package_modules(root: Path, package: str = "kestrel_lab") -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``package`` under ``root``."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_modules(source: str, package: str = "kestrel_lab") -> set[str]:
    """Modules of ``package`` named by the imports in ``source`` (``from pkg import mod`` included)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == package:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def closure(names, modules: dict[str, Path], package: str = "kestrel_lab") -> set[str]:
    """The modules reached from ``names`` through the package's imports, with their parent packages
    (importing ``a.b`` runs ``a/__init__``) and the package itself."""
    todo = [n for n in names if n in modules] + [package]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += [m for m in imported_modules(modules[name].read_text(encoding="utf-8"), package) if m in modules]
    return seen
