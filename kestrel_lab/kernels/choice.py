"""Which Q4_0 variant this machine decodes with: chosen by measuring, not by the ISA list alone.

The registry's ISA ladder (VNNI, then AVX2, else R32) is a default, not a fact: on the course's 2-vCPU
Sapphire Rapids VM the AVX2 ``vpmaddubsw`` kernel reads faster than the VNNI ``vpdpbusd`` one. So on first
use on a machine every row-grouped variant of ``kernels.variants`` the host can run is timed on the same
matrix — one decode matvec 1,024 wide, 27 MiB of Q4_0 weights (beyond L2, as a decode step's weights
are), all threads — and the fastest is used when it is **clearly** faster than the ladder's
choice: its median at least ``MARGIN`` below, and every one of its runs faster than every run of the default
(noise keeps the default). The choice and its timings are cached in ``kestrel_lab.paths.cache_dir()`` under
the machine's identity (CPU model, the features the registry selects by, the CPU count, numba's version and
the variant table), so another CPU measures again; ``KESTREL_Q4_LAYOUT`` still forces a layout,
``KESTREL_KERNEL_CHOICE=isa`` turns the measuring off and ``KESTREL_KERNEL_CHOICE=<variant>`` (e.g. ``v16_avx2``)
forces one variant. ``report()`` says what was measured and why.
Taught in day07_3.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from functools import lru_cache

import numba
import numpy as np

from kestrel_lab.atomic import write_json
from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import variants
from kestrel_lab.kernels.host import host_features
from kestrel_lab.paths import cache_dir

ENV = "KESTREL_KERNEL_CHOICE"        # "isa": the ladder only; a variant's name: that one; else (default): measure
MARGIN = 0.10                        # the winner's median must be this much below the default's
REPEATS = 7
ROWS, COLS = 3 * 8192 * 2, 1024      # 49,152 × 1,024 Q4_0 = 27 MiB: beyond L2, a decode step's kind of read
FILE = "kernel-choice.json"
SCHEMA = "kestrel-lab/kernel-choice/1"
SELECTING = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "dotprod", "i8mm")


def ladder(features: frozenset[str]) -> variants.Variant:
    """The ISA list's pick: the first ISA-specific row-grouped variant the host has, else R32."""
    special = [v for v in variants.VARIANTS if v.planes and v.isa != variants.PORTABLE and v.isa in features]
    return special[0] if special else variants.of("r32")


def identity(features: frozenset[str] | None = None) -> dict:
    """What a choice is valid for: a different CPU, feature set, core count, numba or variant table re-measures."""
    feats = host_features() if features is None else features
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            names = (ln.split(":", 1)[1].strip() for ln in fh if ln.lower().startswith(("model name", "cpu part")))
            model = next(names, "")
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": model or platform.processor(), "cpus": os.cpu_count(),
            "features": sorted(f for f in feats if f in SELECTING), "numba": numba.__version__,
            "variants": [v.name for v in variants.VARIANTS if v.planes]}


def key_of(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Choice:
    """The variant this machine uses, how it was chosen, and the timings behind it."""

    variant: variants.Variant
    how: str                                   # "measured", "isa" (ladder only), "forced"
    default: str                               # the ladder's variant name
    timings: dict[str, list[float]] = field(default_factory=dict)   # seconds per matvec, each repeat
    reason: str = ""
    identity: dict = field(default_factory=dict)

    def report(self) -> str:
        """The choice in words, with each candidate's median GB/s and spread."""
        lines = [f"Q4_0 variant: {self.variant.name} ({self.variant.instruction}) — {self.how}; {self.reason}"]
        nbytes = ROWS * COLS // 32 * 18
        for name, ts in sorted(self.timings.items(), key=lambda kv: np.median(kv[1])):
            med = float(np.median(ts))
            lines.append(f"  {name:<10} {nbytes / med / 1e9:6.1f} GB/s (median of {len(ts)}, spread "
                         f"{(max(ts) - min(ts)) / med:.0%})" + ("  ← ISA default" if name == self.default else ""))
        return "\n".join(lines)


def decide(timings: dict[str, list[float]], default: str, margin: float = MARGIN) -> tuple[str, str]:
    """(the variant to use, why): the fastest median wins only when it is ``margin`` below the default's and
    every one of its runs beats every run of the default; otherwise the default stays."""
    if default not in timings:
        return default, "the ISA default was not timed"
    med = {n: float(np.median(t)) for n, t in timings.items()}
    best = min(med, key=med.get)
    if best == default:
        return default, "the ISA default was also the fastest"
    gain = 1 - med[best] / med[default]
    if gain >= margin and max(timings[best]) < min(timings[default]):
        return best, f"{best} {gain:.0%} faster than the ISA default {default}, every run"
    return default, (f"{best} measured {gain:.0%} faster than {default}, not clearly (needs ≥ {margin:.0%} and "
                     f"every run faster): the ISA default stays")


def measure(candidates: list[variants.Variant], repeats: int = REPEATS, rows: int = ROWS,
            cols: int = COLS) -> dict[str, list[float]]:
    """Seconds of one decode matvec (all threads) per candidate, ``repeats`` times each, interleaved."""
    rng = np.random.default_rng(0)
    nb = cols // K.QK
    q4 = rng.integers(0, 256, size=(rows, nb, K.Q4_BYTES), dtype=np.uint8)
    q4[..., :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    q4 = q4.reshape(rows, nb * K.Q4_BYTES)
    x = rng.standard_normal((1, cols), dtype=np.float32)
    xq, xd, xc = np.empty((1, cols), np.int8), np.empty((1, nb), np.float32), np.empty((1, nb), np.int16)
    K.quantize_act(x, xq, xd)
    K.act_block_sums(xq, xc)
    planes, out = {}, np.empty(rows, np.float32)
    for v in candidates:
        if v.layout not in planes:
            G = v.rows_per_group
            nib, sc = np.empty((rows // G, nb * 16 * G), np.uint8), np.empty((rows // G, nb * G), np.uint16)
            v.repack(q4, nib, sc, K.n_chunks(rows // G))
            planes[v.layout] = (nib, sc)
    del q4
    times: dict[str, list[float]] = {v.name: [] for v in candidates}
    calls = {v.name: (v.matvec, planes[v.layout], K.n_chunks(rows // v.rows_per_group)) for v in candidates}
    for fn, (nib, sc), nch in calls.values():
        fn(nib, sc, xq, xc, xd, out, nch)                       # compile or load, and touch the pages
    for _ in range(repeats):
        for name, (fn, (nib, sc), nch) in calls.items():
            t0 = time.perf_counter()
            fn(nib, sc, xq, xc, xd, out, nch)
            times[name].append(time.perf_counter() - t0)
    return times


def _load(path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else {"schema": SCHEMA}
    except (OSError, ValueError):
        return {"schema": SCHEMA}


def choose(features: frozenset[str] | None = None, *, timer=measure, store: bool = True) -> Choice:
    """The choice for this host: from the cache file when its identity matches, else measured (and stored)."""
    feats = host_features() if features is None else features
    default = ladder(feats)
    ident = identity(feats)
    forced = os.environ.get(ENV, "").strip().lower()
    if forced == "isa":
        return Choice(default, "isa", default.name, reason=f"{ENV}=isa: the ISA list's pick", identity=ident)
    if forced in variants.BY_NAME:        # one variant by name, e.g. v16_avx2 for a same-ISA comparison
        v = variants.of(forced)
        if v not in variants.supported(feats):
            raise ValueError(f"{ENV}={forced}: this host cannot run it (it needs {v.isa})")
        return Choice(v, "forced", default.name, reason=f"{ENV}={forced}", identity=ident)
    path = cache_dir() / FILE
    doc, key = _load(path), key_of(ident)
    entry = doc.get(key)
    if not (isinstance(entry, dict) and entry.get("identity") == ident and entry.get("variant") in variants.BY_NAME):
        candidates = [v for v in variants.supported(feats) if v.planes]
        timings = timer(candidates)
        name, reason = decide(timings, default.name)
        entry = {"identity": ident, "variant": name, "timings": timings, "reason": reason,
                 "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if store:
            doc[key] = entry
            write_json(path, doc)
    return Choice(variants.of(entry["variant"]), "measured", default.name, entry["timings"], entry["reason"], ident)


@lru_cache(maxsize=None)
def current(features: frozenset[str] | None = None) -> Choice:
    """This process's choice for a host with ``features`` (default: this one's), measured once per machine and
    then read from the cache."""
    return choose(features)
