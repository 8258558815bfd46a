"""The student seam: the pieces of the engine a student writes, and where the package runs them.

A student's own package (``kestrel-lab student init`` makes it: ``mykestrel/`` with one module per
capability) holds one function per **piece** below — the same functions the lessons' exercises ask for.
The package asks this module at each seam: ``get("layers.rmsnorm")`` is the student's function while a
``swapped`` block (or ``use``) has put it in, else ``None`` and the package runs its own code. With
nothing swapped in — the default, and always in the book build — nothing in the package's path changes.

The table is the contract: each piece's signature, what it returns, the lesson that teaches it and the
seam that calls it. Floors: this module imports nothing from the package, so every floor may ask it.

Where the workspace is: ``KESTREL_STUDENT`` (a folder; ``off`` or empty: none), else the config file
``student init`` writes (``$XDG_CONFIG_HOME/kestrel_lab/student.json``, ``{"workspace": FOLDER}``).
The book build sets ``KESTREL_STUDENT=off``. Taught in day30_1.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import json
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

PACKAGE = "mykestrel"            # the student's package name inside a workspace
ENV = "KESTREL_STUDENT"
OFF = ("", "0", "off", "none", "no")


@dataclass(frozen=True)
class Piece:
    """One function of the student's engine: ``module.name(signature)`` returning ``returns``."""

    module: str          # the student's module (``mykestrel/<module>.py``)
    name: str            # the function
    signature: str       # its parameters, as written in the skeleton
    returns: str         # what it must return
    lesson: str          # the lesson whose exercise it is
    seam: str            # where the package runs it in place of its own code
    doc: str             # one paragraph for the skeleton's docstring

    @property
    def key(self) -> str:
        return f"{self.module}.{self.name}"


PIECES: tuple[Piece, ...] = (
    Piece("quant", "quantize_q8_0", "x", "bytes: len(x)/32 blocks of 34 (fp16 scale d = max|x|/127, then 32 int8 "
          "round(x/d), halves away from zero)", "day04_1", "convert: every Q8_0 tensor of a file the package writes",
          "x is a float32 array whose length is a multiple of 32."),
    Piece("quant", "dequantize_q4_0", "raw, n", "float32 array of n values: d·(q − 8) per block of 18 bytes (fp16 d, "
          "16 bytes: weight j in the low nibble of byte j, weight j+16 in the high one)", "day04_2",
          "quant.dequantize: Q4_0 weights read back as numbers (the numpy reference forward, eval, VQF tensors)",
          "raw holds n/32 Q4_0 blocks (bytes or a uint8 array)."),
    Piece("kernels", "quantize_act", "x", "(q int8 (K,), d float32 (K/32,)): the activation as Q8_0, d rounded to "
          "fp16 as llama.cpp stores it", "day05_3", "the student's engine: every activation before a Q4_0 product",
          "x is one float32 vector of K values, K a multiple of 32."),
    Piece("kernels", "matvec_q4_0", "w, xq, xd", "float32 (rows,): W·x from the exact integer dot of each block "
          "times d_w·d_x", "day05_2", "the student's engine: every Q4_0 matrix product (the file's plain bytes)",
          "w is (rows, cols/32·18) uint8 plain Q4_0 rows; xq, xd the activation from quantize_act."),
    Piece("layers", "rmsnorm", "x, w, eps", "float32 (T, D): x / sqrt(mean(x²) + eps) · w per row", "day08_1",
          "the student's engine: the two norms of each layer and the final norm", "x is (T, D) float32, w (D,)."),
    Piece("layers", "rope_cos_sin", "positions, D, theta", "(cos, sin), each float32 (n, D/2): angle = position · "
          "theta^(−2i/D)", "day09_1", "the student's engine: the rotation tables of every position",
          "positions: n integers."),
    Piece("layers", "apply_rope", "x, cos, sin", "a new float32 array like x: coordinate i paired with i + D/2 "
          "(rotate-half), rotated by the row's angles", "day09_2", "the student's engine: q and k of every layer",
          "x is (T, heads, D); cos, sin (T, D/2)."),
    Piece("layers", "rmsnorm_heads", "x, w, eps", "a new float32 array like x: RMSNorm over the last axis of each "
          "head, w shared by the heads", "day09_3", "the student's engine: Qwen3's q/k norm",
          "x is (T, heads, D), w (D,)."),
    Piece("layers", "attention", "q, k, v", "float32 (T, H, D): causal GQA attention — query t (the last T of the "
          "n cached positions) sees keys 0 … n − T + t; q head h reads KV head h // (H / KVH)", "day10_3",
          "the student's engine: every layer's attention over its KV cache",
          "q is (T, H, D); k, v (KVH, n, D) hold the whole cache up to and including these T tokens."),
    Piece("sampling", "draw", "logits, T, top_k, top_p, u", "int: the id drawn — logits / T, then top-k, top-p, "
          "softmax, the inverse CDF at u; T = 0 is greedy", "day13_2",
          "the student's engine: every sampled token (greedy when T = 0)",
          "u is one uniform number in [0, 1); top_k 0 and top_p 1 mean off."),
    Piece("chat", "render", "messages, add_generation_prompt=True", "str: Qwen3's chat template, special tokens "
          "written out, thinking on", "day14_1", "the student's engine: the prompt of every text chat turn",
          "messages: dicts with role (system/user/assistant) and content."),
    Piece("vqf", "parse_header", "raw", "dict with version, flags, n_tensors, data_offset, file_len (the VQF "
          "header's fixed fields)", "day16_2", "the VQF reader: the header of every file it opens",
          "raw: at least the first 448 bytes of a VQF file."),
    Piece("vqf", "parse_directory", "raw, n", "list of n tuples (name, qtype, rows, cols, offset, nbytes)",
          "day16_2", "the VQF reader: the directory of every file it opens",
          "raw: the n 64-byte directory entries that start at byte 448."),
    Piece("vqf", "chain_offsets", "sizes, data_offset", "(offsets list, file_len): each tensor 64-byte aligned "
          "after the previous one, the first at data_offset, file_len the last end", "day16_3",
          "the VQF writer: where every tensor of a file goes", "sizes: each tensor's byte count, in order."),
    Piece("vocab", "decode_token_str", "key", "bytes: what vocab.bin stores for one tokenizer.json key (the "
          "byte-level alphabet undone)", "day18_2", "the vocab compiler: every token it writes",
          "key: one key of tokenizer.json's model.vocab."),
    Piece("vocab", "compile_vocab", "tokenizer_json", "bytes: the whole vocab.bin — u32 N, then per token u32 id, "
          "u16 length, the bytes; the base vocabulary in id order through decode_token_str, then the added tokens "
          "as UTF-8", "day18_2", "kestrel-lab vocab compile: the file it writes",
          "tokenizer_json: the path of a tokenizer.json."),
    Piece("vision", "patchify", "chw, patch=16, temporal=2, merge=2", "float32 (N, 3·temporal·patch²): one row per "
          "patch, the frame repeated temporal times, rows in 2×2-merge-block order", "day20_3",
          "the student's engine: a picture's pixel_values", "chw: one normalized (3, H, W) frame, H and W multiples "
          "of patch·merge."),
    Piece("vision", "merge", "h, m", "float32 (N/4, text width): LayerNorm per patch, 2×2 concat, fc1, exact "
          "GELU, fc2", "day20_1", "the student's engine: the vision tower's main merger",
          "h: (N, width) after the last vision block; m: the merger's tensors (norm, norm_b, fc1, fc1_b, fc2, fc2_b)."),
    Piece("vision", "image_positions", "s, grid_thw, merge=2", "((3, N) int64 positions t, h, w of one image's "
          "tokens starting at rope position s, the next position after the image)", "day21_2",
          "the student's engine: the MRoPE positions of every picture in a prompt", "grid_thw: the patch grid."),
    Piece("moe", "route", "logits, k, norm", "(experts int64 (T, k) in descending probability, weights float32 "
          "(T, k)), renormalized to sum 1 when norm", "day22_1", "the student's engine: every MoE layer's router",
          "logits: (T, E) router logits."),
    Piece("protect", "sm4_ctr", "key, iv, data, offset", "bytes: data XOR the SM4-CTR keystream, the counter "
          "being iv + offset/16 as a 128-bit big-endian number", "day26_2",
          "the VQF reader: every tensor of an encrypted file", "offset: where data starts in the data area, a "
          "multiple of 16 bytes; key and iv 16 bytes each."),
)
BY_KEY = {p.key: p for p in PIECES}
MODULES = tuple(dict.fromkeys(p.module for p in PIECES))

_active: dict[str, Callable] = {}


def get(key: str) -> Callable | None:
    """The student's function for piece ``key`` while it is swapped in, else None (the package's own code)."""
    return _active.get(key)


def active() -> dict[str, Callable]:
    """The pieces swapped in now, ``{key: function}``."""
    return dict(_active)


def _check_keys(pieces: dict) -> None:
    unknown = sorted(set(pieces) - set(BY_KEY))
    if unknown:
        raise KeyError(f"no such piece: {', '.join(unknown)} (the pieces: {', '.join(BY_KEY)})")


@contextlib.contextmanager
def swapped(pieces: dict[str, Callable]) -> Iterator[dict[str, Callable]]:
    """Run the package with ``pieces`` ({key: function}) in place of its own code inside the block; what
    was swapped in before comes back after it. Objects built inside (an engine, a sampler) keep the
    pieces they were built with."""
    _check_keys(pieces)
    before = dict(_active)
    _active.update(pieces)
    try:
        yield dict(_active)
    finally:
        _active.clear()
        _active.update(before)


@contextlib.contextmanager
def package_only() -> Iterator[None]:
    """Run the block on the package's own code whatever is swapped in: files shared by every run (the model
    cache) are never written by a student's piece."""
    before = dict(_active)
    _active.clear()
    try:
        yield
    finally:
        _active.clear()
        _active.update(before)


# --------------------------------------------------------------------------- the student's workspace
class WorkspaceError(RuntimeError):
    """The configured workspace cannot be used (missing folder, a module that does not import)."""


def config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "kestrel_lab" / "student.json"


def configured() -> Path | None:
    """The workspace folder to use: ``KESTREL_STUDENT`` if set (``off`` means none), else the config file's."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in OFF else Path(env).expanduser()
    try:
        data = json.loads(config_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ws = data.get("workspace") if isinstance(data, dict) else None
    return Path(ws) if isinstance(ws, str) and ws else None


def is_skeleton(fn: Callable) -> bool:
    """Whether ``fn`` is still the skeleton ``student init`` wrote: its body (after the docstring) is one
    ``raise NotImplementedError(…)``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    body = tree.body[0].body if tree.body and hasattr(tree.body[0], "body") else []
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


@dataclass
class Workspace:
    """A student's workspace folder and its package, imported under a private name (so two workspaces, or a
    workspace and the notebooks' own definitions, never collide)."""

    root: Path

    @property
    def package_dir(self) -> Path:
        return self.root / PACKAGE

    def module(self, name: str):
        """The student's module ``name`` (imported once per process), None when the file is missing."""
        path = self.package_dir / f"{name}.py"
        if not path.is_file():
            return None
        mod_name = f"_kestrel_student_{abs(hash(str(self.root.resolve())))}.{name}"
        if mod_name in sys.modules and getattr(sys.modules[mod_name], "__file__", None) == str(path):
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            del sys.modules[mod_name]
            raise WorkspaceError(f"{path}: does not import ({type(e).__name__}: {e})") from e
        return mod

    def function(self, key: str) -> Callable | None:
        """The student's function for piece ``key`` (skeleton or not), None when absent."""
        piece = BY_KEY[key]
        mod = self.module(piece.module)
        fn = getattr(mod, piece.name, None) if mod is not None else None
        return fn if callable(fn) else None

    def implemented(self) -> dict[str, Callable]:
        """{key: function} of every piece whose function is no longer the skeleton."""
        out = {}
        for key in BY_KEY:
            fn = self.function(key)
            if fn is not None and not is_skeleton(fn):
                out[key] = fn
        return out


def workspace(root: str | os.PathLike | None = None) -> Workspace | None:
    """The workspace at ``root``, else the configured one (``configured``), else None."""
    path = Path(root) if root is not None else configured()
    if path is None:
        return None
    if not (path / PACKAGE).is_dir():
        raise WorkspaceError(f"{path}: no {PACKAGE}/ package here (make one with `kestrel-lab student init {path}`; "
                             f"{ENV}=off turns the workspace off)")
    return Workspace(path)


@contextlib.contextmanager
def use(root: str | os.PathLike | None = None) -> Iterator[dict[str, Callable]]:
    """Swap in every implemented piece of the workspace (``root`` or the configured one) for the block."""
    ws = workspace(root)
    with swapped(ws.implemented() if ws else {}) as pieces:
        yield pieces
