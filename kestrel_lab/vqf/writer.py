"""Write a VQF file tensor by tensor, in one pass, never holding more than one tensor.

The plan fixes every offset before the first weight is read, so the header and the directory are
written first and never patched; the FNV-1a 64 runs alongside the writes (directory, then each
tensor and the zero padding after it), and the 8-byte trailer closes the file. Everything goes to a
temporary file beside the target, renamed over it only when the last byte is written: an
interrupted conversion leaves nothing behind.

The writer is a small state machine (as gguf-py's): tensors must come in plan order, each exactly
once, each with exactly the planned number of bytes; anything else is refused with a message saying
what was expected.

Taught in day17_1.
"""
from __future__ import annotations

import contextlib
import os
import struct
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from kestrel_lab.atomic import new_temp_file
from kestrel_lab.config import ModelConfig
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf.checksum import FNV_OFFSET, fnv1a64
from kestrel_lab.vqf.layout import TensorSpec
from kestrel_lab.vqf.planner import FilePlan, plan_file

Progress = Callable[[str, int, int], None]  # (tensor name, bytes written so far, total bytes)


class VQFWriteError(ValueError):
    """A call the writer's state does not allow (order, duplicates, sizes). Taught in day17_1."""


def print_progress(name: str, done: int, total: int, _state={"t0": None}) -> None:  # one _state for all calls
    """A one-line progress report on stderr (``progress=True``). Taught in day17_1."""
    if _state["t0"] is None or done == 0:
        _state["t0"] = time.perf_counter()
    dt = max(time.perf_counter() - _state["t0"], 1e-9)
    end = "\n" if done >= total else ""
    print(f"\r  {done / 1e6:10,.1f} / {total / 1e6:,.1f} MB  {done / dt / 1e6:7.1f} MB/s  {name:<18}",
          end=end, file=sys.stderr, flush=True)


class VQFWriter:
    """Stream a planned file into ``path``. Use as a context manager::

        fp = plan_file(config, "q4_0")
        with VQFWriter(path, fp, source={"model": "Qwen/Qwen3-VL-2B-Instruct"}) as w:
            for spec in fp.specs:
                w.write_tensor(spec.name, quantize(weights_of(spec), spec.qtype))

    ``plan``: the ``planner.FilePlan`` to write (its entries, offsets and quant name for VQFSig): the
    writer never plans on its own, so what was planned is what lands on disk.
    ``source`` keys (all optional): model, sha256 (hex), bytes, dtype, n_files — stored in VQFSig.
    ``progress``: a callable (name, done, total) or True for a line on stderr. Taught in day17_1.
    """

    def __init__(self, path: str | os.PathLike, plan: FilePlan, source: dict | None = None,
                 progress: Progress | bool | None = None, created: int | None = None):
        if not isinstance(plan, FilePlan):
            raise TypeError(f"{path}: VQFWriter takes a planner.FilePlan (plan_file(config, quant)), "
                            f"not {type(plan).__name__}")
        self.path = Path(path)
        self.config = plan.config
        self.plan = plan
        self.source = source
        self.created = created
        self.progress: Progress | None = print_progress if progress is True else (progress or None)
        self._fh = None
        self._tmp: str | None = None
        self._next = 0           # index of the next entry to write
        self._pos = 0            # bytes written to the file so far
        self._hash = FNV_OFFSET
        self._done = False
        self.seconds = 0.0
        self._t0 = 0.0

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "VQFWriter":
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def open(self) -> None:
        if self._fh is not None or self._done:
            raise VQFWriteError(f"{self.path}: writer already {'finished' if self._done else 'open'}")
        # Build the header before creating anything: a config that does not fit fails cleanly.
        head = self.plan.header_bytes(source=self.source, created=self.created)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = new_temp_file(self.path)
        self._fh = os.fdopen(fd, "wb", buffering=1 << 20)
        self._t0 = time.perf_counter()
        self._fh.write(head)
        self._pos = len(head)
        d = F.DIR_OFFSET
        self._hash = fnv1a64(np.frombuffer(head, dtype=np.uint8)[d:d + F.ENTRY_SIZE * self.plan.n_tensors])
        if self.progress:
            self.progress("", 0, self.plan.file_len)

    def abort(self) -> None:
        """Drop the temporary file (on any error inside the ``with`` block)."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
        if self._tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None

    def close(self) -> Path:
        """Check every planned tensor was written, append the checksum, fsync, rename."""
        if self._done:
            return self.path
        self._require_open("close")
        if self._next != self.plan.n_tensors:
            missing = [e.spec.name for e in self.plan.entries[self._next:]]
            self.abort()
            raise VQFWriteError(f"{self.path}: closed after {self._next} of {self.plan.n_tensors} tensors; "
                                f"missing {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}")
        assert self._pos == self.plan.file_len, (self._pos, self.plan.file_len)
        try:
            self._fh.write(struct.pack("<Q", self._hash))
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None
            os.replace(self._tmp, self.path)
            self._tmp = None
        except BaseException:
            self.abort()
            raise
        self._done = True
        self.seconds = time.perf_counter() - self._t0
        return self.path

    @property
    def checksum(self) -> int:
        """The FNV-1a 64 so far (the trailer, once closed)."""
        return self._hash

    # ------------------------------------------------------------------ tensors
    def _require_open(self, what: str) -> None:
        if self._done:
            raise VQFWriteError(f"{self.path}: {what}: the file is already closed")
        if self._fh is None:
            raise VQFWriteError(f"{self.path}: {what}: the writer is not open (use it in a `with` block)")

    def _expect(self, name: str):
        self._require_open(f"write_tensor({name!r})")
        names = [e.spec.name for e in self.plan.entries]
        if self._next >= len(names):
            raise VQFWriteError(f"{self.path}: write_tensor({name!r}): all {len(names)} planned tensors are "
                                f"already written; close the writer")
        entry = self.plan.entries[self._next]
        if name != entry.spec.name:
            if name in names[:self._next]:
                why = f"{name!r} was already written (entry {names.index(name)})"
            elif name in names:
                why = f"{name!r} is entry {names.index(name)}, out of order"
            else:
                why = f"{name!r} is not in the plan"
            raise VQFWriteError(f"{self.path}: {why}; expected {entry.spec.name!r} "
                                f"(entry {self._next} of {len(names)})")
        return entry

    @staticmethod
    def _bytes_of(name: str, data) -> np.ndarray:
        arr = np.asarray(data)
        if arr.dtype != np.uint8:
            raise VQFWriteError(f"{name}: expected the tensor's bytes as uint8, got {arr.dtype} "
                                f"(convert with kestrel_lab.quant.quantize(x, qtype))")
        return np.ascontiguousarray(arr).reshape(-1)

    def _emit(self, arr: np.ndarray) -> None:
        if arr.size:
            self._fh.write(memoryview(arr))
            self._hash = fnv1a64(arr, self._hash)
            self._pos += arr.size

    def _finish(self, entry, written: int) -> None:
        s = entry.spec
        if written != s.nbytes:
            raise VQFWriteError(f"{self.path}: {s.name}: got {written:,} bytes, the plan says {s.nbytes:,} "
                                f"({s.qtype_name} {s.rows}×{s.cols})")
        self._next += 1
        if self._next < self.plan.n_tensors:
            pad = self.plan.entries[self._next].offset - self._pos
            self._emit(np.zeros(pad, dtype=np.uint8))
        if self.progress:
            self.progress(s.name, self._pos, self.plan.file_len)

    def write_tensor(self, name: str, data: np.ndarray) -> None:
        """Write the next planned tensor's bytes (uint8, any shape, C order). Taught in day17_1."""
        entry = self._expect(name)
        arr = self._bytes_of(name, data)
        if arr.size != entry.spec.nbytes:  # check before writing: a refused call leaves the file intact
            self._finish(entry, arr.size)
        self._emit(arr)
        self._finish(entry, arr.size)

    def write_tensor_parts(self, name: str, parts: Iterable[np.ndarray]) -> None:
        """Write the next planned tensor from pieces (e.g. one layer at a time, rows concatenated):
        only one piece is in memory at once. Taught in day17_1."""
        entry = self._expect(name)
        written = 0
        try:
            for part in parts:
                arr = self._bytes_of(name, part)
                if written + arr.size > entry.spec.nbytes:
                    raise VQFWriteError(f"{self.path}: {name}: parts exceed the planned {entry.spec.nbytes:,} "
                                        f"bytes ({entry.spec.qtype_name} {entry.spec.rows}×{entry.spec.cols})")
                self._emit(arr)
                written += arr.size
            self._finish(entry, written)
        except BaseException:
            # Some bytes of this tensor may be on disk already: the file cannot be completed.
            self.abort()
            raise

    @property
    def expected(self) -> str | None:
        """Name of the next tensor to write (None when all are written)."""
        return self.plan.entries[self._next].spec.name if self._next < self.plan.n_tensors else None


def write_vqf(path, config: ModelConfig, tensors: dict[str, np.ndarray] | Callable[[TensorSpec], np.ndarray],
              specs: list[TensorSpec], quant: "str | None" = None, **kw) -> Path:
    """Write a whole file from a dict (or a function) giving each spec's bytes."""
    get = tensors.__getitem__ if isinstance(tensors, dict) else tensors
    with VQFWriter(path, plan_file(config, quant, specs), **kw) as w:
        for s in specs:
            w.write_tensor(s.name, get(s.name) if isinstance(tensors, dict) else get(s))
    return Path(path)
