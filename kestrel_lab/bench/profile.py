"""Where one decode step's time goes: each part of the whole-step kernel timed alone, against the bytes it reads.

The engine's decode step is one numba call (``kernels.step``), so a Python profiler sees one line. Here each
part of it runs alone, over every layer, inside its own numba loop — the same kernels on the engine's own
planes and KV cache, in the same order — so the part's time is what it costs inside the step, without the
interpreter between calls: q/k/v (one ``matvec3``), o, gate/up with SwiGLU (one ``swiglu``), down, attention,
and the small operations (norms, activation quantization, q/k norm, RoPE, residual adds). The lm head and the
whole step are timed as the engine runs them. Each part's bytes are what it must read (weights, or the KV
cache), so bytes / time is the part's GB/s, beside the machine's read bandwidth: a part far below it is
where the step loses time. ``kestrel-lab bench`` prints the table. Taught in day23_1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import njit

from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import variants
from kestrel_lab.kernels.attention import attend
from kestrel_lab.kernels.rope import apply_rope
from kestrel_lab.kernels.step import _q8c_into

MATRIX_PARTS = ("q/k/v matvec", "o matvec", "gate/up + SwiGLU", "down matvec", "lm head")


@lru_cache(maxsize=None)
def make_part_loops(kind: str):
    """numba loops over every layer for each matrix part of the whole-step kernel of variant ``kind`` (the
    same stubs and slices as ``kernels.step.make_decode_layers``). Each returns nothing; it is timed."""
    G = variants.of(kind).rows_per_group

    @njit(cache=True)
    def qkv(planes, x, xq_buf, xd_buf, xc_buf, q, k, v, L, nt, pf):
        qn, qs, kn, ks, vn, vs = planes[0], planes[1], planes[2], planes[3], planes[4], planes[5]
        gq, gk = qn.shape[0] // L, kn.shape[0] // L
        xq, xc, xd = _q8c_into(x, xq_buf, xd_buf, xc_buf)
        for l in range(L):  # noqa: E741
            variants.matvec3(kind, qn[l * gq:(l + 1) * gq], qs[l * gq:(l + 1) * gq], kn[l * gk:(l + 1) * gk],
                             ks[l * gk:(l + 1) * gk], vn[l * gk:(l + 1) * gk], vs[l * gk:(l + 1) * gk],
                             xq, xc, xd, q, k, v, min(gq + 2 * gk, 4 * nt), pf)

    @njit(cache=True)
    def one(nib, sc, x, xq_buf, xd_buf, xc_buf, y, L, nt, pf):
        g = nib.shape[0] // L
        xq, xc, xd = _q8c_into(x, xq_buf, xd_buf, xc_buf)
        for l in range(L):  # noqa: E741
            variants.matvec(kind, nib[l * g:(l + 1) * g], sc[l * g:(l + 1) * g], xq, xc, xd, y, min(g, 4 * nt), pf)

    @njit(cache=True)
    def gate_up(gn, gs, un, us, x, xq_buf, xd_buf, xc_buf, out, L, nt, pf):
        g = gn.shape[0] // L
        xq, xc, xd = _q8c_into(x, xq_buf, xd_buf, xc_buf)
        for l in range(L):  # noqa: E741
            variants.swiglu(kind, gn[l * g:(l + 1) * g], gs[l * g:(l + 1) * g], un[l * g:(l + 1) * g],
                            us[l * g:(l + 1) * g], xq, xc, xd, out, min(g, 4 * nt), pf)

    assert G >= 1
    return qkv, one, gate_up


@njit(cache=True)
def _attention_loop(q, kc_all, vc_all, pos, o):
    for l in range(kc_all.shape[0]):  # noqa: E741
        attend(q, kc_all[l], vc_all[l], pos, o)


@njit(cache=True)
def _small_ops_loop(h, eps, attn_norm, ffn_norm, q_norm, k_norm, qk_norm, q, k, cos, sin, y, xq_buf, xd_buf,
                    xc_buf, inter_x):
    """Every small operation of the step, over all layers: 3 RMSNorms, 4 activation quantizations, q/k norm,
    RoPE and 2 residual adds per layer (their inputs are whatever the buffers hold: only the time counts)."""
    L, hid = attn_norm.shape
    x = np.empty((1, hid), np.float32)
    for l in range(L):  # noqa: E741
        K.rmsnorm(h, attn_norm[l], eps, x)
        _q8c_into(x, xq_buf, xd_buf, xc_buf)
        if qk_norm:
            K.rmsnorm_heads(q, q_norm[l], eps)
            K.rmsnorm_heads(k, k_norm[l], eps)
        apply_rope(q, cos, sin)
        apply_rope(k, cos, sin)
        _q8c_into(q.reshape(1, -1), xq_buf, xd_buf, xc_buf)
        for i in range(hid):
            h[0, i] += y[i]
        K.rmsnorm(h, ffn_norm[l], eps, x)
        _q8c_into(x, xq_buf, xd_buf, xc_buf)
        _q8c_into(inter_x, xq_buf, xd_buf, xc_buf)
        for i in range(hid):
            h[0, i] += y[i]


@dataclass
class Part:
    """One row of the table: seconds per step (median), bytes it reads per step."""

    name: str
    seconds: float
    nbytes: int

    @property
    def gbs(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("nan")


def _median_time(fn, repeat: int, evict=None) -> float:
    """Median seconds of ``fn`` after a warm-up; ``evict`` (a callable) runs before each timed call, so the
    part's bytes come from memory as they do inside the whole step, not from a cache the previous call warmed."""
    fn()                                       # warm: compiled
    ts = []
    for _ in range(repeat):
        if evict is not None:
            evict()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def evictor(nbytes: int):
    """A callable that reads ``nbytes`` of its own (all threads), pushing what came before out of the caches."""
    from kestrel_lab import roofline

    buf = np.ones(nbytes // 4, np.float32)
    chunks = roofline._n_chunks(nbytes, 8)
    return lambda: roofline._sum_chunks(buf, chunks)


def decode_parts(eng, repeat: int = 15, evict_bytes: int = 0) -> dict:
    """The table for ``eng`` (a Qwen3Engine on row-grouped Q4_0 planes) at its current position (at least one
    token already in the cache): {"parts": [Part], "step_s": the whole step as ``decode`` runs it, "sum_s": the
    parts added up, "layout": the variant}. ``evict_bytes``: read that many bytes before each timed call (see
    ``_median_time``; 0 = no eviction: a part's weights may then come from the cache). The cache and position
    are left as they were."""
    from kestrel_lab.kernels.linear import Activation
    from kestrel_lab.threads import numba_threads

    if eng._step is None:
        raise ValueError("decode_parts: this engine has no whole-step kernel (its layer matrices are not all "
                         "in row-grouped Q4_0 planes); profile it with the hand-made step of day23_1")
    c, pos = eng.config, eng.pos
    if pos < 1:
        raise ValueError("decode_parts: prefill at least one token first (attention needs a cache)")
    kind = next(v.name for v in variants.VARIANTS if v.planes and v.kernel_name("layers") == eng._step.name)
    qkv, one, gate_up = make_part_loops(kind)
    L, hid, inter = c.num_hidden_layers, c.hidden_size, c.intermediate_size
    H, KVH, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    P = eng._planes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, hid)).astype(np.float32)
    xi = rng.standard_normal((1, inter)).astype(np.float32)
    xo = rng.standard_normal((1, H * D)).astype(np.float32)
    n = max(hid, H * D, inter)
    bufs = (np.empty(n, np.int8), np.empty(n // K.QK, np.float32), np.empty(n // K.QK, np.int16))
    q, k, v = np.empty(H * D, np.float32), np.empty(KVH * D, np.float32), np.empty(KVH * D, np.float32)
    y, g = np.empty(hid, np.float32), np.empty(inter, np.float32)
    cos, sin = eng._rope_tables(1, None)
    h = np.array(eng._embed(np.array([0])), dtype=np.float32)
    pf = eng.prefetch_bytes                          # the step's prefetch distance (``kernels.choice``)
    with numba_threads(eng.threads) as nt:
        runs = {
            "q/k/v matvec": lambda: qkv(P[:6], x, *bufs, q, k, v, L, nt, pf),
            "o matvec": lambda: one(P[6], P[7], xo, *bufs, y, L, nt, pf),
            "gate/up + SwiGLU": lambda: gate_up(P[8], P[9], P[10], P[11], x, *bufs, g, L, nt, pf),
            "down matvec": lambda: one(P[12], P[13], xi, *bufs, y, L, nt, pf),
            "attention": lambda: _attention_loop(q.reshape(1, H, D), eng.cache.k, eng.cache.v, pos - 1,
                                                 np.empty((1, H, D), np.float32)),
            "small operations": lambda: _small_ops_loop(h, np.float32(c.rms_norm_eps), eng.attn_norm, eng.ffn_norm,
                                                        eng.q_norm, eng.k_norm, eng.qk_norm, q.reshape(1, H, D),
                                                        k.reshape(1, KVH, D), cos, sin, y, *bufs, xi),
            "lm head": lambda: eng.lm_head(Activation(x)),
        }
        ev = evictor(evict_bytes) if evict_bytes else None
        secs = {name: _median_time(fn, repeat, ev) for name, fn in runs.items()}
    step = _median_time(lambda: (eng.truncate(pos - 1), eng.decode(0)), repeat)
    eng.truncate(pos)
    kv = 2 * L * pos * KVH * D * eng.cache.k.itemsize
    nbytes = {"q/k/v matvec": sum(a.nbytes for a in P[:6]), "o matvec": P[6].nbytes + P[7].nbytes,
              "gate/up + SwiGLU": sum(a.nbytes for a in P[8:12]), "down matvec": P[12].nbytes + P[13].nbytes,
              "attention": kv, "small operations": 4 * (L * (3 * hid + 2 * (H + KVH) * D) + hid),
              "lm head": eng.lm_head.nbytes}
    parts = [Part(name, secs[name], int(nbytes[name])) for name in runs]
    return {"parts": parts, "step_s": step, "sum_s": sum(p.seconds for p in parts), "layout": kind,
            "threads": eng.threads, "pos": pos, "evict_bytes": int(evict_bytes)}


def profile_file(path, threads: int, prompt_len: int = 64, repeat: int = 15, evict_bytes: int = 512 << 20) -> dict:
    """``decode_parts`` of the model at ``path`` with ``threads`` threads after a ``prompt_len``-token prompt (the
    bench's), as plain data: {"parts": [{"name", "seconds", "bytes"}], "step_s", "sum_s", "layout", …}."""
    from kestrel_lab.engine import Qwen3Engine

    eng = Qwen3Engine.from_vqf(path, max_context=prompt_len + 8, threads=threads)
    rng = np.random.default_rng(1)                  # any ids do: the time of a step does not depend on them
    eng.prefill([int(t) for t in rng.integers(0, min(eng.config.vocab_size, 150_000), prompt_len)])
    prof = decode_parts(eng, repeat, evict_bytes)
    prof["parts"] = [{"name": p.name, "seconds": p.seconds, "bytes": p.nbytes} for p in prof["parts"]]
    return prof


def format_parts(prof: dict, read_gbs: float | None = None) -> str:
    """The per-part table: ms per step, share, MB read, GB/s and % of the read bandwidth."""
    parts = [p if isinstance(p, Part) else Part(p["name"], p["seconds"], p["bytes"]) for p in prof["parts"]]
    step = prof["step_s"]
    bw = f"{'% of bw':>9}" if read_gbs else ""
    ev = prof.get("evict_bytes") or 0
    how = (f"caches flushed with {ev >> 20} MiB before each part" if ev
           else "parts timed warm (their weights may sit in cache)")
    lines = [f"decode step by parts ({prof['layout']}, {prof['threads']} thread(s), position {prof['pos']}, {how}):",
             f"  {'part':<20}{'ms':>8}{'share':>8}{'MB read':>10}{'GB/s':>8}{bw}"]
    for p in sorted(parts, key=lambda p: -p.seconds):
        pct = f"{100 * p.gbs / read_gbs:>8.0f}%" if read_gbs else ""
        lines.append(f"  {p.name:<20}{1e3 * p.seconds:>8.3f}{p.seconds / prof['sum_s']:>8.1%}{p.nbytes / 1e6:>10.2f}"
                     f"{p.gbs:>8.1f}{pct}")
    total = sum(p.nbytes for p in parts)
    lines.append(f"  {'parts added up':<20}{1e3 * prof['sum_s']:>8.3f}{'':>8}{total / 1e6:>10.2f}"
                 f"{total / prof['sum_s'] / 1e9:>8.1f}")
    lines.append(f"  {'the whole step':<20}{1e3 * step:>8.3f}{'':>8}{total / 1e6:>10.2f}{total / step / 1e9:>8.1f}"
                 + (f"{100 * total / step / 1e9 / read_gbs:>8.0f}%" if read_gbs else ""))
    return "\n".join(lines)
