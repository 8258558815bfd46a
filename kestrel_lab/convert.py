"""safetensors → VQF in one pass: read, widen, stack, quantize, write — one chunk of rows at a time.

The plan (``kestrel_lab.vqf.layout.plan``) says which VQF entries a model has, their qtypes and
shapes, and which Hugging Face tensors build each one (the build rule: every source tensor reshaped
to ``(-1, cols)``, sources concatenated along rows — per-layer tensors stacked in layer order, a
Conv3d patch embedding flattened). The converter only executes that plan:

1. open the checkpoint (mmap, header parse only) and check, before writing a byte, that every
   source exists and splits into whole rows of the entry's width;
2. optionally hash the source files (SHA-256 of the weight files' bytes concatenated in file-name
   order — for a single file, exactly ``sha256sum model.safetensors``) for the signature block;
3. stream every entry through ``VQFWriter.write_tensor_parts``: for each source, chunks of rows
   (about ``chunk_values`` values each, a multiple of 8 rows so that the 8-row interleaved layout
   can be cut anywhere) are widened to float32 (bf16 through its bits), quantized by
   ``kestrel_lab.quant.quantize`` — the very function the engine's tests compare against — and
   handed to the writer; the pages already read are then dropped from the resident set
   (``madvise(MADV_DONTNEED)``), so memory stays near one chunk whatever the model's size.

Linear weights stay [out, in]: rows are output features and quantization blocks run along the
input dimension, which is what a matvec walks. Nothing is transposed.
Taught in day17_1.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kestrel_lab import quant as Q
from kestrel_lab.config import ModelConfig
from kestrel_lab.procfs import rss_bytes
from kestrel_lab.safetensors import Checkpoint, open_checkpoint, to_f32
from kestrel_lab.vqf.layout import plan, resolve_quant, source_rows, split_source

CHUNK_VALUES = 1 << 20  # values per chunk: 4 MB as float32


class ConversionError(ValueError):
    """The checkpoint does not fit the plan (a missing tensor, a shape that does not divide, …)."""


@dataclass
class ConversionReport:
    """What a conversion did and what it cost (figures for day17_1 and the CLI)."""
    source: Path
    output: Path
    quant: str
    n_tensors: int
    output_bytes: int
    source_bytes: int          # bytes of the safetensors files
    bytes_read: int            # tensor bytes read (a tied embedding is read twice)
    seconds: float             # conversion, without the optional hashing
    hash_seconds: float
    sha256: str | None         # of the source safetensors (recorded in the VQF's signature block)
    rss_start: int             # resident set size when the first tensor started, bytes
    rss_peak: int              # highest resident set size sampled between chunks, bytes
    unused: list[str] = field(default_factory=list)  # checkpoint tensors no entry uses
    output_sha256: str | None = None  # of the VQF file written (what `sha256sum model.vqf` prints)
    ignored: list[str] = field(default_factory=list)  # config.json keys no field reads (config_fields)

    @property
    def mb_per_s(self) -> float:
        """Source megabytes (1e6 bytes of safetensors files) converted per second."""
        return self.source_bytes / 1e6 / self.seconds if self.seconds > 0 else float("nan")

    @property
    def rss_growth(self) -> int:
        return max(0, self.rss_peak - self.rss_start)

    def summary(self) -> str:
        return (f"{self.output}: {self.n_tensors} tensors, {self.output_bytes:,} bytes ({self.quant}) from "
                f"{self.source_bytes:,} bytes of safetensors in {self.seconds:.2f} s "
                f"({self.mb_per_s:.1f} MB/s of source); resident memory +{self.rss_growth / 1e6:.1f} MB "
                f"(sampled between chunks; peak {self.rss_peak / 1e6:.1f} MB)"
                + (f"; source sha256 (safetensors) {self.sha256[:16]}…" if self.sha256 else "")
                + (f"; output sha256 (this VQF) {self.output_sha256[:16]}…" if self.output_sha256 else "")
                + (f" (hashing {self.hash_seconds:.2f} s)" if self.sha256 or self.output_sha256 else ""))


# ----------------------------------------------------------------------------- helpers
def source_sha256(ck: Checkpoint, block: int = 8 << 20) -> str:
    """SHA-256 of the checkpoint's weight files concatenated in file-name order. Taught in day17_1."""
    h = hashlib.sha256()
    buf = bytearray(block)
    view = memoryview(buf)
    for f in sorted(ck.files, key=lambda f: f.path.name):
        with open(f.path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                h.update(view[:n])
    return h.hexdigest()


def source_dtype(ck: Checkpoint) -> str:
    """The checkpoint's weight dtype ('bf16', 'f32', …, or 'mixed'), for the signature block.
    Taught in day17_1."""
    kinds = {t.dtype.lower() for t in ck.tensors.values()}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def check_sources(ck: Checkpoint, specs) -> dict[str, list[int]]:
    """Rows each source contributes to each entry; raises ``ConversionError`` naming the entry and the
    tensor if the checkpoint does not fit the plan. Taught in day15_2."""
    missing = [(s.name, src) for s in specs for src in s.sources if split_source(src)[0] not in ck.tensors]
    if missing:
        listed = ", ".join(f"{src} (for {name})" for name, src in missing[:4])
        raise ConversionError(f"{ck.folder}: {len(missing)} tensor(s) the plan needs are not in the checkpoint: "
                              f"{listed}{' …' if len(missing) > 4 else ''}")
    shapes = {name: t.shape for name, t in ck.tensors.items()}
    rows = {}
    for s in specs:
        for src in {split_source(x)[0] for x in s.sources}:
            t = ck.tensors[src]
            if t.dtype not in ("F32", "F16", "BF16", "F64"):
                raise ConversionError(f"{ck.file_of[src].path}: tensor {src!r} (file byte {t.file_offset}) has dtype "
                                      f"{t.dtype}; {s.name} needs floating-point weights")
        try:
            rows[s.name] = source_rows(s, shapes)   # the build rule's arithmetic, stated once in layout
        except ValueError as e:
            bad = next((b for b in (split_source(x)[0] for x in s.sources) if f"{b!r}" in str(e)), None)
            where = ck.file_of[bad].path if bad else ck.folder
            raise ConversionError(f"{where}: {e}") from None
    return rows


def _chunks(ck: Checkpoint, spec, qt: Q.QType, chunk_values: int, stats: dict) -> Iterator[np.ndarray]:
    """The entry's bytes, piece by piece: each source, reshaped to (-1, cols), in chunks of rows."""
    cols = spec.cols
    step = max(8, (chunk_values // cols) // 8 * 8)
    for piece in spec.sources:
        src, lo, hi = split_source(piece)              # a fused expert tensor contributes a row slice
        t = ck.tensors[src]
        flat = ck.raw(src).reshape(-1, cols)           # zero-copy: a view of the mapped file
        lo, hi = (0, flat.shape[0]) if lo is None else (lo, hi)
        item = t.nbytes // max(1, t.numel)
        for r0 in range(lo, hi, step):
            x = to_f32(flat[r0:min(hi, r0 + step)], t.dtype, where=f"{ck.file_of[src].path}: tensor {src!r}")
            with np.errstate(over="ignore"):   # F16 overflow is reported below, with its place
                out = Q.quantize(x, qt)
            if qt is Q.F16 and not np.isfinite(out.view("<f2")).all() and np.isfinite(x).all():
                bad = int(np.argmax(~np.isfinite(out.view("<f2"))))
                raise ConversionError(f"{ck.file_of[src].path}: tensor {src!r}: value {float(x.reshape(-1)[bad]):g} at "
                                      f"row {r0 + bad // cols} overflows F16 (entry {spec.name})")
            stats["bytes_read"] += x.size * item
            yield out
            del x
            ck.release(src, r0 * cols * item, min(hi, r0 + step) * cols * item)
            stats["rss_peak"] = max(stats["rss_peak"], rss_bytes())
        del flat


def expert_keys(ck: Checkpoint, cfg: ModelConfig) -> str:
    """How a Qwen3-MoE checkpoint stores its experts: "per_expert" (``mlp.experts.{e}.gate_proj.weight``
    …, what transformers' ``save_pretrained`` and the hub write) or "fused" (``mlp.experts.gate_up_proj``
    (E, 2·m, h) and ``mlp.experts.down_proj`` (E, h, m), transformers 5's in-memory form). Both
    convert to the same file. Taught in day22_2."""
    if cfg.arch == "qwen3_moe" and cfg.moe_layers:
        i = cfg.moe_layers[0]
        if f"model.layers.{i}.mlp.experts.gate_up_proj" in ck.tensors:
            return "fused"
    return "per_expert"


def _ignorable(name: str, cfg: ModelConfig) -> bool:
    """Checkpoint tensors that may be left out: a stored copy of a tied LM head (the plan builds
    ``q4_lm`` from the embedding) and rotary caches some exporters save."""
    return (name == "lm_head.weight" and cfg.tie_word_embeddings) or name.endswith("rotary_emb.inv_freq")


# ----------------------------------------------------------------------------- the conversion
def convert(hf_dir: str | os.PathLike, out_path: str | os.PathLike, quant: str = "q4_0", *,
            hash_source: bool = True, progress: Callable | bool | None = None,
            chunk_values: int = CHUNK_VALUES, model_name: str | None = None) -> ConversionReport:
    """Convert a Hugging Face checkpoint folder (config.json + safetensors) to one VQF file.

    ``quant``: q4_0 | q8_0 | f16 | f32 | q4_8x8l for the text matrices (the embedding is F16, F32 for
    an f32 file; norms, biases and the vision tower's F32 tensors stay F32; vision matrices are Q8_0
    in quantized files). ``hash_source`` records the SHA-256 of the weight files in the signature
    block (one more read of the files; the page cache then serves the conversion). Writes to a
    temporary file and renames it only when complete. Taught in day17_1.
    """
    from kestrel_lab.vqf.planner import plan_file
    from kestrel_lab.vqf.writer import VQFWriter

    hf_dir, out_path = Path(hf_dir), Path(out_path)
    qt = resolve_quant(quant)                     # the one reading of the quant name
    with open_checkpoint(hf_dir) as ck:
        cfg = ModelConfig.from_hf(ck.config_path)
        # the one plan: tensors, offsets, geometry (for MoE, from the experts' keys this checkpoint has);
        # a quantization that cannot hold a shape is refused here, before a byte is written
        try:
            fp = plan_file(cfg, qt, specs=plan(cfg, qt, experts=expert_keys(ck, cfg)))
        except ValueError as e:
            raise ConversionError(f"{ck.config_path}: --quant {qt.name.lower()}: {e}") from None
        specs = fp.specs
        check_sources(ck, specs)
        used = {split_source(src)[0] for s in specs for src in s.sources}
        unused = sorted(n for n in ck.tensors if n not in used)
        dropped = [n for n in unused if not _ignorable(n, cfg)]
        if dropped:
            f = ck.file_of[dropped[0]]
            raise ConversionError(f"{f.path}: tensor {dropped[0]!r} (file byte {f.tensors[dropped[0]].file_offset}) "
                                  f"has no place in the {cfg.arch} layout"
                                  + (f" (and {len(dropped) - 1} more)" if len(dropped) > 1 else "")
                                  + ": converting would silently drop weights (is config.json right?)")
        t0 = time.perf_counter()
        sha = source_sha256(ck) if hash_source else None
        hash_seconds = time.perf_counter() - t0 if hash_source else 0.0
        name = model_name or hf_dir.resolve().name
        name_raw = name.encode("utf-8")[:63]
        source = {"model": name_raw.decode("utf-8", "ignore"), "bytes": ck.nbytes(), "dtype": source_dtype(ck),
                  "n_files": len(ck.files)}
        if sha:
            source["sha256"] = sha
        stats = {"bytes_read": 0, "rss_peak": 0}
        t0 = time.perf_counter()
        with VQFWriter(out_path, fp, source=source, progress=progress) as w:
            rss0 = rss_bytes()
            stats["rss_peak"] = rss0
            for s in specs:
                w.write_tensor_parts(s.name, _chunks(ck, s, Q.qtype(s.qtype), chunk_values, stats))
        seconds = time.perf_counter() - t0
        out_sha = None
        if hash_source:
            t1 = time.perf_counter()
            with open(out_path, "rb") as fh:
                out_sha = hashlib.file_digest(fh, "sha256").hexdigest()
            hash_seconds += time.perf_counter() - t1
        return ConversionReport(
            source=hf_dir, output=out_path, quant=qt.name.lower(), n_tensors=len(specs),
            output_bytes=out_path.stat().st_size, source_bytes=ck.nbytes(), bytes_read=stats["bytes_read"],
            seconds=seconds, hash_seconds=hash_seconds, sha256=sha, rss_start=rss0,
            rss_peak=stats["rss_peak"], unused=unused, output_sha256=out_sha, ignored=list(cfg.ignored))


def source_pattern(sources: tuple[str, ...] | list[str]) -> str:
    """Sources written compactly: ``model.layers.{i}.mlp.up_proj.weight, i = 0..27`` when they differ
    only by one counter that runs 0, 1, 2, …; else the names joined by ' + '. Taught in day15_2."""
    if len(sources) == 1:
        return sources[0]
    split = [re.split(r"(\d+)", s) for s in sources]
    if all(len(p) == len(split[0]) for p in split):
        diff = [k for k in range(len(split[0])) if len({p[k] for p in split}) > 1]
        if len(diff) == 1 and diff[0] % 2 == 1:
            k = diff[0]
            nums = [int(p[k]) for p in split]
            if nums == list(range(nums[0], nums[0] + len(nums))):
                tmpl = list(split[0])
                tmpl[k] = "{i}"
                return f"{''.join(tmpl)}, i = {nums[0]}..{nums[-1]}"
    return " + ".join(sources)


def name_map(config: ModelConfig, quant: str = "q4_0") -> list[dict]:
    """The HF-name → VQF-entry table of a model, one row per entry, generated from the layout table
    (``kestrel_lab.vqf.layout.plan``): entry, qtype, rows × cols, the sources compactly, what it is.
    Taught in day15_2."""
    from kestrel_lab.vqf.layout import plan

    return [{"entry": s.name, "qtype": s.qtype_name, "rows": s.rows, "cols": s.cols,
             "n_sources": len(s.sources), "sources": source_pattern(s.sources), "role": s.role}
            for s in plan(config, quant)]


def name_map_markdown(config: ModelConfig, quant: str = "q4_0") -> str:
    """``name_map`` as a Markdown table (the book's name-map page and day15_2). Taught in day15_2."""
    lines = ["| # | VQF entry | qtype | rows × cols | built from (stacked along rows, in order) |",
             "|---:|---|---|---|---|"]
    for k, r in enumerate(name_map(config, quant)):
        lines.append(f"| {k} | `{r['entry']}` | {r['qtype']} | {r['rows']:,} × {r['cols']:,} | `{r['sources']}` |")
    return "\n".join(lines)
