"""One home for "a model to run on": random or trained, as a VQF file or an HF checkpoint, cached by content.

Lessons, tests, the bench and the command line all ask here for the model they run on:

- ``vqf(model="random", arch="qwen3", config=None, overrides=None, layers=None, seed=0, quant="q4_0")``:
  a VQF file with seeded random weights (``vqf.synth.write_model``: scaled like a trained model's, a
  tied lm head equal to the embedding, so the engine runs on it) for a config — ``None`` (the tiny
  default of ``tiny_model``), a ``config.json`` path, a config dict or a ``ModelConfig`` — with
  ``overrides`` merged into it (nested dicts key by key) and ``layers=N`` keeping the first N layers;
- ``vqf(model="qwen3-tiny-poem", quant="q8_0")``: a trained model embedded in ``data/models`` (see
  ``TRAINED``), or any HF checkpoint folder given as a path, converted with ``convert.convert``;
- ``hf_checkpoint(model="random", arch=…, config=…, overrides=…, layers=…, seed=…)``: a random HF
  checkpoint folder (``config.json`` + safetensors, written by ``tiny_model.make_tiny_model``); for a
  trained model, its folder in ``data/models``;
- ``default_bench_vqf(quick)``: what the speed lessons measure (Qwen3-0.6B shapes, or a hidden-512,
  8-layer cut of them when ``quick``); ``evict(path)`` drops a file's pages from the page cache.

**One cache policy.** Every file is written atomically (temporary file, then rename) into
``paths.cache_dir()/models/`` under a readable name, with its *key* beside it (``<file>.json``). The
key is what the file's bytes depend on: the full config (the ``config.json`` dict, or
``ModelConfig.to_dict()``), seed, quant, the layer subset, for a checkpoint folder its files' sizes
and modification times, and ``sources_hash`` — the SHA-256 of the package sources that write the
file (the VQF writer, planner, layout, format, the quantizers, the random generator or the
converter). A file whose stored key equals the key asked for is reused; any other is rebuilt. A
version number would not do: ``__version__`` is a constant, and a changed quantizer must invalidate.

Architectures: ``ARCHS`` (dense ``qwen3``, ``qwen3_vl``, ``qwen3_moe``, ``qwen2``), each with a tiny default in
``tiny_model`` (``arch="qwen3_moe"``: 8 experts, top-2, an untied head) or any config of its family.
Taught in day13_1, day16_1 and day23_1.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from kestrel_lab import paths, seam
from kestrel_lab.atomic import write_json
from kestrel_lab.config import ModelConfig
from kestrel_lab.imports import closure, package_modules
from kestrel_lab.quant import QType
from kestrel_lab.vqf.layout import resolve_quant

__all__ = ["ARCHS", "TRAINED", "SCHEMA", "sources_hash", "vqf", "hf_checkpoint", "default_bench_vqf",
           "evict", "cache_key_path", "resident_bytes", "default_moe_vqf", "QUICK_MOE", "dense_twin_vqf",
           "QUICK_DENSE_TWIN"]

SCHEMA = "kestrel-lab/models/1"
ARCHS = ("qwen3", "qwen3_vl", "qwen3_moe", "qwen2")
#: The trained models embedded in the repository (data/models/NAME); a tiny VL model comes next.
TRAINED = ("qwen3-tiny-poem", "qwen3-tiny-vl")
BENCH_CONFIG = "qwen3-0.6b.config.json"
#: ``default_bench_vqf(quick=True)``: Qwen3-0.6B cut to hidden 512 and 8 layers (the real vocabulary).
QUICK_BENCH = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64)

MOE_CONFIG = "qwen3-30b-a3b.config.json"
#: ``default_moe_vqf(quick=True)``: Qwen3-30B-A3B with every width (hidden, heads' width, expert width,
#: vocabulary) divided by 8 and 8 of its 48 layers; the 128 experts and top-8 routing kept, so the
#: sparsity (8 of 128 experts per token) is the real model's.
QUICK_MOE = dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=1, head_dim=64,
                 moe_intermediate_size=96, intermediate_size=768, vocab_size=18992, num_hidden_layers=8)
QUICK_MOE_FACTOR = 8
DENSE_TWIN_CONFIG = "qwen3-4b.config.json"
#: ``dense_twin_vqf(quick=True)``: Qwen3-4B shrunk as ``QUICK_MOE`` shrinks 30B-A3B (every width ÷ 8,
#: 8 layers): the dense model with about the active parameters of the quick MoE model.
QUICK_DENSE_TWIN = dict(hidden_size=320, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                        intermediate_size=1216, vocab_size=18992, num_hidden_layers=8)

_PKG = Path(__file__).resolve().parent
#: The module that writes each kind of file; what it depends on is its import closure (``imports.closure``).
WRITERS = {
    "vqf": "kestrel_lab.vqf.writer",
    "random": "kestrel_lab.vqf.synth",
    "convert": "kestrel_lab.convert",
    "hf": "kestrel_lab.tiny_model",
}


def sources_hash(kinds: tuple[str, ...]) -> str:
    """SHA-256 over every package source the writers of these kinds reach through their imports (``WRITERS``,
    ``imports.closure``): a change anywhere in that code rebuilds the cached file. Taught in day16_1."""
    modules = package_modules(_PKG.parent)
    h = hashlib.sha256()
    for name in sorted(closure({WRITERS[k] for k in kinds}, modules)):
        h.update(name.encode() + b"\0")
        h.update(modules[name].read_bytes())
    return h.hexdigest()


def _short(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:8]


def cache_key_path(path: str | os.PathLike) -> Path:
    """Where the key of a cached file or folder is stored: beside it, ``<name>.json``. Taught in day16_1."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def _cached(out: Path, key: dict, build) -> Path:
    """Reuse ``out`` if its stored key equals ``key``; else ``build(out)`` (atomically) and store the key."""
    kp = cache_key_path(out)
    if out.exists() and kp.exists():
        try:
            if json.loads(kp.read_text(encoding="utf-8")) == key:
                return out
        except (OSError, ValueError):
            pass
    out.parent.mkdir(parents=True, exist_ok=True)
    if kp.exists():
        kp.unlink()          # the key goes first and comes back last: a crash in between means "rebuild"
    with seam.package_only():      # a student's piece swapped in never writes the shared cache
        build(out)
    write_json(kp, key)
    return out


def _cache() -> Path:
    return paths.cache_dir() / "models"


# ----------------------------------------------------------------------------- configs
def _with_layers(cfg: dict, layers: int | None) -> dict:
    if layers is None:
        return cfg
    if layers < 1:
        raise ValueError(f"layers = {layers} must be ≥ 1")
    text = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    if layers > text["num_hidden_layers"]:
        raise ValueError(f"layers = {layers}: the config has only {text['num_hidden_layers']} layers")
    text["num_hidden_layers"] = layers
    for k in ("layer_types",):
        if isinstance(text.get(k), list):
            text[k] = text[k][:layers]
    if isinstance(text.get("max_window_layers"), int):
        text["max_window_layers"] = min(text["max_window_layers"], layers)
    return cfg


def _resolve_config(arch: str | None, config, overrides: dict | None, layers: int | None):
    """(name stem, arch, the key's config, ModelConfig or HF dict) for a random model."""
    from kestrel_lab import tiny_model

    if isinstance(config, ModelConfig):
        cfg = dataclasses.replace(config, **(overrides or {}))
        if layers is not None:
            if not 1 <= layers <= cfg.num_hidden_layers:
                raise ValueError(f"layers = {layers}: the config has {cfg.num_hidden_layers} layers")
            cfg = dataclasses.replace(cfg, num_hidden_layers=layers)
        d = cfg.to_dict()
        stem, hf = f"{cfg.arch}-{_short(d)}", None
    else:
        if config is None:
            a = arch or "qwen3"
            if a not in tiny_model.ARCHS:
                raise ValueError(f"no default tiny {a} config: pass config= (a config.json path or dict)")
            hf = tiny_model.build_config(a, overrides)
            stem = f"tiny-{a}" + (f"-{_short(overrides)}" if overrides else "")
        else:
            if isinstance(config, dict):
                base, stem = copy.deepcopy(config), None
            else:
                cp = Path(config)
                base = json.loads(cp.read_text(encoding="utf-8"))
                stem = cp.name.removesuffix(".json").removesuffix(".config")
                if stem == "config":
                    stem = cp.parent.name
            hf = tiny_model.merge_config(base, overrides or {})
            if stem is None:
                stem = f"{hf.get('model_type', 'model')}-{_short(hf)}"
            elif overrides:
                stem += f"-{_short(overrides)}"
        hf = _with_layers(hf, layers)
        cfg = ModelConfig.from_hf(hf)
        d = hf
    if arch is not None and arch != cfg.arch:
        raise ValueError(f"arch={arch!r} but the config is {cfg.arch!r}")
    if cfg.arch not in ARCHS:
        raise ValueError(f"unknown arch {cfg.arch!r}; choose one of {ARCHS}")
    if layers is not None:
        stem += f"-l{layers}"
    return stem, cfg, d, hf


def _checkpoint_dir(model: str | os.PathLike) -> Path:
    if isinstance(model, str) and model in TRAINED:
        return paths.data_dir() / "models" / model
    d = Path(model)
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"{model!r}: not a trained model ({', '.join(TRAINED)}, 'random') "
                                f"nor a checkpoint folder with a config.json")
    return d


def _files_stamp(src: Path) -> dict:
    files = {p.name: [p.stat().st_size, p.stat().st_mtime_ns]
             for p in sorted(src.glob("*")) if p.suffix in (".json", ".safetensors")}
    if not any(n.endswith(".safetensors") for n in files):
        raise FileNotFoundError(f"{src}: no *.safetensors to convert")
    return files


# ----------------------------------------------------------------------------- VQF files
def vqf(model: str | os.PathLike = "random", *, arch: str | None = None, config=None,
        overrides: dict | None = None, layers: int | None = None, seed: int = 0, quant: "str | QType" = "q4_0",
        name: str | None = None, progress=None) -> Path:
    """The cached VQF file of a model (built on first use, rebuilt when its key changes).

    ``model``: "random" (seeded random weights for ``config``/``arch``, shaped by ``overrides`` and
    ``layers``), a name in ``TRAINED`` or a checkpoint folder (converted at ``quant``; ``config``,
    ``overrides``, ``layers`` and ``seed`` do not apply). ``name``: the readable part of the file name
    (default: from the config or the model). Taught in day13_1.
    """
    quant = resolve_quant(quant).name.lower()   # read once; the file name and the key use its name
    if str(model) == "random":
        from kestrel_lab.vqf import synth

        stem, cfg, d, _ = _resolve_config(arch, config, overrides, layers)
        out = _cache() / f"{name or stem}-{quant}-seed{seed}.vqf"
        key = {"schema": SCHEMA, "kind": "vqf", "model": "random", "arch": cfg.arch, "config": d,
               "layers": layers, "seed": seed, "quant": quant, "sources": sources_hash(("vqf", "random"))}
        return _cached(out, key, lambda p: synth.write_model(p, cfg, quant, seed, progress=progress))
    if config is not None or overrides or layers is not None:
        raise ValueError("vqf: config, overrides and layers apply to model='random' only "
                         "(make the checkpoint with hf_checkpoint(...) first)")
    src = _checkpoint_dir(model)
    out = _cache() / f"{name or src.name}.{quant}.vqf"
    key = {"schema": SCHEMA, "kind": "vqf", "model": str(model) if str(model) in TRAINED else src.name,
           "config": json.loads((src / "config.json").read_text(encoding="utf-8")), "quant": quant,
           "files": _files_stamp(src), "sources": sources_hash(("vqf", "convert"))}

    def build(p: Path) -> None:
        from kestrel_lab import convert

        convert.convert(src, p, quant=quant, progress=progress)
    return _cached(out, key, build)


def default_bench_vqf(quick: bool = False) -> Path:
    """The speed lessons' model: random weights with Qwen3-0.6B's shapes (``data/configs``), Q4_0;
    ``quick``: hidden 512 and 8 layers of it (``QUICK_BENCH``), the real vocabulary. Taught in day23_1."""
    cfg = paths.configs_dir() / BENCH_CONFIG
    if not quick:
        return vqf(config=cfg, quant="q4_0")
    return vqf(config=cfg, overrides=QUICK_BENCH, quant="q4_0", name="qwen3-h512-l8")


def default_moe_vqf(quick: bool = True, layers: int | None = None) -> Path:
    """The MoE lessons' model: random weights with Qwen3-30B-A3B's shapes (``data/configs``), Q4_0;
    ``quick``: its widths ÷ 8 and 8 layers (``QUICK_MOE``), all 128 experts and top-8 kept; otherwise
    the real shapes, cut to ``layers`` layers when given (the whole file is ~17.7 GB).
    Taught in day22_2 and day22_3."""
    cfg = paths.configs_dir() / MOE_CONFIG
    if quick:
        return vqf(config=cfg, overrides=QUICK_MOE, quant="q4_0", name="qwen3-30b-a3b-w8-l8")
    return vqf(config=cfg, layers=layers, quant="q4_0")


def dense_twin_vqf(quick: bool = True, layers: int | None = None) -> Path:
    """The dense twin of ``default_moe_vqf``: random weights with Qwen3-4B's shapes (about as many
    active parameters as 30B-A3B), Q4_0; ``quick``: ``QUICK_DENSE_TWIN`` (widths ÷ 8, 8 layers);
    otherwise the real shapes cut to ``layers``. Taught in day22_2."""
    cfg = paths.configs_dir() / DENSE_TWIN_CONFIG
    if quick:
        return vqf(config=cfg, overrides=QUICK_DENSE_TWIN, quant="q4_0", name="qwen3-4b-w8-l8")
    return vqf(config=cfg, layers=layers, quant="q4_0")


# ----------------------------------------------------------------------------- HF checkpoints
def hf_checkpoint(model: str | os.PathLike = "random", *, arch: str | None = None, config=None,
                  overrides: dict | None = None, layers: int | None = None, seed: int = 0,
                  dtype: str = "bfloat16", style: str = "hf5", saver: str = "kestrel") -> Path:
    """The folder of an HF checkpoint (``config.json`` + ``model.safetensors``), cached by content.

    "random": ``tiny_model.make_tiny_model``'s seeded weights for the config (``None``: the tiny default
    of ``arch``; a path or dict: that config, ``overrides`` merged in); ``style`` "hf5"/"hf4" picks the
    ``config.json`` style. A name in ``TRAINED``: its folder in ``data/models`` (nothing is written).
    ``saver``: "kestrel" (the package's safetensors writer) or "transformers": the same seeded weights
    loaded by transformers and written by its own ``save_pretrained`` (needs torch and transformers:
    the reference group), for checks against files nobody here wrote.
    """
    if str(model) != "random":
        if config is not None or overrides or layers is not None:
            raise ValueError("hf_checkpoint: config, overrides and layers apply to model='random' only")
        return _checkpoint_dir(model)
    if saver not in SAVERS:
        raise ValueError(f"saver={saver!r}: expected one of {', '.join(SAVERS)}")
    from kestrel_lab import tiny_model

    if dtype not in tiny_model.DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(tiny_model.DTYPES)}")
    if isinstance(config, ModelConfig):
        raise TypeError("hf_checkpoint: pass a config.json path or dict (a ModelConfig has no HF names)")
    if config is None:
        d = tiny_model.build_config(arch or "qwen3", overrides, dtype)
    else:
        base = config if isinstance(config, dict) else json.loads(Path(config).read_text(encoding="utf-8"))
        d = tiny_model.merge_config(base, overrides)
    d = _with_layers(copy.deepcopy(d), layers)
    a = d.get("model_type")
    if arch is not None and arch != a:
        raise ValueError(f"arch={arch!r} but the config is {a!r}")
    key = {"schema": SCHEMA, "kind": "hf", "model": "random", "arch": a, "config": d, "seed": seed,
           "dtype": dtype, "style": style, "saver": saver, "sources": sources_hash(("hf",))}
    by = "-saved-by-transformers" if saver == "transformers" else ""
    out = _cache() / f"hf-{a}-s{seed}-{_short([d, dtype, style])}{by}"

    def build(p: Path) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.", dir=p.parent))
        try:
            tiny_model.make_tiny_model(tmp, a, seed, dtype=dtype, style=style, config=d)
            if saver == "transformers":
                _resave_with_transformers(tmp, a, dtype)
            if p.exists():
                shutil.rmtree(p)
            os.replace(tmp, p)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _cached(out, key, build)


SAVERS = ("kestrel", "transformers")
_HF_CLASSES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
               "qwen3_vl": "Qwen3VLForConditionalGeneration", "qwen2": "Qwen2ForCausalLM"}


def _resave_with_transformers(folder: Path, arch: str, dtype: str) -> None:
    """Load the checkpoint in ``folder`` with transformers and write it back with ``save_pretrained``."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise RuntimeError(f"saver='transformers' needs torch and transformers (pip install -r "
                           f"requirements-ref.txt): {e}") from None
    cls = getattr(transformers, _HF_CLASSES[arch])
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    hf_log = transformers.utils.logging
    bars = hf_log.is_progress_bar_enabled()
    hf_log.disable_progress_bar()          # a cache being filled is not worth a progress bar in a lesson
    try:
        model = cls.from_pretrained(folder, dtype=torch_dtype)
        for f in folder.iterdir():
            f.unlink()
        model.save_pretrained(folder)
    finally:
        if bars:
            hf_log.enable_progress_bar()


# ----------------------------------------------------------------------------- the page cache
def evict(path: str | os.PathLike) -> bool:
    """Ask the kernel to drop this file's pages from the page cache (``posix_fadvise(DONTNEED)``), so
    the next read comes from the disk. False where the platform has no ``posix_fadvise``. Taught in day17_3."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def resident_bytes(path: str | os.PathLike) -> int | None:
    """Bytes of this file now in the page cache (``mincore`` on a fresh read-only mapping, which faults
    nothing in); None where ``mincore`` is not available. With ``evict`` before and this after, the
    difference is what a run paged in from the disk. Taught in day22_3."""
    import ctypes
    import ctypes.util
    import mmap as _mmap

    size = os.path.getsize(path)
    if size == 0:
        return 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    page = _mmap.PAGESIZE
    n = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, _mmap.PROT_READ, _mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = (ctypes.c_ubyte * n)()
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return None
            import numpy as np

            return int((np.frombuffer(vec, np.uint8) & 1).sum()) * page
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
