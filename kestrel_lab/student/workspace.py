"""``kestrel-lab student init [DIR]``: the student's own package, one skeleton per piece of their engine.

The workspace is a folder holding ``mykestrel/`` (a plain importable package: ``vocab``, ``vqf``, ``quant``,
``kernels``, ``layers``, ``sampling``, ``chat``, ``vision``, ``moe``, ``protect``), a README for the student,
and ``kestrel-student.json``. Each function is a skeleton that raises ``NotImplementedError``; its docstring
gives the signature, what it must return, the lesson that teaches it and where the package will run it.
Running ``init`` again never touches a line the student wrote: it only adds missing modules and, at the end
of a module, missing functions. ``init`` also records the folder in the config file ``kestrel_lab.seam``
reads (unless ``--no-config``), so the lessons' exercise cells and ``student check`` find it.
The student page (book/student.md) explains it; day30_1 runs the engine the workspace grows into.
"""
from __future__ import annotations

import ast
import json
import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from kestrel_lab import __version__, seam
from kestrel_lab.atomic import atomic_write, write_json

MODULE_DOCS = {
    "quant": "Q8_0 and Q4_0 blocks: 32 values, one fp16 scale (days 4 and 17).",
    "kernels": "the activation as Q8_0 and the Q4_0 × Q8_0 matrix-vector product (days 5–7).",
    "layers": "RMSNorm, RoPE, Qwen3's q/k norm and GQA attention over a KV cache (days 8–11).",
    "sampling": "drawing the next token: temperature, top-k, top-p (day 13).",
    "chat": "Qwen3's chat template (day 14).",
    "vqf": "reading and laying out a VQF file: header, directory, the offset chain (days 16–17).",
    "vocab": "tokenizer.json → vocab.bin (day 18).",
    "vision": "Qwen3-VL's eyes: patches, the 2×2 merger, 3-D positions (days 19–21).",
    "moe": "Qwen3-MoE's router (day 22).",
    "protect": "SM4-CTR, the cipher of a protected VQF file (day 26).",
}
MARKER = "kestrel-student.json"
README = """# {package} — my own Qwen engine

Each module of `{package}/` holds pieces of an inference engine, one function per piece. Every function
starts as a skeleton that raises `NotImplementedError`; its docstring says what it must return and which
lesson teaches it. The lesson's exercise cell checks *this* function once it is written.

- `kestrel-lab student check` runs every piece you wrote where it matters — your vocab compiler builds
  vocab.bin, your VQF parser reads the poem model, your RMSNorm/RoPE/attention/matvec run the poem model's
  golden tokens — and compares the result with kestrel_lab's. `--piece layers.rmsnorm` or `--day 8` checks
  fewer; a wrong piece is reported with where it first goes wrong.
- `kestrel-lab student notebooks` writes the lessons without their reference solutions, pointed here.
- `kestrel-lab student init {folder}` again adds what a newer kestrel_lab asks for; it never overwrites
  what you wrote.
- The workspace is found through `KESTREL_STUDENT` (this folder; `off` turns it off) or the config file
  that `student init` wrote ({config}).

numpy is enough for every piece; numba is optional. Made by kestrel_lab {version}.
"""


@dataclass
class InitReport:
    """What ``init`` did: files created, functions added per module, the config file written."""

    root: Path
    created: list[str] = field(default_factory=list)
    added: dict[str, list[str]] = field(default_factory=dict)
    config: Path | None = None

    def summary(self) -> str:
        lines = [f"workspace {self.root}"]
        lines += [f"  created {c}" for c in self.created]
        lines += [f"  {m}.py: added {', '.join(names)}" for m, names in self.added.items() if names]
        if not self.created and not any(self.added.values()):
            lines.append("  nothing to add: every module and piece is there")
        if self.config:
            lines.append(f"  the lessons and `student check` find it through {self.config}")
        return "\n".join(lines)


def skeleton(piece: seam.Piece) -> str:
    """The source of one piece's skeleton function."""
    doc = (f"Return {piece.returns}.\n\n{piece.doc}\n\nTaught in {piece.lesson}. The package runs it in: {piece.seam}.")
    body = textwrap.indent(textwrap.fill(doc, 100, replace_whitespace=False) if "\n" not in doc else
                           "\n".join(textwrap.fill(p, 100) if p else "" for p in doc.split("\n")), "    ")
    return (f"def {piece.name}({piece.signature}):\n    \"\"\"{body.strip()}\n    \"\"\"\n"
            f"    raise NotImplementedError(\"{piece.key}: not written yet ({piece.lesson})\")\n")


def module_source(module: str, pieces: list[seam.Piece]) -> str:
    head = (f'"""{seam.PACKAGE}.{module} — {MODULE_DOCS.get(module, "")}\n\n'
            f"Your functions; ``kestrel-lab student check --piece {module}.<name>`` checks one.\n\"\"\"\n"
            "import numpy as np  # noqa: F401  (most pieces want it)\n")
    return head + "".join("\n\n" + skeleton(p) for p in pieces)


def defined_functions(source: str) -> set[str]:
    """Top-level function names in ``source`` (a module the student may have edited)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise seam.WorkspaceError(f"line {e.lineno}: {e.msg} — fix it before `student init` adds to it") from None
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def init(root: str | os.PathLike, *, write_config: bool = True) -> InitReport:
    """Create or complete the workspace at ``root`` (never overwriting a line), and record it."""
    root = Path(root).expanduser().resolve()
    pkg = root / seam.PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    rep = InitReport(root)
    init_py = pkg / "__init__.py"
    if not init_py.exists():
        _write(init_py, f'"""My own Qwen engine, piece by piece (kestrel_lab {__version__})."""\n')
        rep.created.append(f"{seam.PACKAGE}/__init__.py")
    for module in seam.MODULES:
        pieces = [p for p in seam.PIECES if p.module == module]
        path = pkg / f"{module}.py"
        if not path.exists():
            _write(path, module_source(module, pieces))
            rep.created.append(f"{seam.PACKAGE}/{module}.py")
            continue
        text = path.read_text(encoding="utf-8")
        try:
            have = defined_functions(text)
        except seam.WorkspaceError as e:
            raise seam.WorkspaceError(f"{path}: {e}") from None
        missing = [p for p in pieces if p.name not in have]
        if missing:
            _write(path, text.rstrip("\n") + "\n" + "".join("\n\n" + skeleton(p) for p in missing))
            rep.added[module] = [p.name for p in missing]
    cfg = seam.config_file()
    if not (root / "README.md").exists():
        _write(root / "README.md", README.format(package=seam.PACKAGE, folder=root, config=cfg, version=__version__))
        rep.created.append("README.md")
    if not (root / MARKER).exists():
        write_json(root / MARKER, {"package": seam.PACKAGE, "made_by": f"kestrel_lab {__version__}"})
        rep.created.append(MARKER)
    if write_config:
        cfg.parent.mkdir(parents=True, exist_ok=True)
        write_json(cfg, {"workspace": str(root)})
        rep.config = cfg
    return rep


def _write(path: Path, text: str) -> None:
    with atomic_write(path, "w") as fh:
        fh.write(text)


def status(ws: seam.Workspace) -> dict[str, str]:
    """{piece key: "missing" | "not started" | "written"} (static: nothing is run)."""
    out = {}
    for key in seam.BY_KEY:
        fn = ws.function(key)
        out[key] = "missing" if fn is None else "not started" if seam.is_skeleton(fn) else "written"
    return out


def read_marker(root: Path) -> dict:
    try:
        return json.loads((root / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
