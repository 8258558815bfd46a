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

The same goes for how far ahead the ``Q4_0_V16`` decode kernels prefetch (``kernels.v16.PREFETCH_CHOICES``:
2 KiB, or none): +30 % decode on the course's Xeon VM, but a 7–10 % slower step at 1 thread on its AMD EPYC VM,
whose prefetchers already follow the stream. After the variant, each distance is timed on that variant's whole
decode step over ``PREFETCH_LAYERS`` layers of Qwen3-0.6B's shapes (random weights, read from memory), in
interleaved rounds; no prefetch replaces the default only when its median is ``PREFETCH_MARGIN`` lower and it
wins ``PREFETCH_WINS`` of the rounds.
``KESTREL_PREFETCH_BYTES=<n>`` forces a distance. Taught in day07_3.
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
from kestrel_lab.kernels import step
from kestrel_lab.kernels import v16 as V
from kestrel_lab.kernels import variants
from kestrel_lab.kernels.host import host_features
from kestrel_lab.paths import cache_dir

ENV = "KESTREL_KERNEL_CHOICE"        # "isa": the ladder only; a variant's name: that one; else (default): measure
MARGIN = 0.10                        # the winner's median must be this much below the default's
REPEATS = 7
ROWS, COLS = 3 * 8192 * 2, 1024      # 49,152 × 1,024 Q4_0 = 27 MiB: beyond L2, a decode step's kind of read
FILE = "kernel-choice.json"
SCHEMA = "kestrel-lab/kernel-choice/2"          # 2: with the prefetch distance (a /1 file is measured again)
PREFETCH_ENV = "KESTREL_PREFETCH_BYTES"
PREFETCH_MARGIN = 0.03                         # the other distance's median must be this much below the default's
STEP_SHAPES = {"hidden": 1024, "heads": 16, "kv_heads": 8, "head_dim": 128, "inter": 3072}   # Qwen3-0.6B
PREFETCH_LAYERS = 16                           # layers of the step timed for the prefetch distance (~168 MB)
PREFETCH_REPEATS = 31
PREFETCH_WINS = 2 / 3                          # share of paired rounds the other distance must win
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
    prefetch_bytes: int = V.PREFETCH_BYTES     # how far ahead the V16 decode kernels prefetch (0: none)
    prefetch_timings: dict[str, list[float]] = field(default_factory=dict)   # distance → seconds per step
    prefetch_reason: str = "not measured: the default"

    def report(self) -> str:
        """The choice in words, with each candidate's median GB/s and spread, then the prefetch distance."""
        lines = [f"Q4_0 variant: {self.variant.name} ({self.variant.instruction}) — {self.how}; {self.reason}"]
        lines += _timing_lines(self.timings, ROWS * COLS // 32 * 18, self.default, "ISA default")
        lines.append(f"prefetch: {_distance(self.prefetch_bytes)} — {self.prefetch_reason}")
        lines += _timing_lines(self.prefetch_timings, _step_bytes(), str(V.PREFETCH_BYTES),
                               "default", label=lambda d: f"{d} B ahead" if int(d) else "none")
        return "\n".join(lines)


def _step_bytes(layers: int = PREFETCH_LAYERS) -> int:
    """Q4_0 bytes one timed step of ``measure_prefetch`` reads (its seven matrices per layer)."""
    hid, H, KVH, D, inter = (STEP_SHAPES[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "inter"))
    weights = hid * (H * D + 2 * KVH * D) + H * D * hid + 3 * hid * inter
    return layers * weights // K.QK * K.Q4_BYTES


def _distance(nbytes: int) -> str:
    return f"{nbytes} bytes ahead" if nbytes else "none (the hardware prefetchers alone)"


def _timing_lines(timings: dict[str, list[float]], nbytes: int, default: str, tag: str, label=str) -> list[str]:
    out = []
    for name, ts in sorted(timings.items(), key=lambda kv: np.median(kv[1])):
        med = float(np.median(ts))
        out.append(f"  {label(name):<12} {nbytes / med / 1e9:6.1f} GB/s (median of {len(ts)}, spread "
                   f"{(max(ts) - min(ts)) / med:.0%})" + (f"  ← {tag}" if name == default else ""))
    return out


def _median_winner(timings: dict[str, list[float]], default: str) -> tuple[str, float]:
    """(the candidate with the lowest median, how much lower its median is than ``default``'s, as a share)."""
    med = {n: float(np.median(t)) for n, t in timings.items()}
    best = min(med, key=med.get)
    return best, 1 - med[best] / med[default]


def decide(timings: dict[str, list[float]], default: str, margin: float = MARGIN) -> tuple[str, str]:
    """(the variant to use, why): the fastest median wins only when it is ``margin`` below the default's and
    every one of its runs beats every run of the default; otherwise the default stays."""
    if default not in timings:
        return default, "the ISA default was not timed"
    best, gain = _median_winner(timings, default)
    if best == default:
        return default, "the ISA default was also the fastest"
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


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)                  # the engine's weights are read-only: the same compiled step
    return a


def measure_prefetch(variant: variants.Variant, distances=V.PREFETCH_CHOICES, repeats: int = PREFETCH_REPEATS,
                     layers: int = PREFETCH_LAYERS) -> dict[str, list[float]]:
    """Seconds of one decode step of ``variant``'s whole-step kernel (``kernels.step``, all threads) per prefetch
    distance, ``repeats`` interleaved rounds: ``layers`` layers of Qwen3-0.6B's shapes (``STEP_SHAPES``) with
    random weights, ~9 MB each, so they come from memory as in decode. A decode step, not a matvec alone:
    on the course's EPYC VM a step ran 7–10 % faster without prefetching at 1 thread while matvecs timed
    alone over the same bytes showed no difference either way."""
    hid, H, KVH, D, inter = (STEP_SHAPES[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "inter"))
    rng = np.random.default_rng(1)
    G, L = variant.rows_per_group, layers
    scale = np.float16(0.01).view(np.uint16)
    planes = []
    for rows, cols in ((H * D, hid), (KVH * D, hid), (KVH * D, hid), (hid, H * D), (inter, hid), (inter, hid),
                       (hid, inter)):          # q, k, v, o, gate, up, down: any bytes are valid nibbles
        nb = cols // K.QK
        planes += [_frozen(rng.integers(0, 256, size=(L * rows // G, nb * 16 * G), dtype=np.uint8)),
                   _frozen(np.full((L * rows // G, nb * G), scale, np.uint16))]
    ones = _frozen(np.ones((L, hid), np.float32))
    qk = _frozen(np.ones((L, D), np.float32))
    no_bias = _frozen(np.zeros((L, 0), np.float32))
    pos = 64
    kc, vc = np.zeros((L, KVH, pos + 8, D), np.float32), np.zeros((L, KVH, pos + 8, D), np.float32)
    ang = (pos * 10000.0 ** (-np.arange(D // 2) / (D // 2)))[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    h0 = (0.1 * rng.standard_normal((1, hid))).astype(np.float32)
    h = h0.copy()
    fn, nt = step.make_decode_layers(variant.name), numba.get_num_threads()

    def one_step(d):
        h[:] = h0
        fn(h, np.float32(1e-6), ones, ones, qk, qk, (no_bias, no_bias, no_bias), True, False, tuple(planes), kc, vc,
           pos, cos, sin, H, nt, d)

    times: dict[str, list[float]] = {str(d): [] for d in distances}
    for d in distances:
        one_step(d)                                                # compile or load, and touch the pages
    for r in range(repeats):
        for d in (distances if r % 2 == 0 else distances[::-1]):   # alternate which goes first
            t0 = time.perf_counter()
            one_step(d)
            times[str(d)].append(time.perf_counter() - t0)
    return times


def decide_prefetch(timings: dict[str, list[float]], default: int = V.PREFETCH_BYTES,
                    margin: float = PREFETCH_MARGIN) -> tuple[int, str]:
    """(the distance to use, why): another distance replaces the default only when its median is ``margin``
    below the default's and it was faster in at least ``PREFETCH_WINS`` of the interleaved rounds (this VM
    kind's bandwidth swings between rounds, so the rounds are compared pairwise, not every run against every
    run; 21 wins of 31 happen by chance in fewer than 4 % of fair trials)."""
    d0 = str(default)
    if d0 not in timings:
        return default, "the default distance was not timed"
    best, gain = _median_winner(timings, d0)
    if best == d0:
        return default, "measured; the default was also the fastest"
    wins = sum(a < b for a, b in zip(timings[best], timings[d0]))
    n = len(timings[d0])
    if gain >= margin and wins >= PREFETCH_WINS * n:
        return int(best), f"measured; {gain:.0%} faster than {default} bytes ahead, in {wins} of {n} rounds"
    return default, (f"measured; {_distance(int(best))} was {gain:.0%} faster, in {wins} of {n} rounds: not clearly "
                     f"(needs ≥ {margin:.0%} in ≥ {PREFETCH_WINS:.0%} of the rounds), so the default stays")


def _load(path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else {"schema": SCHEMA}
    except (OSError, ValueError):
        return {"schema": SCHEMA}


def choose(features: frozenset[str] | None = None, *, timer=measure, prefetch_timer=measure_prefetch,
           store: bool = True) -> Choice:
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
    if not (isinstance(entry, dict) and entry.get("identity") == ident and entry.get("variant") in variants.BY_NAME
            and isinstance(entry.get("prefetch_bytes"), int)):
        candidates = [v for v in variants.supported(feats) if v.planes]
        timings = timer(candidates)
        name, reason = decide(timings, default.name)
        entry = {"identity": ident, "variant": name, "timings": timings, "reason": reason}
        if variants.of(name).prefetches:
            entry["prefetch_timings"] = prefetch_timer(variants.of(name))
            entry["prefetch_bytes"], entry["prefetch_reason"] = decide_prefetch(entry["prefetch_timings"])
        else:
            entry.update(prefetch_bytes=V.PREFETCH_BYTES, prefetch_timings={},
                         prefetch_reason=f"{name}'s kernels do not prefetch")
        entry["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if store:
            doc[key] = entry
            write_json(path, doc)
    return Choice(variants.of(entry["variant"]), "measured", default.name, entry["timings"], entry["reason"], ident,
                  entry["prefetch_bytes"], entry.get("prefetch_timings", {}), entry.get("prefetch_reason", ""))


def prefetch_bytes() -> int:
    """How far ahead this host's ``Q4_0_V16`` decode kernels prefetch: ``KESTREL_PREFETCH_BYTES`` when set, else
    the measured choice (``current``)."""
    forced = os.environ.get(PREFETCH_ENV, "").strip()
    if forced:
        if not forced.isdigit():
            raise ValueError(f"{PREFETCH_ENV}={forced!r}: expected a number of bytes ≥ 0 (0: no prefetch)")
        return int(forced)
    return current(host_features()).prefetch_bytes


@lru_cache(maxsize=None)
def current(features: frozenset[str] | None = None) -> Choice:
    """This process's choice for a host with ``features`` (default: this one's), measured once per machine and
    then read from the cache."""
    return choose(features)
