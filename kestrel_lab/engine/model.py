"""The Qwen3 dense model on top of the kernels: load a VQF file, prefill, decode, return logits.

One layer (day12_1), exactly as ``transformers``' ``Qwen3DecoderLayer``::

    x = RMSNorm(h) · attn_norm
    q, k, v = Wq x, Wk x, Wv x          (q: heads × D, k/v: kv_heads × D)
    q, k = RMSNorm_per_head(q)·q_norm, RMSNorm_per_head(k)·k_norm      ← Qwen3's addition
    q, k = RoPE(q, pos), RoPE(k, pos)   (rotate-half, theta from the config)
    cache[pos] = k, v ;  o = GQA-attention(q, cache[0..pos])
    h = h + Wo o
    x = RMSNorm(h) · ffn_norm ;  h = h + Wdown (silu(Wgate x) · Wup x)

then ``logits = Wlm · RMSNorm(h)·final_norm`` (``q4_lm``; for tied embeddings the VQF stores the
quantized copy of the embedding there, so the lm head is always one matrix read).

Weights stay where the file put them: ``open_vqf`` maps the file and every matrix is a read-only
numpy view of the mapping (zero copy; pages come from the OS page cache on first touch, which is why
a second start is fast). F32/F16/Q8_0 and Q4_8X8L (``--quant q4_8x8l``, the 64-lane kernel) are
used in place. Plain Q4_0 is the exception, stated plainly: by default (``interleave=True``) each
Q4_0 matrix whose per-layer row count is a multiple of 32 is copied once at load into the split,
row-interleaved layout of ``kernels.repack_q4_0_to_r32`` (anonymous memory, the same byte count as
the Q4 weights: ~0.3 s for Qwen3-0.6B's 336 MB on two cores). Its kernels make rows the SIMD lanes
and decode ~2.5× faster than the 16-lane kernel on the file's layout, prefill ~4× faster; with
every layer matrix in that layout a decode step runs all layers in one numba call
(``decode_layers_r32``). On a host with AVX-512 VNNI the copy is the 16-row layout of
``kernels_v16`` instead (``registry.q4_load_layout``: the same bytes again, multiplied with
``vpdpbusd``; the same sums, bit for bit). ``interleave=False`` keeps the file's layout (zero copy, the 16-lane
kernels); ``repack=True`` copies plain Q4_0 into Q4_8X8L instead. ``kestrel-lab bench`` shows all.

Activations are float32. For F32/F16 weights the matvecs are float dot products (this is the path
that matches PyTorch to ~1e-6); for Q8_0/Q4_0 weights each activation vector is quantized to Q8_0
once and shared by the matrices that read it (q/k/v; gate/up).
Taught in day12_1, day12_2 (the whole model, tied lm head), day11_2 (decode step) and day17_3 (mmap).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kestrel_lab import quant as Q
from kestrel_lab.config import ModelConfig
from kestrel_lab.engine import kernels as K
from kestrel_lab.engine import kernels_v16 as V
from kestrel_lab.engine import registry
from kestrel_lab.engine.attention import attend
from kestrel_lab.engine.kv import ContextFullError, KVCache
from kestrel_lab.engine.rope import apply_rope, rope_cos_sin
from kestrel_lab.threads import numba_threads, resolve_threads
from kestrel_lab.vqf.layout import text_specs

# The names the model's math binds; every shape comes from the file layout (``vqf.layout.text_specs``).
MATRICES = ("q4_q", "q4_k", "q4_v", "q4_o", "q4_gate", "q4_up", "q4_down")
PREFILL_CHUNK = 64  # tokens per batched forward: bounds the expanded activations and accumulators


@dataclass
class RawTensor:
    """A tensor given as bytes (qtype, rows, cols, flat uint8): what a VQF directory entry points at.

    ``from_tensors`` accepts any object with these four attributes (the VQF reader's ``VQFTensor``
    has them), so tests and notebooks can run the engine on weights built in memory. Taught in day12_2.
    """
    qtype: int
    rows: int
    cols: int
    data: np.ndarray


class Linear:
    """One weight matrix (or one layer's slice of a stacked one) in its storage format.

    ``__call__(act)`` returns ``act.x @ W.T`` as float32 (T, rows) with the kernels the registry
    gives its layout (``kernel_one`` for one token, ``kernel_many`` for many). ``r32``: the
    (nibbles, scales) planes of a plain Q4_0 matrix made by ``kernels.repack_q4_0_to_r32``; when
    given, the layout is ``planes_layout`` (``Q4_0_R32`` or ``Q4_0_V16``) and they are what the kernels read.
    Taught in day12_1.
    """

    def __init__(self, qtype: int, rows: int, cols: int, data: np.ndarray, name: str = "", r32=None,
                 planes_layout: str = "Q4_0_R32"):
        self.qt = Q.qtype(qtype)
        self.rows, self.cols, self.name = rows, cols, name
        self.nbytes = int(data.size)
        # Plain Q4_0 split and row-grouped at load (``kernels.repack_q4_0_to_r32``, or
        # ``kernels_v16.repack_q4_0_to_v16`` for ``planes_layout="Q4_0_V16"``): the planes (nibbles,
        # scales) that every product with this matrix then reads instead of ``w``.
        self.nib, self.sc = r32 if r32 is not None else (None, None)
        self.planes_layout = planes_layout
        q = self.qt
        if q is Q.F32:
            self.w = data.view("<f4").reshape(rows, cols)
        elif q is Q.F16:
            self.w = data.view("<u2").reshape(rows, cols)
        elif q is Q.Q4_8X8L:
            self.w = data.reshape(-1)
        else:
            self.w = data.reshape(rows, self.nbytes // rows)
        if self.w.flags.writeable:          # one numba specialization for mmap and in-memory weights
            self.w = self.w.view()
            self.w.setflags(write=False)
        self.layout = registry.layout_of(self)
        self.kernel_one, self.kernel_many = _kernel(self.layout, "one"), _kernel(self.layout, "many")

    def __call__(self, act: "Activation") -> np.ndarray:
        T = act.x.shape[0]
        out = np.empty((T, self.rows), dtype=np.float32)
        (self.kernel_one if T == 1 else self.kernel_many)(self, act, out)
        return out


class Activation:
    """Activations (T, K) float32 and, computed on first use, their Q8_0 and Q4_8X8L-lane forms.

    Several matrices read the same vector (q/k/v; gate/up), so it is quantized once. Taught in day05_3.
    """

    def __init__(self, x: np.ndarray):
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self._q8 = None
        self._e = None
        self._c = None

    def q8(self):
        """(int8 values, float32 scales) of the Q8_0 form, computed once. Taught in day05_3."""
        if self._q8 is None:
            T, Kd = self.x.shape
            xq = np.empty((T, Kd), np.int8)
            xd = np.empty((T, Kd // K.QK), np.float32)
            K.quantize_act(self.x, xq, xd)
            self._q8 = (xq, xd)
        return self._q8

    def q8c(self):
        """(int8 values, ``−8·Σx`` per block, scales) for the row-interleaved Q4_0 kernels, computed once.

        Taught in day23_2."""
        if self._c is None:
            xq, xd = self.q8()
            xc = np.empty(xd.shape, np.int16)
            K.act_block_sums(xq, xc)
            self._c = xc
        return self._q8[0], self._c, self._q8[1]

    def x8x8(self):
        """(int16 lane planes, scales) for the Q4_8X8L kernels, computed once. Taught in day06_2."""
        if self._e is None:
            xq, xd = self.q8()
            T, Kd = xq.shape
            xe = np.empty((T, Kd // K.QK, 5, 64), np.int16)
            K.expand_act_8x8(xq, xe)
            self._e = (xe, xd)
        return self._e


@lru_cache(maxsize=None)
def _kernel(layout: str, call: str):
    k = registry.select(layout, call)
    if k is None and call in ("one", "many"):
        raise ValueError(f"no kernel is registered for {layout} weights ({call})")
    return k


def _fused(call: str, a: "Activation", *mats: Linear):
    """The registry's fused kernel for one token and matrices of one layout, else None."""
    if a.x.shape[0] != 1 or any(m.layout != mats[0].layout for m in mats):
        return None
    return _kernel(mats[0].layout, call)


def _qkv(m: dict, a: "Activation"):
    """Q, K and V of one layer (one fused parallel region for a decode step where one exists)."""
    wq, wk, wv = m["q4_q"], m["q4_k"], m["q4_v"]
    fused = _fused("qkv", a, wq, wk, wv)
    if fused is None:
        return wq(a), wk(a), wv(a)
    q, k, v = (np.empty((1, w.rows), np.float32) for w in (wq, wk, wv))
    fused(wq, wk, wv, a, q, k, v)
    return q, k, v


def _swiglu(m: dict, a: "Activation") -> np.ndarray:
    """silu(Wgate x) · (Wup x) (one fused pass for a decode step where one exists)."""
    wg, wu = m["q4_gate"], m["q4_up"]
    fused = _fused("swiglu", a, wg, wu)
    if fused is None:
        g, u = wg(a), wu(a)
        K.silu_mul(g, u, g)
        return g
    out = np.empty((1, wg.rows), np.float32)
    fused(wg, wu, a, out)
    return out


def _rows_slice(t, r0: int, r1: int) -> np.ndarray:
    """Bytes of rows [r0, r1) of a stacked tensor (contiguous in every qtype; Q4_8X8L in 8-row steps)."""
    bpr = t.data.size // t.rows
    return t.data.reshape(-1)[r0 * bpr:r1 * bpr]


class Qwen3Engine:
    """A Qwen3 dense model (or the text tower of Qwen3-VL) ready to prefill and decode.

    ``prefill(ids)`` → logits after the last id; ``decode(id)`` → logits of one step;
    ``forward_all(ids)`` → logits of every position; ``truncate``/``reset`` manage the KV cache;
    ``stats`` accumulates timings. Plain Q4_0 weights are split and row-interleaved at load unless
    ``interleave=False``; ``repack=True`` copies them into Q4_8X8L instead (see the module docstring).
    Taught in day12_2.
    """

    def __init__(self, config: ModelConfig, tensors, *, max_context: int = 4096, threads: int | None = None,
                 repack: bool = False, source: str = "<tensors>", keepalive=None, interleave: bool = True):
        if config.arch not in ("qwen3", "qwen3_vl"):
            raise ValueError(f"{source}: arch {config.arch!r} is not a dense Qwen3 (this engine runs qwen3 and "
                             f"the text tower of qwen3_vl)")
        self.config = config
        self.source = source
        self._keepalive = keepalive      # the mapped file must outlive the views
        self.threads = resolve_threads(threads)
        c = config
        L, hd = c.num_hidden_layers, c.head_dim
        specs = {spec.name: spec for spec in text_specs(c)}
        for name, spec in specs.items():
            if name not in tensors:
                raise ValueError(f"{source}: tensor {name!r} is missing (a dense Qwen3 needs {', '.join(specs)})")
            t = tensors[name]
            if (t.rows, t.cols) != (spec.rows, spec.cols):
                raise ValueError(f"{source}: tensor {name!r} is {t.rows}×{t.cols}, the config needs "
                                 f"{spec.rows}×{spec.cols}")
        for name in ("final_norm", "attn_norm", "ffn_norm", "q_norm", "k_norm"):
            if tensors[name].qtype != Q.F32.id:
                raise ValueError(f"{source}: tensor {name!r} has qtype {Q.qtype(tensors[name].qtype).name}, expected F32")
        emb = tensors["token_embed"]
        if emb.qtype not in (Q.F32.id, Q.F16.id):
            raise ValueError(f"{source}: tensor 'token_embed' has qtype {Q.qtype(emb.qtype).name}, expected F16 or F32")

        def f32(name):
            t = tensors[name]
            return t.data.view("<f4").reshape(t.rows, t.cols)

        self.final_norm = f32("final_norm")[0]
        self.attn_norm, self.ffn_norm = f32("attn_norm"), f32("ffn_norm")
        self.q_norm, self.k_norm = f32("q_norm"), f32("k_norm")
        self.embed_qtype = emb.qtype
        self.embed = emb.data.view("<f4" if emb.qtype == Q.F32.id else "<u2").reshape(emb.rows, emb.cols)

        # rows of one layer's slice of each stacked matrix (the lm head is one matrix)
        per_layer = {name: specs[name].rows // (1 if name == "q4_lm" else L) for name in MATRICES + ("q4_lm",)}
        self.repack_seconds = 0.0
        # Where each tensor's bytes live while the engine runs: used in place from the file's mapping
        # (shared with every process that maps it) or copied at load into anonymous memory.
        self.bytes_in_place = {name: tensors[name].data.nbytes for name in specs}
        self.bytes_copied = {}
        stacked, planes = {}, {}
        # plain Q4_0 → the row-grouped layout this host's fastest kernels read (G rows per group)
        self.q4_layout = registry.q4_load_layout()
        G = registry.PLANE_LAYOUTS[self.q4_layout]
        split_q4 = K.repack_q4_0_to_r32 if self.q4_layout == "Q4_0_R32" else V.repack_q4_0_to_v16
        for name in MATRICES + ("q4_lm",):
            t = tensors[name]
            if interleave and not repack and t.qtype == Q.Q4_0.id and per_layer[name] % G == 0:
                t0 = time.perf_counter()
                src = t.data.reshape(t.rows, t.data.size // t.rows)
                nb = t.cols // K.QK
                nib = np.empty((t.rows // G, nb * 16 * G), np.uint8)
                sc = np.empty((t.rows // G, nb * G), np.uint16)
                split_q4(src, nib, sc, K.n_chunks(t.rows // G))
                nib.setflags(write=False)
                sc.setflags(write=False)
                self.repack_seconds += time.perf_counter() - t0
                del self.bytes_in_place[name]
                self.bytes_copied[name] = nib.nbytes + sc.nbytes
                planes[name] = (nib, sc)
            elif repack and t.qtype == Q.Q4_0.id and t.rows % 8 == 0:
                t0 = time.perf_counter()
                src = t.data.reshape(t.rows, t.data.size // t.rows)
                dst = np.empty(t.data.size, np.uint8)
                K.repack_q4_0_to_8x8l(src, dst, K.n_chunks(t.rows // 8))
                self.repack_seconds += time.perf_counter() - t0
                del self.bytes_in_place[name]
                self.bytes_copied[name] = dst.nbytes
                t = RawTensor(Q.Q4_8X8L.id, t.rows, t.cols, dst)
            stacked[name] = t
        def split(name, g0, g1):
            if name not in planes:
                return None
            nib, sc = planes[name]
            return nib[g0:g1], sc[g0:g1]

        # The whole-step kernel (registry call "layers") needs every layer matrix row-interleaved.
        self._planes = (tuple(a for name in MATRICES for a in planes[name])
                        if all(name in planes for name in MATRICES) else None)
        self._step = _kernel(self.q4_layout, "layers") if self._planes is not None else None
        self.layers = []
        for layer in range(L):
            mats = {}
            for name in MATRICES:
                rows, t = per_layer[name], stacked[name]
                g0, g1 = layer * rows // G, (layer + 1) * rows // G
                mats[name] = Linear(t.qtype, rows, t.cols, _rows_slice(t, layer * rows, (layer + 1) * rows),
                                    f"{name}[{layer}]", r32=split(name, g0, g1), planes_layout=self.q4_layout)
            self.layers.append(mats)
        t = stacked["q4_lm"]
        self.lm_head = Linear(t.qtype, t.rows, t.cols, t.data.reshape(-1), "q4_lm",
                              r32=split("q4_lm", 0, None), planes_layout=self.q4_layout)
        self.weight_qtypes = {name: Q.qtype(stacked[name].qtype).name for name in stacked}

        self.max_context = int(min(max_context, c.max_position_embeddings))
        self.cache = KVCache(L, c.num_key_value_heads, hd, self.max_context)
        self._cos, self._sin = rope_cos_sin(np.arange(self.max_context), hd, c.rope_theta)
        self.stats = {"prefill_s": 0.0, "prefill_tokens": 0, "decode_s": 0.0, "decode_tokens": 0}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_vqf(cls, path, max_context: int = 4096, threads: int | None = None, repack: bool = False,
                 interleave: bool = True) -> "Qwen3Engine":
        """Open a VQF file (mmap, zero copy) and build the engine on it. Taught in day17_3."""
        from kestrel_lab.vqf.reader import open_vqf

        f = open_vqf(path)
        return cls(f.config, f.tensors, max_context=max_context, threads=threads, repack=repack,
                   source=str(os.fspath(path)), keepalive=f, interleave=interleave)

    @classmethod
    def from_tensors(cls, config: ModelConfig, tensors: dict, **kw) -> "Qwen3Engine":
        """Build from a mapping name → tensor (``RawTensor`` or anything with qtype/rows/cols/data).

        Taught in day12_2.
        """
        return cls(config, tensors, **kw)

    # ------------------------------------------------------------------ facts
    @property
    def pos(self) -> int:
        """Tokens currently in the KV cache. Taught in day11_1."""
        return self.cache.pos

    def memory_report(self) -> dict:
        """Weight bytes used in place from the file's mapping vs copied at load into anonymous memory.

        Mapped bytes are page cache, shared by every process that maps the same file; copied bytes are
        private to this process (the default engine row-interleaves plain Q4_0 at load, see the module
        docstring). Writing the interleaved layout at conversion time would make every byte in place.
        Taught in day16_1, day17_3 and day24_1.
        """
        return {"in_place_bytes": sum(self.bytes_in_place.values()),
                "copied_at_load_bytes": sum(self.bytes_copied.values()),
                "copied_tensors": sorted(self.bytes_copied), "in_place_tensors": sorted(self.bytes_in_place),
                "copy_seconds": self.repack_seconds}

    def kernel_paths(self) -> dict:
        """Which registered kernel each product uses, by weight layout (and the whole-step kernel).

        Recorded by the bench, since the speed depends on it. Taught in day29_1 (planned).
        """
        mats = [*(m for layer in self.layers for m in layer.values()), self.lm_head]
        by_layout: dict[str, dict] = {}
        for w in mats:
            by_layout.setdefault(w.layout, {"one": w.kernel_one.name, "many": w.kernel_many.name,
                                            **{c: (k.name if (k := _kernel(w.layout, c)) else None)
                                               for c in ("qkv", "swiglu")}})
        return {"matrices": by_layout, "decode_step": self._step.name if self._step else None,
                "q4_layout": self.q4_layout if any(w.nib is not None for w in mats) else None,
                "isa": sorted(f for f in registry.host_features() if f in ("avx2", "avx512f", "avx512_vnni",
                                                                            "avx_vnni", "dotprod", "i8mm"))}

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads: every matrix, the lm head, the norms, one embedding row.

        Taught in day07_3.
        """
        c = self.config
        mats = sum(m.nbytes for layer in self.layers for m in layer.values()) + self.lm_head.nbytes
        norms = 4 * (c.num_hidden_layers * (2 * c.hidden_size + 2 * c.head_dim) + c.hidden_size)
        return int(mats + norms + self.embed.itemsize * c.hidden_size)

    def reset(self) -> None:
        """Empty the KV cache. Taught in day11_1."""
        self.cache.reset()

    def truncate(self, pos: int) -> None:
        """Drop cache entries at positions ≥ ``pos`` (multi-turn reuse of a common prefix). Taught in day14_2."""
        self.cache.truncate(pos)

    # ------------------------------------------------------------------ public steps
    def prefill(self, ids) -> np.ndarray:
        """Run ``ids`` through the model from the current position; logits after the last one (float32).

        Batched: up to 64 tokens per forward, every matrix applied as a matmul. Taught in day10_3.
        """
        ids = self._check_ids(ids)
        if ids.size == 0:
            raise ValueError("prefill() needs at least one token id")
        t0 = time.perf_counter()
        logits = None
        for s in range(0, ids.size, PREFILL_CHUNK):
            logits = self._forward(ids[s:s + PREFILL_CHUNK], last_only=True)
        self.stats["prefill_s"] += time.perf_counter() - t0
        self.stats["prefill_tokens"] += int(ids.size)
        return logits[-1]

    def decode(self, token_id: int) -> np.ndarray:
        """One decode step: feed ``token_id`` at position ``pos``; logits for the next token (float32).

        Taught in day11_2.
        """
        ids = self._check_ids([token_id])
        t0 = time.perf_counter()
        logits = self._forward(ids, last_only=True)[0]
        self.stats["decode_s"] += time.perf_counter() - t0
        self.stats["decode_tokens"] += 1
        return logits

    def forward_all(self, ids) -> np.ndarray:
        """Logits (len(ids), vocab) of every position, from the current ``pos`` (tests, perplexity).

        Taught in day12_3.
        """
        ids = self._check_ids(ids)
        out = [self._forward(ids[s:s + PREFILL_CHUNK], last_only=False) for s in range(0, ids.size, PREFILL_CHUNK)]
        return np.concatenate(out, axis=0) if out else np.zeros((0, self.config.vocab_size), np.float32)

    # ------------------------------------------------------------------ internals
    def _check_ids(self, ids) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"token ids must be a 1-D sequence of integers, got {arr.dtype} shape {arr.shape}")
        arr = arr.astype(np.int64)
        bad = (arr < 0) | (arr >= self.config.vocab_size)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"token id {int(arr[i])} at index {i} is outside the vocabulary [0, {self.config.vocab_size})")
        self.cache.check_room(arr.size)
        return arr

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        if self.embed_qtype == Q.F16.id:
            out = np.empty((ids.size, self.config.hidden_size), np.float32)
            K.embed_f16(self.embed, ids, K.F16_TO_F32, out)
            return out
        return np.array(self.embed[ids], dtype=np.float32)

    def _forward(self, ids: np.ndarray, last_only: bool) -> np.ndarray:
        c = self.config
        T = ids.size
        H, KVH, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        eps = np.float32(c.rms_norm_eps)
        pos0 = self.cache.pos
        cos, sin = self._cos[pos0:pos0 + T], self._sin[pos0:pos0 + T]
        with numba_threads(self.threads) as nt:
            h = self._embed(ids)
            x = np.empty_like(h)
            o = np.empty((T, H, D), np.float32)
            if T == 1 and self._step is not None:
                self._step(h, eps, self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm, self._planes,
                                  self.cache.k, self.cache.v, pos0, cos, sin, H, nt)
            else:
                for layer, m in enumerate(self.layers):
                    K.rmsnorm(h, self.attn_norm[layer], eps, x)
                    a = Activation(x)
                    q, k, v = _qkv(m, a)
                    q, k, v = q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D)
                    K.rmsnorm_heads(q, self.q_norm[layer], eps)
                    K.rmsnorm_heads(k, self.k_norm[layer], eps)
                    apply_rope(q, cos, sin)
                    apply_rope(k, cos, sin)
                    kc, vc = self.cache.k[layer], self.cache.v[layer]
                    kc[:, pos0:pos0 + T, :] = k.transpose(1, 0, 2)
                    vc[:, pos0:pos0 + T, :] = v.transpose(1, 0, 2)
                    attend(q, kc, vc, pos0, o)
                    h += m["q4_o"](Activation(o.reshape(T, H * D)))
                    K.rmsnorm(h, self.ffn_norm[layer], eps, x)
                    g = _swiglu(m, Activation(x))
                    h += m["q4_down"](Activation(g))
            self.cache.pos = pos0 + T
            hs = h[-1:] if last_only else h
            hn = np.empty_like(hs)
            K.rmsnorm(hs, self.final_norm, eps, hn)
            return self.lm_head(Activation(hn))


__all__ = ["Qwen3Engine", "RawTensor", "Linear", "Activation", "ContextFullError"]
