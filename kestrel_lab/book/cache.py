"""Make the book's execution cache notice what a notebook's outputs depend on.

myst-nb's cache (jupyter-cache) keys each executed notebook on its code cells only, so after a change
in ``kestrel_lab`` or in ``data/`` alone a rebuild would republish stale outputs. Before each build,
``sweep`` computes every notebook's *inputs*: the package modules it imports (followed through the
package's own imports), the data entries those sources name (a config file, a model folder, the
syllabus), and the notebook's recorded figures from other runners (its comparison table shows them).
It keeps their content hash in a manifest beside the cache and drops the cache record of every
notebook whose inputs changed, so the build re-executes exactly those. Taught in day28_1.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from kestrel_lab.atomic import write_json
from kestrel_lab.imports import closure, imported_modules, package_modules
from kestrel_lab.syllabus import NOTEBOOK_FILE

MANIFEST = "kestrel-inputs.json"
LOCAL_RUNNER = "local"  # the build's own figures: an output of the build, not an input


@dataclass
class Project:
    """Where the package and the data live (the repository, or a fixture book in tests)."""

    root: Path
    package: str = "kestrel_lab"
    data: str = "data"
    _modules: dict[str, Path] = field(default_factory=dict, repr=False)

    def modules(self) -> dict[str, Path]:
        """Dotted module name -> source file, for every module of the package."""
        if not self._modules:
            self._modules = package_modules(self.root, self.package)
        return self._modules

    def data_entries(self) -> dict[str, list[Path]]:
        """Data a source can name: each file of ``configs/``, each model folder, other top-level files."""
        base = self.root / self.data
        entries: dict[str, list[Path]] = {}
        if not base.is_dir():
            return entries
        for item in sorted(base.iterdir()):
            if item.name == "measurements":
                continue
            if item.is_file():
                entries[item.name] = [item]
            elif item.name == "models":
                for model in sorted(p for p in item.iterdir() if p.is_dir()):
                    entries[model.name] = sorted(p for p in model.rglob("*") if p.is_file())
            else:
                for f in sorted(p for p in item.rglob("*") if p.is_file()):
                    entries[f.name] = [f]
        return entries


def _closure(names: set[str], project: Project) -> set[str]:
    """The modules reached from ``names`` through the package's imports (``imports.closure``)."""
    return closure(names, project.modules(), project.package)


def notebook_code(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in nb["cells"] if c["cell_type"] == "code")


def notebook_inputs(path: Path, project: Project) -> list[Path]:
    """The files whose content a notebook's outputs depend on (besides its own code)."""
    code = notebook_code(path)
    modules = _closure(imported_modules(code, project.package), project)
    mods = project.modules()
    files = {mods[m] for m in modules}
    text = code + "".join(mods[m].read_text(encoding="utf-8") for m in sorted(modules))
    for name, paths in project.data_entries().items():
        if name in text:
            files.update(paths)
    m = NOTEBOOK_FILE.match(path.name)
    nb_id = m.group(1) if m else None
    meas = project.root / project.data / "measurements"
    if nb_id and meas.is_dir():
        files.update(p for p in meas.glob(f"*/{nb_id}.json") if p.parent.name != LOCAL_RUNNER)
    return sorted(files)


def inputs_hash(path: Path, project: Project) -> str:
    h = hashlib.sha256()
    for f in notebook_inputs(path, project):
        h.update(f.relative_to(project.root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def sweep(cache_dir: Path, notebooks: list[Path], project: Project) -> list[Path]:
    """Drop the cached outputs of every notebook whose inputs changed; return those notebooks.

    A notebook with a cache record but no manifest entry (a cache made before this rule) counts as
    changed. The manifest is written atomically with the new hashes: the build that follows
    re-executes the dropped notebooks (one that fails leaves no record, so it runs again next time).
    """
    cache_dir = Path(cache_dir)
    manifest_path = cache_dir / MANIFEST
    old = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    new: dict[str, str] = {}
    dropped: list[Path] = []
    cache = None
    if (cache_dir / "global.db").exists():
        from jupyter_cache import get_cache

        cache = get_cache(cache_dir)
    for nb in notebooks:
        key = Path(nb).resolve().relative_to(project.root.resolve()).as_posix()
        new[key] = inputs_hash(Path(nb), project)
        if old.get(key) == new[key] or cache is None:
            continue
        import nbformat

        try:
            record = cache.match_cache_notebook(nbformat.read(nb, as_version=4))
        except KeyError:
            continue
        cache.remove_cache(record.pk)
        dropped.append(Path(nb))
    write_json(manifest_path, new)
    return dropped
