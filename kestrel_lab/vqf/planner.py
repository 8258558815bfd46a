"""Plan a VQF file from a config alone: every entry's offset and size, data_offset, file_len.

Everything in the header and the directory follows from the tensor list: the data area starts at
the first page boundary after the directory, and each tensor starts at the previous one's end
rounded up to 64 bytes (the writer's chain, article 16-3). So the header and directory of a 2.3 GB
file can be produced — and its ``od`` dump reproduced byte for byte — without a single weight.

Taught in day16_3.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kestrel_lab import seam
from kestrel_lab.atomic import atomic_write
from kestrel_lab.config import ModelConfig
from kestrel_lab.vqf import format as F
from kestrel_lab.quant import QType
from kestrel_lab.vqf.layout import TensorSpec, has_repacked, plan, resolve_quant


@dataclass(frozen=True)
class PlannedEntry:
    """A planned tensor and its offset. Taught in day16_3."""
    spec: TensorSpec
    offset: int

    @property
    def end(self) -> int:
        return self.offset + self.spec.nbytes


@dataclass
class FilePlan:
    """A VQF file's geometry: what the writer writes and the reader will find. Taught in day16_3."""

    config: ModelConfig
    quant: QType | None     # of the text matrices (``layout.resolve_quant``); VQFSig records its name
    entries: list[PlannedEntry]
    data_offset: int
    file_len: int

    @property
    def specs(self) -> list[TensorSpec]:
        return [e.spec for e in self.entries]

    @property
    def n_tensors(self) -> int:
        return len(self.entries)

    @property
    def file_size(self) -> int:
        return self.file_len + F.TRAILER_BYTES

    @property
    def dir_bytes_sum(self) -> int:
        return sum(e.spec.nbytes for e in self.entries)

    @property
    def flags(self) -> int:
        flags = F.FLAG["FNV_TRAILER"]
        if self.config.vision is not None:
            flags |= F.FLAG["VISION"]
        if has_repacked(self.specs):
            flags |= F.FLAG["REPACKED_8X8"]
        return flags

    def directory_bytes(self) -> bytes:
        """The n × 64 directory bytes (the first thing the checksum covers)."""
        return b"".join(F.pack_entry(e.spec.name, e.spec.qtype, e.spec.rows, e.spec.cols, e.offset,
                                     e.spec.nbytes) for e in self.entries)

    def header_bytes(self, source: dict | None = None, created: int | None = None) -> bytes:
        """Header + VQFSig + padding + directory + padding: the file's first ``data_offset`` bytes."""
        head = F.pack_header(self.config, flags=self.flags, n_tensors=self.n_tensors,
                             data_offset=self.data_offset, file_len=self.file_len, source=source,
                             quant=self.quant.name.lower() if self.quant else "", created=created)
        head += F.pack_rope_block(self.config)                   # 432..448: zero unless RoPE is scaled
        out = head + b"\x00" * (F.DIR_OFFSET - len(head)) + self.directory_bytes()
        return out + b"\x00" * (self.data_offset - len(out))

    def write_header(self, path: str | Path, created: int | None = None) -> Path:
        """Write only the first ``data_offset`` bytes of the planned file (for ``od``; a reader
        rejects it as truncated, which is the point of ``file_len``). Taught in day16_3."""
        with atomic_write(path) as fh:
            fh.write(self.header_bytes(created=created))
        return Path(path)

    def to_json(self) -> dict:
        """``{"data_offset", "file_len", "file_size", "tensors": [{name, qtype, rows, cols, offset, bytes}]}``."""
        return {
            "data_offset": self.data_offset,
            "file_len": self.file_len,
            "file_size": self.file_size,
            "tensors": [{"name": e.spec.name, "qtype": e.spec.qtype, "rows": e.spec.rows, "cols": e.spec.cols,
                         "offset": e.offset, "bytes": e.spec.nbytes} for e in self.entries],
        }

    def table(self) -> str:
        """The article's map: one line per entry."""
        lines = [f"{'#':>3}  {'name':<16} {'qtype':<8} {'rows':>10} × {'cols':<6} {'offset':>14} {'bytes':>14}"]
        for i, e in enumerate(self.entries):
            s = e.spec
            lines.append(f"[{i:2}] {s.name:<16} {s.qtype_name:<8} {s.rows:>10,} × {s.cols:<6,} {e.offset:>14,} "
                         f"{s.nbytes:>14,}")
        lines.append(f"data_offset={self.data_offset:,}  dir bytes sum={self.dir_bytes_sum:,}  "
                     f"file_len={self.file_len:,}  file size={self.file_size:,}")
        return "\n".join(lines)


def chain(specs: list[TensorSpec]) -> tuple[list[PlannedEntry], int, int]:
    """Lay specs out: (entries with offsets, data_offset, file_len). Taught in day16_3."""
    if len(specs) > F.MAX_TENSORS:
        raise F.VQFFormatError(f"{len(specs)} tensors; the format allows at most {F.MAX_TENSORS}")
    seen = set()
    for s in specs:
        if s.name in seen:
            raise F.VQFFormatError(f"tensor name {s.name!r} appears twice in the plan")
        seen.add(s.name)
    data_offset = F.data_offset_for(len(specs))
    mine = seam.get("vqf.chain_offsets")          # a student's piece (``kestrel_lab.seam``), else ours
    if mine is not None:
        offsets, end = mine([s.nbytes for s in specs], data_offset)
        offsets = [int(o) for o in offsets]
        if len(offsets) != len(specs):
            raise F.VQFFormatError(f"piece vqf.chain_offsets gave {len(offsets)} offsets for {len(specs)} tensors")
        return [PlannedEntry(s, o) for s, o in zip(specs, offsets)], data_offset, int(end)
    entries, off, end = [], data_offset, data_offset
    for s in specs:
        entries.append(PlannedEntry(s, off))
        end = off + s.nbytes
        off = F.round_up(end, F.TENSOR_ALIGN)
    return entries, data_offset, end


def plan_file(config: ModelConfig | str | Path | dict, quant: "str | QType | None" = "q4_0",
              specs: list[TensorSpec] | None = None) -> FilePlan:
    """Plan the file of ``config`` (a ModelConfig, a config.json path or dict): the tensors, their
    offsets and the file's geometry — the one plan the writer then writes. ``specs`` overrides the
    tensor list (tests, hand-made files); with ``quant=None`` the quant is then the qtype of their
    ``q4_q`` entry, if any. Taught in day16_3."""
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_hf(config)
    if quant is None and specs is not None:
        q = next((resolve_quant(s.qtype_name) for s in specs if s.name == "q4_q"), None)
    else:
        q = resolve_quant(quant)
    specs = plan(config, q) if specs is None else list(specs)
    entries, data_offset, file_len = chain(specs)
    return FilePlan(config, q, entries, data_offset, file_len)


def plan_json(config, quant: str = "q4_0") -> str:
    """``plan_file(...).to_json()`` as text."""
    return json.dumps(plan_file(config, quant).to_json(), indent=1)
