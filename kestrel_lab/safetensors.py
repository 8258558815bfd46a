"""Our own reader (and a small writer) for Hugging Face safetensors checkpoints.

A safetensors file is ``<u64 N>`` (little-endian), then N bytes of UTF-8 JSON, then the data area. The
JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` with offsets relative
to the start of the data area, plus an optional ``"__metadata__"`` of string → string. The format's
rules, which this module checks (the ``safetensors`` package checks the same ones): the header fits in
the file, is a JSON object with no duplicate keys, each dtype is known, ``end - begin`` equals
``prod(shape) × itemsize``, and the tensors, sorted by offset, tile the data area exactly — no gap, no
overlap, nothing left over. Every rejection is a ``SafetensorsError`` naming the file, the tensor (or
field) and the byte offset in the file.

Tensors come back as zero-copy numpy views of a read-only ``mmap``: opening a 4 GB checkpoint costs one
header parse, and only the pages a caller touches are read. numpy has no bfloat16, so BF16 tensors are
viewed as ``uint16`` bit patterns (``raw``) and widened to float32 on request (``f32``, through
``kestrel_lab.quant.bf16_to_f32``, shared with the converter).

A checkpoint folder has either ``model.safetensors`` or ``model.safetensors.index.json`` (whose
``weight_map`` names the shard of each tensor); ``open_checkpoint`` hides the difference.
Taught in day15_1.
"""
from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from kestrel_lab.atomic import atomic_write
from kestrel_lab.limits import BOUND
from kestrel_lab.quant import bf16_to_f32, f32_to_bf16

# dtype name → (numpy storage dtype, itemsize). BF16 is stored as its bit pattern (uint16); the
# 8-bit floats are kept as raw bytes (nothing here converts them, but a checkpoint may carry them).
DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("|b1", 1), "U8": ("|u1", 1), "I8": ("|i1", 1),
    "F8_E4M3": ("|u1", 1), "F8_E5M2": ("|u1", 1),
    "U16": ("<u2", 2), "I16": ("<i2", 2), "F16": ("<f2", 2), "BF16": ("<u2", 2),
    "U32": ("<u4", 4), "I32": ("<i4", 4), "F32": ("<f4", 4),
    "U64": ("<u8", 8), "I64": ("<i8", 8), "F64": ("<f8", 8),
}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
MAX_HEADER = BOUND["safetensors.header_len"].hi  # 100 MiB, the safetensors package's own limit
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class SafetensorsError(ValueError):
    """A malformed safetensors file or checkpoint folder (the message names file, field and offset)."""


@dataclass(frozen=True)
class TensorInfo:
    """One header entry. ``begin``/``end`` are offsets in the data area; ``file_offset`` in the file."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    file_offset: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ----------------------------------------------------------------------------- header parsing
def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


class _Duplicate(Exception):
    pass


class _NotJson(Exception):
    pass


def _not_json(token: str):
    raise _NotJson(token)


def parse_header(head: bytes, file_size: int,
                 where: str = "<safetensors>") -> tuple[int, dict, dict[str, TensorInfo]]:
    """Validate the first bytes of a file; return (data_start, metadata, tensors by name).

    ``head`` must hold at least the 8-byte length and the JSON (more is fine). Tensors are checked
    against ``file_size``, so nothing past the header needs to be read. Taught in day15_1.
    """
    n = _header_length(head, file_size, where)
    doc = _header_json(bytes(head[8:8 + n]), where)
    data_start = 8 + n

    metadata = doc.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata   # absent or null; [] or "" are not a map
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise SafetensorsError(f"{where}: field '__metadata__' must map strings to strings")

    tensors = {name: _tensor_info(f"{where}: tensor {name!r}", name, e, data_start, file_size)
               for name, e in doc.items()}
    _check_tiling(tensors, data_start, file_size, where)
    return data_start, metadata, tensors


def _header_length(head: bytes, file_size: int, where: str) -> int:
    """The header's length N from the first 8 bytes, checked against the file and against ``head``."""
    if file_size < 8 or len(head) < 8:
        raise SafetensorsError(f"{where}: file is {file_size} bytes, too short for the 8-byte header length "
                               "at byte 0")
    n = int.from_bytes(head[:8], "little")
    if n > file_size - 8:
        raise SafetensorsError(f"{where}: header length {n} at byte 0 runs past the end of the file "
                               f"({file_size} bytes: at most {file_size - 8} bytes of header fit)")
    if n > MAX_HEADER:
        raise SafetensorsError(f"{where}: header length {n} at byte 0 exceeds the {MAX_HEADER}-byte limit")
    if n < 2:
        raise SafetensorsError(f"{where}: header length {n} at byte 0 cannot hold a JSON object")
    if len(head) < 8 + n:
        raise SafetensorsError(f"{where}: only {len(head)} of the {8 + n} header bytes were given")
    return n


def _header_json(raw: bytes, where: str) -> dict:
    """The header's ``raw`` bytes (file bytes 8..8+N) as a JSON object with no duplicate keys."""
    n = len(raw)
    if raw[:1] != b"{":
        raise SafetensorsError(f"{where}: header at byte 8 does not start with '{{' (got {raw[:1]!r})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"{where}: header is not UTF-8 (byte {8 + e.start}: {e.reason})") from None
    try:
        doc = json.loads(text.rstrip(" "), object_pairs_hook=_no_duplicates, parse_constant=_not_json)
    except _Duplicate as e:
        raise SafetensorsError(f"{where}: header (bytes 8..{8 + n}) names tensor {e.args[0]!r} twice") from None
    except _NotJson as e:   # Python's json reads NaN/Infinity; JSON (and the safetensors package) does not
        raise SafetensorsError(f"{where}: header (bytes 8..{8 + n}) is not valid JSON: {e.args[0]} is not a JSON "
                               f"value") from None
    except json.JSONDecodeError as e:
        pos = 8 + len(text[:e.pos].encode("utf-8"))
        raise SafetensorsError(f"{where}: header is not valid JSON at byte {pos}: {e.msg}") from None
    except RecursionError:
        raise SafetensorsError(f"{where}: header (bytes 8..{8 + n}) nests JSON deeper than the parser follows; "
                               f"expected a safetensors header (3 levels: name → entry → shape)") from None
    except ValueError as e:   # e.g. an integer of more than 4,300 digits
        raise SafetensorsError(f"{where}: header (bytes 8..{8 + n}) is not usable JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SafetensorsError(f"{where}: header at byte 8 is not a JSON object")
    return doc


def _tensor_info(tag: str, name: str, e, data_start: int, file_size: int) -> TensorInfo:
    """One header entry checked: its fields, a known dtype, a shape, offsets inside the data area that
    hold exactly ``prod(shape) × itemsize`` bytes. ``tag`` starts every message (file and tensor)."""
    if not isinstance(e, dict):
        raise SafetensorsError(f"{tag}: entry is not an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in e:
            raise SafetensorsError(f"{tag}: field '{key}' is missing")
    dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SafetensorsError(f"{tag}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    if (not isinstance(shape, list) or
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise SafetensorsError(f"{tag}: field 'shape' must be a list of non-negative integers, got {shape!r}")
    if (not isinstance(offs, list) or len(offs) != 2 or
            not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)):
        raise SafetensorsError(f"{tag}: field 'data_offsets' must be [begin, end] integers, got {offs!r}")
    begin, end = offs
    if end < begin:
        raise SafetensorsError(f"{tag}: data_offsets end {end} < begin {begin} (file byte {data_start + begin})")
    if end > file_size - data_start:
        raise SafetensorsError(f"{tag}: data ends at file byte {data_start + end}, past the end of the file "
                               f"({file_size} bytes)")
    want = math.prod(shape) * DTYPES[dtype][1]
    if want != end - begin:
        raise SafetensorsError(f"{tag}: shape {shape} × {dtype} needs {want} bytes but data_offsets give "
                               f"{end - begin} (file bytes {data_start + begin}..{data_start + end})")
    return TensorInfo(name, dtype, tuple(shape), begin, end, data_start + begin)


def _check_tiling(tensors: dict[str, TensorInfo], data_start: int, file_size: int, where: str) -> None:
    """The tensors must tile the data area: sorted by begin, each starts where the previous ended."""
    pos, prev = 0, None
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < pos:
            raise SafetensorsError(f"{where}: tensor {t.name!r} (file bytes {t.file_offset}..{data_start + t.end}) "
                                   f"overlaps tensor {prev!r}, which ends at file byte {data_start + pos}")
        if t.begin > pos:
            raise SafetensorsError(f"{where}: gap in the data area: file bytes {data_start + pos}..{t.file_offset} "
                                   f"before tensor {t.name!r} belong to no tensor")
        pos, prev = t.end, t.name
    if pos != file_size - data_start:
        raise SafetensorsError(f"{where}: file bytes {data_start + pos}..{file_size} after the last tensor "
                               f"belong to no tensor (the data area must end with the last tensor)")


# ----------------------------------------------------------------------------- one file
class SafetensorsFile:
    """One open safetensors file: a validated header and a read-only mmap of the data.

    ``raw(name)`` is a zero-copy view (BF16 as uint16); ``f32(name)`` widens to float32 (a copy).
    Use as a context manager, or call ``close()``; views handed out keep the mapping alive.
    Taught in day15_1.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        where = str(self.path)
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            first = fh.read(8)
            n = int.from_bytes(first, "little") if len(first) == 8 else 0
            head = first + (fh.read(n) if 0 < n <= min(MAX_HEADER, size - 8) else b"")
            self.data_start, self.metadata, self.tensors = parse_header(head, size, where)
            self.header_len = self.data_start - 8
            self.file_size = size
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self._buf = np.frombuffer(self._mm, dtype=np.uint8) if self._mm is not None else np.empty(0, np.uint8)

    # mapping-like access
    def keys(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy, read-only view in the stored dtype (BF16 → uint16 bits). Taught in day15_1."""
        t = self.info(name)
        storage = DTYPES[t.dtype][0]
        return self._buf[t.file_offset:t.file_offset + t.nbytes].view(storage).reshape(t.shape)

    def f32(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The tensor (or a slice of its first axis) as float32. Taught in day15_3."""
        t = self.info(name)
        a = self.raw(name)
        if rows is not None:
            a = a[rows]
        return to_f32(a, t.dtype, where=f"{self.path}: tensor {name!r}")

    def release(self, name: str, start: int = 0, stop: int | None = None) -> None:
        """Drop bytes ``[start, stop)`` of a tensor (default: all of it) from this process's resident
        set. The pages stay in the kernel's page cache and fault back in if touched again, so views
        stay valid. The converter calls this behind its read position, so that its resident memory
        stays near one chunk, not the whole checkpoint. Taught in day17_1.
        """
        if self._mm is None or not hasattr(self._mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        t = self.info(name)
        stop = t.nbytes if stop is None else min(stop, t.nbytes)
        page = mmap.PAGESIZE
        lo = ((t.file_offset + max(0, start)) // page) * page
        hi = min(-(-(t.file_offset + stop) // page) * page, self.file_size)
        if hi > lo:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def close(self) -> None:
        self._buf = np.empty(0, np.uint8)
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view is still alive; the mapping closes when it goes away
                pass
            self._mm = None

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SafetensorsFile({str(self.path)!r}, {len(self.tensors)} tensors, header {self.header_len} B)"


def open_safetensors(path: str | os.PathLike) -> SafetensorsFile:
    """Open and validate one ``.safetensors`` file. Taught in day15_1."""
    return SafetensorsFile(path)


def to_f32(a: np.ndarray, dtype: str, where: str = "tensor") -> np.ndarray:
    """Stored values → float32: BF16 through its bits, F16/F64 by numpy. Taught in day15_3."""
    if dtype == "BF16":
        return bf16_to_f32(a)
    if dtype in ("F32", "F16", "F64"):
        return np.asarray(a, dtype=np.float32)
    raise SafetensorsError(f"{where}: dtype {dtype} is not a floating-point type (need F32, F16 or BF16)")


# ----------------------------------------------------------------------------- a checkpoint folder
class Checkpoint:
    """A Hugging Face model folder: ``config.json`` plus one or several safetensors files.

    ``files`` lists the safetensors files (one, or the shards of the index); ``tensors`` maps each
    tensor name to its ``TensorInfo`` and ``file_of`` to the open file holding it. Taught in day15_1.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise SafetensorsError(f"{self.folder}: not a folder (expected a Hugging Face checkpoint folder)")
        index = self.folder / INDEX_NAME
        single = self.folder / SINGLE_NAME
        self._files: dict[str, SafetensorsFile] = {}
        self.file_of: dict[str, SafetensorsFile] = {}
        if index.exists():
            weight_map = self._read_index(index)
            for shard in sorted(set(weight_map.values())):
                shard_path = self.folder / shard
                if Path(shard).name != shard or not shard_path.is_file():
                    raise SafetensorsError(f"{index}: field 'weight_map' names shard {shard!r}, which is not a file "
                                           f"in {self.folder}")
                self._files[shard] = SafetensorsFile(shard_path)
            for name, shard in weight_map.items():
                f = self._files[shard]
                if name not in f.tensors:
                    raise SafetensorsError(f"{index}: weight_map puts tensor {name!r} in {shard}, "
                                           "which has no such tensor")
                self.file_of[name] = f
            for shard, f in self._files.items():
                extra = [k for k in f.tensors if weight_map.get(k) != shard]
                if extra:
                    raise SafetensorsError(f"{f.path}: tensor {extra[0]!r} "
                                           f"(file byte {f.tensors[extra[0]].file_offset}) "
                                           f"is not mapped to this shard by {INDEX_NAME}")
        elif single.exists():
            f = SafetensorsFile(single)
            self._files[SINGLE_NAME] = f
            self.file_of = {name: f for name in f.tensors}
        else:
            found = sorted(p.name for p in self.folder.glob("*.safetensors"))
            if len(found) == 1:
                f = SafetensorsFile(self.folder / found[0])
                self._files[found[0]] = f
                self.file_of = {name: f for name in f.tensors}
            else:
                raise SafetensorsError(f"{self.folder}: neither {SINGLE_NAME} nor {INDEX_NAME} found"
                                       + (f" (several .safetensors files without an index: {found})" if found else ""))
        self.tensors: dict[str, TensorInfo] = {n: f.tensors[n] for n, f in self.file_of.items()}

    @staticmethod
    def _read_index(index: Path) -> dict[str, str]:
        try:
            doc = json.loads(index.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicates)
        except _Duplicate as e:
            raise SafetensorsError(f"{index}: names tensor {e.args[0]!r} twice") from None
        except (ValueError, RecursionError) as e:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise SafetensorsError(f"{index}: not valid JSON: {e}") from None
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
            raise SafetensorsError(f"{index}: field 'weight_map' must map tensor names to shard file names")
        return wm

    @property
    def files(self) -> list[SafetensorsFile]:
        return list(self._files.values())

    @property
    def config_path(self) -> Path:
        return self.folder / "config.json"

    def config(self):
        """The folder's ``config.json`` as a ``kestrel_lab.config.ModelConfig``."""
        from kestrel_lab.config import ModelConfig
        return ModelConfig.from_hf(self.config_path)

    def keys(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.folder}: checkpoint has no tensor named {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        self.info(name)
        return self.file_of[name].raw(name)

    def f32(self, name: str, rows: slice | None = None) -> np.ndarray:
        self.info(name)
        return self.file_of[name].f32(name, rows)

    def release(self, name: str, start: int = 0, stop: int | None = None) -> None:
        if name in self.file_of:
            self.file_of[name].release(name, start, stop)

    def nbytes(self) -> int:
        """Total bytes of the safetensors files (headers included)."""
        return sum(f.file_size for f in self._files.values())

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.folder)!r}, {len(self.tensors)} tensors in {len(self._files)} file(s))"


def open_checkpoint(folder: str | os.PathLike) -> Checkpoint:
    """Open a Hugging Face checkpoint folder (single file or sharded). Taught in day15_1."""
    return Checkpoint(folder)


# ----------------------------------------------------------------------------- writing
def _as_entry(name: str, value) -> tuple[str, np.ndarray]:
    """Accept an ndarray (dtype from numpy) or (dtype_name, ndarray of the storage dtype)."""
    if isinstance(value, tuple):
        dtype, arr = value
        if dtype not in DTYPES:
            raise SafetensorsError(f"tensor {name!r}: unknown dtype {dtype!r}")
        arr = np.asarray(arr, dtype=DTYPES[dtype][0], order="C")
        return dtype, arr
    arr = np.asarray(value)
    native = arr.dtype.newbyteorder("=")
    for dtype, (storage, _) in DTYPES.items():
        if dtype not in ("BF16", "F8_E4M3", "F8_E5M2") and np.dtype(storage) == native:
            return dtype, np.asarray(arr, dtype=storage, order="C")
    raise SafetensorsError(f"tensor {name!r}: numpy dtype {arr.dtype} has no safetensors equivalent")


def header_bytes(tensors: Mapping[str, tuple[str, tuple[int, ...], int]],
                 metadata: Mapping[str, str] | None = None) -> bytes:
    """The 8-byte length and JSON header for tensors given as name → (dtype, shape, nbytes), laid out in
    the given order; the JSON is padded with spaces to a multiple of 8 bytes, as the safetensors package
    does, so that every tensor's data starts 8-byte aligned. Taught in day15_1."""
    doc: dict = {}
    if metadata:
        doc["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    pos = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    text = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def save_safetensors(path: str | os.PathLike, tensors: Mapping[str, object],
                     metadata: Mapping[str, str] | None = None) -> Path:
    """Write tensors (name → ndarray, or name → (dtype, storage array), e.g. ("BF16", uint16 bits)) in
    the given order, atomically. Taught in day15_1."""
    entries = {name: _as_entry(name, v) for name, v in tensors.items()}
    head = header_bytes({n: (d, a.shape, a.nbytes) for n, (d, a) in entries.items()}, metadata)
    with atomic_write(path, "wb") as fh:
        fh.write(head)
        for _, arr in entries.values():
            fh.write(memoryview(arr.reshape(-1).view(np.uint8)))
    return Path(path)


def bf16(x: np.ndarray) -> tuple[str, np.ndarray]:
    """float32 → ("BF16", bits) for ``save_safetensors`` (round to nearest even, as PyTorch).
    Taught in day15_3."""
    return "BF16", f32_to_bf16(np.asarray(x, dtype=np.float32))
