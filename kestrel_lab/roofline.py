"""The machine's ceilings: memory bandwidth, matvec and matmul FLOP/s, and the roofline they draw.

Decoding one token of a dense model reads every weight once and does about two FLOPs per weight, so
it is bound by memory bandwidth, not arithmetic. The first thing to know about a machine is therefore
how many bytes per second its cores can pull from DRAM; every later kernel is judged against that
ceiling (``decode_ceiling``), re-measured in the same run, never taken from a table.

Conventions: GB/s and GFLOP/s are decimal (1e9). Read bandwidth counts the bytes of the array summed;
copy bandwidth counts bytes read plus bytes written (the STREAM convention: the write-allocate reads
a cache line fetches before it is overwritten are not counted, so copy usually reports less than
read). Arrays are several times the last-level cache so the figures are DRAM figures, within an absolute
cap (``dram_working_set``: a lesson must fit an 8 GB laptop, and says when the cap keeps an array from
being DRAM-sized on a machine that reports a huge cache). Each figure is
the median of ``repeat`` timed runs after one untimed warm-up (which also compiles the numba kernels,
cached on disk with ``cache=True``).

The other ceiling of a kernel is its own instruction mix: ``int8_dot_peak`` runs the engine's Q4_0 ×
Q8_0 group function on a few KiB that stay in L1, so memory is out of the way, and reports integer
multiply-adds per second (and the GB/s of Q4_0 weights they amount to). A matvec is bound by the
smaller of the two.

Taught in day02_3 (bandwidth, the roofline) and day07_3 (the compute limit of the Q4 kernel).
"""
from __future__ import annotations

import math
import numbers
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

from kestrel_lab.kernels import ops as _K
from kestrel_lab.kernels import variants as _variants
from kestrel_lab.measure import timeit
from kestrel_lab.threads import numba_threads, resolve_threads  # noqa: F401  (lessons reach them here too)

GB = 1e9
MiB = 1 << 20

# Work units per thread for the parallel kernels, handed out dynamically
# (``numba.set_parallel_chunksize``): on a shared machine a thread that loses its core for a while
# then holds up one small unit, not a static half of the array. Each unit stays a long contiguous run.
_CHUNKS_PER_THREAD = 16
_MIN_CHUNK_BYTES = 1 << 20


# --------------------------------------------------------------------------------------- kernels
# The chunk loops index a slice from 0 rather than ``a[lo + j]``: numba then knows the index is not
# negative, drops the wrap-around check, and LLVM vectorizes the loop (3-4x faster on x86-64).
@njit(parallel=True, fastmath=True, cache=True)
def _sum_chunks(a, n_chunks):
    """Sum ``a`` in ``n_chunks`` contiguous pieces, one per parallel work unit.

    fastmath lets LLVM reorder the float additions, i.e. keep several vector accumulators: without it
    the loop is a chain of dependent adds and measures add latency, not memory.
    """
    n = a.shape[0]
    step = (n + n_chunks - 1) // n_chunks
    partial = np.zeros(n_chunks, dtype=np.float64)
    for c in prange(n_chunks):
        seg = a[c * step:min(n, c * step + step)]
        acc = np.float32(0.0)
        for j in range(seg.shape[0]):
            acc += seg[j]
        partial[c] = acc
    return partial.sum()


@njit(parallel=True, cache=True)
def _copy_chunks(dst, src, n_chunks):
    n = src.shape[0]
    step = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        s = src[c * step:min(n, c * step + step)]
        d = dst[c * step:min(n, c * step + step)]
        for j in range(s.shape[0]):
            d[j] = s[j]


@njit(parallel=True, cache=True)
def _fill_chunks(a, value, n_chunks):
    # First touch from the worker threads, so pages are mapped the way the kernels will read them.
    n = a.shape[0]
    step = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        seg = a[c * step:min(n, c * step + step)]
        for j in range(seg.shape[0]):
            seg[j] = value


@njit(parallel=True, fastmath=True, cache=True)
def _matvec_f32(w, x, y):
    """y = w @ x for a row-major f32 matrix: one row per work item, a contiguous dot per row."""
    rows, cols = w.shape
    for r in prange(rows):
        acc = np.float32(0.0)
        for k in range(cols):
            acc += w[r, k] * x[k]
        y[r] = acc


# --------------------------------------------------------------------------------------- helpers
@contextmanager
def _dynamic_schedule(chunksize: int):
    """Let idle numba threads take the next ``chunksize`` iterations of a prange; restore after."""
    previous = numba.set_parallel_chunksize(max(1, int(chunksize)))
    try:
        yield
    finally:
        numba.set_parallel_chunksize(previous)


def _n_chunks(nbytes: int, threads: int) -> int:
    return max(1, min(threads * _CHUNKS_PER_THREAD, nbytes // _MIN_CHUNK_BYTES))


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache of cpu0 from /sys (None when the OS does not say).

    Bandwidth arrays must be several times this, or the figure is a cache figure. Taught in day02_3.
    """
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    best = None
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            text = (idx / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].isalpha() else text
        try:
            size = int(digits) * scale
        except ValueError:
            continue
        best = size if best is None else max(best, size)
    return best


# A "DRAM-sized" working set: several times the last-level cache, so a kernel reads it from memory,
# but never more than DRAM_SET_CAP, so every lesson fits an 8 GB laptop. Machines (VMs above all) may
# report hundreds of MiB of L3: 4× that would be gigabytes per array. A lesson that gets less than it
# wanted says so (``WorkingSet.note``) and draws no DRAM conclusion it cannot back (``streams``).
DRAM_SET_CAP = 256 * MiB
ASSUMED_LLC = 32 * MiB      # when /sys does not say: a generous laptop L3
STREAM_MULTIPLE = 2         # from 2× the LLC on, a sweep evicts (nearly) everything it read


@dataclass(frozen=True)
class WorkingSet:
    """The size ``dram_working_set`` chose for one array and why: ``nbytes`` to allocate; ``wanted``
    (``multiple`` × the LLC, at least ``floor``); ``llc`` as /sys reports it (None: unknown); ``cap``."""
    nbytes: int
    wanted: int
    llc: int | None
    multiple: float
    cap: int

    @property
    def capped(self) -> bool:
        """True when the cap held the set below what the lesson wanted."""
        return self.nbytes < self.wanted

    @property
    def llc_ratio(self) -> float | None:
        """The set over the reported last-level cache (None when the LLC is unknown)."""
        return self.nbytes / self.llc if self.llc else None

    @property
    def streams(self) -> bool | None:
        """Whether a sweep over the set must come from DRAM: ≥ ``STREAM_MULTIPLE`` × the reported LLC
        (None when the LLC is unknown)."""
        return None if not self.llc else self.nbytes >= STREAM_MULTIPLE * self.llc

    def sized(self, nbytes: int) -> "WorkingSet":
        """The same rule judged on the bytes really allocated (rows rounded, or given by the caller)."""
        return replace(self, nbytes=int(nbytes))

    def rows(self, row_bytes: int, align: int = 1) -> int:
        """Rows of ``row_bytes`` that make the set, a multiple of ``align``: rounded up to reach what was
        wanted, down to stay under the cap."""
        n = -(-self.nbytes // row_bytes) if not self.capped else self.nbytes // row_bytes
        n = -(-n // align) * align if not self.capped else n // align * align
        return max(align, n)

    def note(self, what: str = "工作集", why: str = "好让本篇在 8 GB 内存的笔记本电脑上也跑得动") -> str:
        """One sentence for the lesson to print: the size against the LLC, whether it was capped (and
        ``why``), and whether it must stream from memory."""
        mib = self.nbytes / MiB
        if not self.llc:
            return (f"{what} {mib:.0f} MiB；这台机器的 /sys 没有报告末级缓存，按 {ASSUMED_LLC // MiB} MiB 估算，"
                    f"数据是否从内存来无从确认。")
        text = f"{what} {mib:.0f} MiB，是本机报告的末级缓存 {self.llc / MiB:.0f} MiB 的 {self.llc_ratio:.2f} 倍"
        if self.capped:
            text += (f"（想要 ≥ {self.multiple:g} 倍即 {self.wanted / MiB:.0f} MiB，"
                     f"封顶 {self.cap / MiB:.0f} MiB，{why}）")
        if self.streams:
            return text + "：每遍都要从内存读。"
        return (text + f"：不到 {STREAM_MULTIPLE} 倍，一部分可能留在缓存里，测到的未必是内存的速度"
                "（虚拟机报告的缓存常常不是它真有的）。")


def dram_working_set(multiple: float = 4, floor: int = 0, cap: int = DRAM_SET_CAP,
                     llc: int | None = None) -> WorkingSet:
    """The bytes of one "DRAM-sized" array: ``multiple`` × the last-level cache (``ASSUMED_LLC`` when
    /sys does not say), at least ``floor``, at most ``cap`` (the cap wins) — the one rule every kernel
    lesson sizes its big matrices with, so none needs gigabytes where a VM reports a huge L3. ``llc``
    replaces what /sys says (0: unknown). Taught in day02_3."""
    _check_positive("multiple", multiple, float)
    _check_positive("cap", cap)
    reported = last_level_cache_bytes() if llc is None else (llc or None)
    wanted = max(int(floor), int(multiple * (reported or ASSUMED_LLC)))
    return WorkingSet(min(wanted, int(cap)), wanted, reported, float(multiple), int(cap))


def _check_positive(name: str, value, kind=int):
    """Raise a clear error unless ``value`` is a positive int (kind=int) or positive finite number."""
    allowed = (int, np.integer) if kind is int else (numbers.Real,)
    if isinstance(value, bool) or not isinstance(value, allowed):
        what = "an int" if kind is int else "a number"
        raise TypeError(f"{name} must be {what}, not {type(value).__name__}")
    if not math.isfinite(value) or not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")


# ----------------------------------------------------------------------------------- measurements
def _check_kernels(chunks: int) -> None:
    """Compile (or load from the cache) the kernels and check them on a small array first."""
    a = np.random.default_rng(1).random(100_003, dtype=np.float32)
    ref = float(np.sum(a, dtype=np.float64))
    got = _sum_chunks(a, chunks)
    if not abs(got - ref) <= 1e-4 * ref:
        raise RuntimeError(f"sum kernel returned {got}, numpy says {ref}")
    b = np.zeros_like(a)
    _copy_chunks(b, a, chunks)
    if not np.array_equal(a, b):
        raise RuntimeError("copy kernel did not copy the array")


def memory_bandwidth(threads: int | None = None, size_mb: int = 256, repeat: int = 5) -> dict:
    """Measure DRAM read and copy bandwidth with numba ``prange`` kernels.

    ``size_mb`` MiB of float32 are summed (read) and copied into a second array of the same size
    (copy = bytes read + bytes written). ``threads=None`` uses numba's default thread count; the
    caller's thread count is restored afterwards. Returns ``read_gbs``, ``copy_gbs`` (medians of
    ``repeat`` runs), ``read_gbs_best``/``copy_gbs_best`` (fastest run), their spreads
    ((max - min) / median) and samples, ``threads``, ``bytes`` (one
    array), ``repeat`` and ``llc_bytes`` (the last-level cache, to judge whether the array was big
    enough). Taught in day02_3.
    """
    _check_positive("size_mb", size_mb)
    _check_positive("repeat", repeat)
    nbytes = int(size_mb) * MiB
    n = nbytes // 4
    with numba_threads(threads) as nt, _dynamic_schedule(1):
        chunks = _n_chunks(nbytes, nt)
        src = np.empty(n, dtype=np.float32)
        dst = np.empty(n, dtype=np.float32)
        _check_kernels(chunks)
        _fill_chunks(src, np.float32(1.0), chunks)
        _fill_chunks(dst, np.float32(0.0), chunks)
        read = timeit(lambda: _sum_chunks(src, chunks), repeat=repeat, warmup=1)
        copy = timeit(lambda: _copy_chunks(dst, src, chunks), repeat=repeat, warmup=1)
        if dst[-1] != 1.0 or dst[0] != 1.0:
            raise RuntimeError("copy kernel did not copy")
    return {
        "read_gbs": nbytes / read.median / GB,
        "copy_gbs": 2 * nbytes / copy.median / GB,
        "read_gbs_best": nbytes / read.best / GB,
        "copy_gbs_best": 2 * nbytes / copy.best / GB,
        "read_spread": read.spread,
        "copy_spread": copy.spread,
        "read_seconds": read.samples,
        "copy_seconds": copy.samples,
        "threads": nt,
        "bytes": nbytes,
        "repeat": int(repeat),
        "llc_bytes": last_level_cache_bytes(),
    }


def matvec_gflops(rows: int = 4096, cols: int = 4096, threads: int | None = None, repeat: int = 5,
                  seed: int = 0) -> dict:
    """GFLOP/s of an f32 matvec y = W @ x, numpy's (BLAS) and a numba ``prange`` version.

    A matvec does 2·rows·cols FLOPs and reads 4·rows·cols bytes of W: 0.5 FLOP per byte, so on any
    modern CPU it is memory-bound and its GFLOP/s is about half the read GB/s. ``threads`` sets
    numba's threads only; numpy's BLAS uses its own pool (``OPENBLAS_NUM_THREADS`` at start-up).
    Returns both GFLOP/s and the equivalent GB/s of W, the FLOPs, the bytes, the arithmetic
    intensity and ``max_abs_diff`` between the two results. Taught in day02_3.
    """
    _check_positive("rows", rows)
    _check_positive("cols", cols)
    _check_positive("repeat", repeat)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols), dtype=np.float32)
    x = rng.standard_normal(cols, dtype=np.float32)
    y = np.empty(rows, dtype=np.float32)
    flops = 2 * rows * cols
    nbytes = w.nbytes + x.nbytes + y.nbytes
    with numba_threads(threads) as nt, _dynamic_schedule(rows // (nt * _CHUNKS_PER_THREAD)):
        t_np = timeit(lambda: np.matmul(w, x, out=y), repeat=repeat, warmup=1)
        y_np = y.copy()
        t_nb = timeit(lambda: _matvec_f32(w, x, y), repeat=repeat, warmup=1)
    diff = float(np.max(np.abs(y - y_np)))
    return {
        "numpy_gflops": flops / t_np.median / GB,
        "numba_gflops": flops / t_nb.median / GB,
        "numpy_gbs": nbytes / t_np.median / GB,
        "numba_gbs": nbytes / t_nb.median / GB,
        "numpy_spread": t_np.spread,
        "numba_spread": t_nb.spread,
        "rows": int(rows),
        "cols": int(cols),
        "threads": nt,
        "flops": flops,
        "bytes": nbytes,
        "intensity": flops / nbytes,
        "max_abs_diff": diff,
        "repeat": int(repeat),
    }


def matmul_gflops(n: int = 1024, repeat: int = 5, seed: int = 0) -> dict:
    """GFLOP/s of numpy's f32 n×n matmul: the compute roof the BLAS library reaches here.

    A matmul does 2n³ FLOPs on 12n² bytes, so its intensity (n/6 FLOP/byte) is far right of the
    ridge and it measures arithmetic, not memory. Uses numpy's BLAS threads. Taught in day02_3.
    """
    _check_positive("n", n)
    _check_positive("repeat", repeat)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    t = timeit(lambda: np.matmul(a, b, out=c), repeat=repeat, warmup=1)
    flops = 2 * n ** 3
    nbytes = 3 * a.nbytes
    return {"gflops": flops / t.median / GB, "spread": t.spread, "n": int(n), "flops": flops,
            "bytes": nbytes, "intensity": flops / nbytes, "repeat": int(repeat)}


# ------------------------------------------------------------------------------------ the model
def attainable_gflops(intensity, peak_gflops: float, bandwidth_gbs: float):
    """The roofline: min(peak, intensity × bandwidth), for a scalar or an array of intensities.

    Taught in day02_3.
    """
    _check_positive("peak_gflops", peak_gflops, float)
    _check_positive("bandwidth_gbs", bandwidth_gbs, float)
    return np.minimum(peak_gflops, np.asarray(intensity, dtype=np.float64) * bandwidth_gbs)


def ridge_intensity(peak_gflops: float, bandwidth_gbs: float) -> float:
    """FLOP per byte where a kernel stops being memory-bound: peak / bandwidth. Taught in day02_3."""
    _check_positive("peak_gflops", peak_gflops, float)
    _check_positive("bandwidth_gbs", bandwidth_gbs, float)
    return peak_gflops / bandwidth_gbs


def decode_ceiling(weight_bytes_per_token: int, read_gbs: float) -> float:
    """Tokens/s that a bandwidth-bound decode cannot exceed: read bandwidth / bytes read per token.

    Each decoded token streams every weight matrix from memory once (the KV cache and activations
    are small beside them at short contexts), so no kernel, however clever, beats this figure on
    this machine. Taught in day02_3.
    """
    _check_positive("weight_bytes_per_token", weight_bytes_per_token)
    _check_positive("read_gbs", read_gbs, float)
    return read_gbs * GB / weight_bytes_per_token


def weights_read_per_token(config: dict, block_bytes: int = 18, block_values: int = 32,
                           norm_bytes: int = 4) -> dict:
    """Bytes a dense Qwen3 decode step reads, from a HF ``config.json`` dict.

    Every matrix (q, k, v, o, gate, up, down of each layer, and the lm head, which is the tied
    embedding when ``tie_word_embeddings``) is stored in a block format of ``block_bytes`` per
    ``block_values`` weights (Q4_0: 18 B per 32; Q8_0: 34 B per 32); the RMSNorm weights (two per
    layer, q/k norms, the final one) are f32. The token embedding row looked up per token is ignored
    (one row). Returns the breakdown and ``total``. Taught in day02_3.
    """
    def need(key):
        if key not in config:
            raise KeyError(f"config has no field {key!r} (a Qwen3 config.json is expected)")
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"config field {key!r} must be a positive integer, got {value!r}")
        return value

    hidden = need("hidden_size")
    inter = need("intermediate_size")
    layers = need("num_hidden_layers")
    heads = need("num_attention_heads")
    kv_heads = need("num_key_value_heads")
    vocab = need("vocab_size")
    head_dim = config.get("head_dim") or hidden // heads
    _check_positive("block_bytes", block_bytes)
    _check_positive("block_values", block_values)
    shapes = {
        "q": (heads * head_dim, hidden), "k": (kv_heads * head_dim, hidden),
        "v": (kv_heads * head_dim, hidden), "o": (hidden, heads * head_dim),
        "gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter),
    }
    for name, (r, c) in shapes.items():
        if c % block_values:
            raise ValueError(f"matrix {name}: {c} columns is not a multiple of the block size {block_values}")
    per_layer_weights = sum(r * c for r, c in shapes.values())
    layer_matrix_bytes = layers * per_layer_weights // block_values * block_bytes
    lm_head_weights = vocab * hidden
    lm_head_bytes = lm_head_weights // block_values * block_bytes
    norm_values = layers * (2 * hidden + 2 * head_dim) + hidden
    norms = norm_values * norm_bytes
    return {
        "per_layer_weights": per_layer_weights,
        "layer_matrix_bytes": layer_matrix_bytes,
        "lm_head_weights": lm_head_weights,
        "lm_head_bytes": lm_head_bytes,
        "norm_bytes": norms,
        "total": layer_matrix_bytes + lm_head_bytes + norms,
    }



# ----------------------------------------------------------------------------- the compute limit
# The engine's Q4 decode kernels, run on a few row groups that stay in L1: memory is then (almost) free,
# and what is left is the kernel's own instruction mix — its compute limit. The group index varies
# with the iteration so that LLVM cannot hoist the work out of the timing loop.
@lru_cache(maxsize=None)
def _make_peak(name: str):
    """The compute-limit loop over variant ``name``'s row groups (its ``group`` function, resolved from
    ``kernels.variants`` while numba compiles the loop)."""
    rows = _variants.of(name).rows_per_group

    @njit(parallel=True, fastmath=True, cache=True)
    def peak(nib, sc, xq, xc, xd, iters, last):
        G = nib.shape[0]
        x32 = xq[0].view(np.int32)
        for u in prange(last.shape[0]):
            F = np.empty(rows, np.float32)
            Si = np.empty(sc.shape[1], np.int32)
            Sf = Si.view(np.float32)
            for it in range(iters):
                g = (it + u) % G
                _variants.group(name, nib[g], sc[g], xq[0], x32, xc[0], xd[0], F, Si, Sf)
            last[u, :] = F
    return peak


Q4_0_BYTES_PER_WEIGHT = 18 / 32     # fp16 scale + 16 bytes of nibbles per 32 weights


def _peak_case(layout: str, cols: int, groups: int, seed: int = 0):
    """Random Q4_0 rows split into ``layout``'s planes, a Q8_0 activation, and the loop of the variant the
    registry picks for ``layout`` on this host."""
    from kestrel_lab.kernels.registry import select

    isa = select(layout, "one").isa
    v = next(v for v in _variants.VARIANTS if v.layout == layout and v.isa == isa)
    qr = v.rows_per_group
    rng = np.random.default_rng(seed)
    rows, nb = groups * qr, cols // _K.QK
    q4 = rng.integers(0, 256, size=(rows, nb, _K.Q4_BYTES), dtype=np.uint8)
    q4[..., :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)     # a sane fp16 scale
    q4 = q4.reshape(rows, nb * _K.Q4_BYTES)
    x = rng.standard_normal((1, cols), dtype=np.float32)
    xq, xd, xc = np.empty((1, cols), np.int8), np.empty((1, nb), np.float32), np.empty((1, nb), np.int16)
    _K.quantize_act(x, xq, xd)
    _K.act_block_sums(xq, xc)
    nib, sc = np.empty((groups, nb * 16 * qr), np.uint8), np.empty((groups, nb * qr), np.uint16)
    v.repack(q4, nib, sc, 1)
    name = f"{v.group.py_func.__module__.removeprefix('kestrel_lab.')}.{v.group.__name__} ({v.instruction})"
    return {"q4": q4, "nib": nib, "sc": sc, "xq": xq, "xc": xc, "xd": xd, "kernel": _make_peak(v.name),
            "name": name, "rows_per_group": qr}


def int8_dot_peak(threads: int | None = None, layout: str | None = None, cols: int = 512, groups: int = 2,
                  repeat: int = 5, seconds: float = 0.05) -> dict:
    """The compute limit of the engine's Q4_0 × Q8_0 decode kernel: multiply-adds per second on L1 data.

    Runs the kernel's own inner function (one row group × one token: ``kernels.ops._group_r32`` or
    ``kernels.v16``'s group, per ``layout``; default ``registry.q4_load_layout()``, what the engine
    uses here) over ``groups`` row groups of ``cols`` columns — a few KiB, resident in L1 — on one
    work unit per thread, so the figure is the instruction mix's speed with memory out of the way.
    ``weight_gbs`` is the same figure in the bandwidth's units (Q4_0: 18 bytes per 32 weights): the
    GB/s of weights the kernel could consume if DRAM were infinitely fast. A matvec cannot exceed
    min(read bandwidth, ``weight_gbs``). Each timed run lasts about ``seconds``; figures are medians
    of ``repeat`` runs after a warm-up. Returns ``gmacs``, ``gmacs_per_thread``, ``weight_gbs``,
    ``weight_gbs_per_thread``, ``spread``, ``samples``, ``threads``, ``layout``, ``kernel``,
    ``resident_bytes``, ``iters``. Taught in day07_3.
    """
    from kestrel_lab.kernels.registry import q4_load_layout

    _check_positive("cols", cols)
    _check_positive("groups", groups)
    _check_positive("repeat", repeat)
    _check_positive("seconds", seconds, float)
    if cols % _K.QK:
        raise ValueError(f"cols must be a multiple of {_K.QK}, got {cols}")
    layout = layout or q4_load_layout()
    if layout not in _variants.PLANE_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, _variants.PLANE_LAYOUTS))}, got {layout!r}")
    case = _peak_case(layout, cols, groups)
    kernel, qr = case["kernel"], case["rows_per_group"]
    args = (case["nib"], case["sc"], case["xq"], case["xc"], case["xd"])
    with numba_threads(threads) as nt:
        last = np.empty((nt, qr), np.float32)
        kernel(*args, groups, last)                          # compile / load, and warm the caches
        iters = 256
        while True:                                           # calibrate: a run of about ``seconds``
            t = timeit(lambda: kernel(*args, iters, last), repeat=1, warmup=0).best
            if t >= seconds / 4 or iters >= 1 << 30:
                break
            iters *= 4
        iters = max(1, int(iters * seconds / max(t, 1e-9)))
        timing = timeit(lambda: kernel(*args, iters, last), repeat=repeat, warmup=1)
    macs = nt * iters * qr * cols
    gmacs = macs / timing.median / GB
    return {
        "gmacs": gmacs,
        "gmacs_per_thread": gmacs / nt,
        "weight_gbs": gmacs * Q4_0_BYTES_PER_WEIGHT,
        "weight_gbs_per_thread": gmacs * Q4_0_BYTES_PER_WEIGHT / nt,
        "spread": timing.spread,
        "samples": timing.samples,
        "threads": nt,
        "layout": layout,
        "kernel": case["name"],
        "resident_bytes": case["nib"].nbytes + case["sc"].nbytes + case["xq"].nbytes,
        "iters": iters,
        "cols": int(cols),
        "repeat": int(repeat),
    }
