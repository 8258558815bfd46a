"""The Qwen3 model on top of the kernels: load a VQF file, prefill, decode, return logits.

One layer (day12_1), exactly as ``transformers``' ``Qwen3DecoderLayer``::

    x = RMSNorm(h) · attn_norm
    q, k, v = Wq x, Wk x, Wv x          (q: heads × D, k/v: kv_heads × D)
    q, k = RMSNorm_per_head(q)·q_norm, RMSNorm_per_head(k)·k_norm      ← Qwen3's addition
    q, k = RoPE(q, pos), RoPE(k, pos)   (rotate-half, theta from the config)
    cache[pos] = k, v ;  o = GQA-attention(q, cache[0..pos])
    h = h + Wo o
    x = RMSNorm(h) · ffn_norm ;  h = h + Wdown (silu(Wgate x) · Wup x)

Qwen2/Qwen2.5 (``Qwen2ForCausalLM``, llmc's model) differs only in attention, as
``config.ATTENTION_TRAITS`` says: ``q, k, v = Wq x + bq, Wk x + bk, Wv x + bv`` (the ``q_bias`` /
``k_bias`` / ``v_bias`` entries, F32) and no q/k norm; every path (prefill, the per-layer decode, the
whole-step kernel) reads the same traits.

In a Qwen3-MoE model the FFN of each sparse layer is ``engine.moe.MoELayer`` instead (router, the
chosen experts' SwiGLU, their weighted sum; experts used in place from the mapping, never copied),
and each dense layer of it (``mlp_only_layers``) reads its own ``q4_gate.{i}`` / ``q4_up.{i}`` /
``q4_down.{i}`` entries.

then ``logits = Wlm · RMSNorm(h)·final_norm`` (``q4_lm``; for tied embeddings the VQF stores the
quantized copy of the embedding there, so the lm head is always one matrix read).

Weights stay where the file put them: ``open_vqf`` maps the file and every matrix is a read-only
numpy view of the mapping (zero copy; pages come from the OS page cache on first touch, which is why
a second start is fast). F32/F16/Q8_0 and Q4_8X8L (``--quant q4_8x8l``, the 64-lane kernel) are
used in place. Plain Q4_0 is the exception, stated plainly: by default (``interleave=True``) each
Q4_0 matrix whose per-layer row count is a multiple of 32 is copied once at load into the split,
row-interleaved layout of ``kernels.ops.repack_q4_0_to_r32`` (anonymous memory, the same byte count as
the Q4 weights: ~0.3 s for Qwen3-0.6B's 336 MB on two cores). Its kernels make rows the SIMD lanes
and decode ~2.5× faster than the 16-lane kernel on the file's layout, prefill ~4× faster; with
every layer matrix in that layout a decode step runs all layers in one numba call
(``decode_layers_r32``). On a host with AVX-512 VNNI the copy is the 16-row layout of
``kernels.v16`` instead (``registry.q4_load_layout``: the same bytes again, multiplied with
``vpdpbusd``; the same sums, bit for bit). ``interleave=False`` (or ``KESTREL_Q4_LAYOUT=plain``) keeps the
file's layout (zero copy: the 16-lane kernels, or on a ``dotprod`` CPU such as the board's A76 the int8-dot
``sdot`` kernels); ``repack=True`` copies plain Q4_0 into Q4_8X8L instead. ``kestrel-lab bench`` shows all.

Activations are float32. For F32/F16 weights the matvecs are float dot products (this is the path
that matches PyTorch to ~1e-6); for Q8_0/Q4_0 weights each activation vector is quantized to Q8_0
once and shared by the matrices that read it (q/k/v; gate/up).
Taught in day12_1, day12_2 (the whole model, tied lm head), day11_2 (decode step) and day17_3 (mmap).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from kestrel_lab import limits
from kestrel_lab import quant as Q
from kestrel_lab.config import ATTENTION_TRAITS, ModelConfig
from kestrel_lab.engine import moe as M
from kestrel_lab.engine import pieces as P
from kestrel_lab.engine.kv import ContextFullError, KVCache
from kestrel_lab.kernels import choice
from kestrel_lab.kernels import ops as K
from kestrel_lab.kernels import registry
from kestrel_lab.kernels import variants
from kestrel_lab.kernels.attention import attend
from kestrel_lab.kernels.host import host_features
from kestrel_lab.kernels.linear import Activation, Linear, RawTensor, fused_kernel, kernel_for
from kestrel_lab.kernels.rope import apply_rope, mrope_cos_sin, rope_cos_sin
from kestrel_lab.memory_check import check_memory, engine_needs
from kestrel_lab.threads import numba_threads, resolve_threads
from kestrel_lab.vqf.layout import dense_ffn_name, text_specs

# The names the model's math binds; every shape comes from the file layout (``vqf.layout.text_specs``).
MATRICES = ("q4_q", "q4_k", "q4_v", "q4_o", "q4_gate", "q4_up", "q4_down")
ATTENTION = MATRICES[:4]
FFN = MATRICES[4:]
PREFILL_CHUNK = 64  # tokens per batched forward: bounds the expanded activations and accumulators


@dataclass
class ImageEmbeds:
    """What a prompt's image tokens bring into the language model (Qwen3-VL).

    ``mask`` (len(ids),) bool: which ids are ``<|image_pad|>``; ``embeds`` (mask.sum(), hidden): the
    vision merger's output written over those positions' embeddings, in order; ``deepstack``: one
    (mask.sum(), hidden) array per DeepStack merger, added to the hidden state at the same positions
    after decoder layer 0, 1, … (transformers' ``_deepstack_process``). Taught in day20_2.
    """
    mask: np.ndarray
    embeds: np.ndarray
    deepstack: list = field(default_factory=list)

    def chunk(self, s: int, e: int) -> "ImageEmbeds | None":
        """The part that belongs to ids[s:e] (None when that slice holds no image token)."""
        m = self.mask[s:e]
        n = int(m.sum())
        if not n:
            return None
        a = int(self.mask[:s].sum())
        return ImageEmbeds(m, self.embeds[a:a + n], [d[a:a + n] for d in self.deepstack])


def _qkv(m: dict, a: "Activation"):
    """Q, K and V of one layer (one fused parallel region for a decode step where one exists)."""
    wq, wk, wv = m["q4_q"], m["q4_k"], m["q4_v"]
    fused = fused_kernel("qkv", a, wq, wk, wv)
    if fused is None:
        return wq(a), wk(a), wv(a)
    q, k, v = (np.empty((1, w.rows), np.float32) for w in (wq, wk, wv))
    fused(wq, wk, wv, a, q, k, v)
    return q, k, v


def _swiglu(m: dict, a: "Activation") -> np.ndarray:
    """silu(Wgate x) · (Wup x) (one fused pass for a decode step where one exists)."""
    wg, wu = m["q4_gate"], m["q4_up"]
    fused = fused_kernel("swiglu", a, wg, wu)
    if fused is None:
        g, u = wg(a), wu(a)
        K.silu_mul_rows(g, u, g)
        return g
    out = np.empty((1, wg.rows), np.float32)
    fused(wg, wu, a, out)
    return out


def _rows_slice(t, r0: int, r1: int) -> np.ndarray:
    """Bytes of rows [r0, r1) of a stacked tensor (contiguous in every qtype; Q4_8X8L in 8-row steps)."""
    bpr = t.data.size // t.rows
    return t.data.reshape(-1)[r0 * bpr:r1 * bpr]


def _choice_summary() -> dict:
    """The Q4_0 variant this host was given and how (``kernels.choice``), for the provenance."""
    c = choice.current(host_features())
    return {"variant": c.variant.name, "how": c.how, "isa_default": c.default, "why": c.reason,
            "prefetch_bytes": c.prefetch_bytes, "prefetch_why": c.prefetch_reason}


HUGE_PAGE = 2 << 20


def _plane(shape, dtype) -> np.ndarray:
    """An empty array for a plane copy, on transparent huge pages where Linux grants them (``madvise``:
    a decode step streams ~300 MB of planes, 75,000 4-KiB pages and as many TLB misses; with 2-MiB pages,
    150). On the course's 2-vCPU Xeon it added 2–8 % to Qwen3-0.6B decode (interleaved, quiet machine).
    ``KESTREL_HUGEPAGES=0``, or an OS without ``MADV_HUGEPAGE``: a plain ``np.empty``."""
    import mmap
    import os

    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if os.environ.get("KESTREL_HUGEPAGES") == "0" or not hasattr(mmap, "MADV_HUGEPAGE") or nbytes < HUGE_PAGE:
        return np.empty(shape, dtype)
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(m, np.uint8)
    off = -whole.ctypes.data % HUGE_PAGE                # the first 2-MiB boundary inside the mapping
    m.madvise(mmap.MADV_HUGEPAGE, off, nbytes // mmap.PAGESIZE * mmap.PAGESIZE)
    return whole[off:off + nbytes].view(dtype).reshape(shape)

class Qwen3Engine:
    """A Qwen3 model — dense, Qwen3-MoE, the text tower of Qwen3-VL, or a Qwen2/Qwen2.5 — ready to
    prefill and decode.

    ``prefill(ids)`` → logits after the last id; ``decode(id)`` → logits of one step;
    ``forward_all(ids)`` → logits of every position; ``truncate``/``reset`` manage the KV cache;
    ``stats`` accumulates timings; ``trace``, when set, is called after each layer with the hidden state
    (``kestrel_lab.eval.trace_hidden``). Plain Q4_0 weights are split and row-interleaved at load unless
    ``interleave=False``; ``repack=True`` copies them into Q4_8X8L instead (see the module docstring).
    Taught in day12_2.
    """

    def __init__(self, config: ModelConfig, tensors, *, max_context: int = 4096, threads: int | None = None,
                 repack: bool = False, source: str = "<tensors>", keepalive=None, interleave: bool = True,
                 expert_paging: str = "os", available_memory: int | None = None):
        self.config, self.source, self.expert_paging = config, source, expert_paging
        self._keepalive = keepalive      # the mapped file must outlive the views
        self.threads = resolve_threads(threads)
        context = self._check(tensors, max_context)
        # The student's pieces swapped in at construction (``kestrel_lab.seam``); none: the package's own path.
        self.pieces = P.engine_pieces()
        self._ops = P.PieceOps(self.pieces) if self.pieces else None
        if self._ops is not None:
            self._ops.check_scaling(self.config, self.source)
        if any(k in self.pieces for k in P.MATVEC_PIECES):
            interleave = repack = False            # the student's Q4_0 matvec reads the file's plain rows
        self._bind_small(tensors)
        linear_names, per_layer = self._linear_names()
        copy_as = self._plan_copies(tensors, linear_names, per_layer, context, interleave, repack, available_memory)
        stacked, planes = self._copy(tensors, linear_names, copy_as)
        self._bind_layers(tensors, stacked, planes, per_layer)
        self._allocate(context)

    # ------------------------------------------------------------------ construction, step by step
    def _check(self, tensors, max_context: int) -> int:
        """Refuse what this engine cannot run — the architecture, a configuration or context beyond the
        one table of bounds (``kestrel_lab.limits``), a tensor missing, misshapen or of the wrong qtype —
        before anything is sized from it. Returns the context the cache will hold."""
        c, source = self.config, self.source
        if c.arch not in ATTENTION_TRAITS:
            raise ValueError(f"{source}: arch {c.arch!r} is not one this engine runs (qwen3, qwen3_moe, "
                             f"qwen2 and the text tower of qwen3_vl)")
        try:
            limits.check_config(c)
            context = limits.check_context(max_context, c.max_position_embeddings)
        except limits.LimitError as e:
            raise limits.LimitError(e.field, e.value, e.expected, e.why, where=source) from None
        specs = {spec.name: spec for spec in text_specs(c)}
        for name, spec in specs.items():
            if name not in tensors:
                raise ValueError(f"{source}: tensor {name!r} is missing (this {c.arch} model needs {', '.join(specs)})")
            t = tensors[name]
            if (t.rows, t.cols) != (spec.rows, spec.cols):
                raise ValueError(f"{source}: tensor {name!r} is {t.rows}×{t.cols}, the config needs "
                                 f"{spec.rows}×{spec.cols}")
        small = ("final_norm", "attn_norm", "ffn_norm", "q_norm", "k_norm", "q_bias", "k_bias", "v_bias")
        for name in (n for n in small if n in specs):
            if tensors[name].qtype != Q.F32.id:
                raise ValueError(f"{source}: tensor {name!r} has qtype {Q.qtype(tensors[name].qtype).name}, "
                                 "expected F32")
        if tensors["token_embed"].qtype not in (Q.F32.id, Q.F16.id):
            raise ValueError(f"{source}: tensor 'token_embed' has qtype "
                             f"{Q.qtype(tensors['token_embed'].qtype).name}, expected F16 or F32")
        self._specs = specs
        # where each tensor's bytes live while the engine runs: used in place from the file's mapping
        # (shared with every process that maps it) or copied at load into anonymous memory
        self.bytes_in_place = {name: tensors[name].data.nbytes for name in specs}
        self.bytes_copied, self.bytes_released, self.repack_seconds = {}, 0, 0.0
        return context

    def _bind_small(self, tensors) -> None:
        """The norms, the attention traits' small tensors and the embedding, as views of the file.

        Absent tensors (a trait the architecture lacks) are empty (L, 0) arrays, read-only like the
        mapping's views, so the whole-step kernel has one signature for every architecture."""
        L = self.config.num_hidden_layers

        def f32(name, present=True):
            if not present:
                a = np.zeros((L, 0), np.float32)
                a.setflags(write=False)
                return a
            t = tensors[name]
            return t.data.view("<f4").reshape(t.rows, t.cols)

        self.final_norm = f32("final_norm")[0]
        self.attn_norm, self.ffn_norm = f32("attn_norm"), f32("ffn_norm")
        self.qk_norm, self.qkv_bias = self.config.attention.qk_norm, self.config.attention.qkv_bias
        self.q_norm, self.k_norm = f32("q_norm", self.qk_norm), f32("k_norm", self.qk_norm)
        self.q_bias, self.k_bias, self.v_bias = (f32(n, self.qkv_bias) for n in ("q_bias", "k_bias", "v_bias"))
        emb = tensors["token_embed"]
        self.embed_qtype = emb.qtype
        self.embed = emb.data.view("<f4" if emb.qtype == Q.F32.id else "<u2").reshape(emb.rows, emb.cols)

    def _linear_names(self) -> tuple[tuple[str, ...], dict[str, int]]:
        """The matrices bound as ``Linear``: stacked per layer (attention; a dense model's FFN) or one per
        entry (the lm head; each dense layer's FFN inside an MoE model), and the rows of one layer's slice
        of each. The expert stacks and the router are used in place (``engine.moe``), never copied."""
        c = self.config
        is_moe = c.arch == "qwen3_moe"
        whole = ("q4_lm",) + tuple(dense_ffn_name(k, i) for i in c.dense_layers for k in ("gate", "up", "down")
                                   if is_moe)
        names = (ATTENTION if is_moe else MATRICES) + whole
        return names, {n: self._specs[n].rows // (1 if n in whole else c.num_hidden_layers) for n in names}

    def _plan_copies(self, tensors, names, per_layer, context, interleave, repack, available_memory) -> dict:
        """Which plain Q4_0 matrices are copied at load, and into what: "planes" (the row-grouped layout of
        the host's fastest variant, ``kernels.variants``; ``KESTREL_Q4_LAYOUT`` forces one), "8x8l"
        (``repack=True``) or None (the file's bytes). Then memory, checked before anything is allocated."""
        c = self.config
        self.q4_layout = registry.q4_load_layout()
        if self.q4_layout not in variants.PLANE_LAYOUTS:      # KESTREL_Q4_LAYOUT=plain: the file's bytes
            interleave = False
        G = variants.PLANE_LAYOUTS.get(self.q4_layout, 1)
        copy_as = {name: ("planes" if interleave and not repack and per_layer[name] % G == 0 else
                          "8x8l" if repack and tensors[name].rows % 8 == 0 else None)
                   if tensors[name].qtype == Q.Q4_0.id else None for name in names}
        copied = sum(tensors[name].data.nbytes for name, kind in copy_as.items() if kind)
        per_token = KVCache.bytes_per_token_for(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)
        check_memory(engine_needs(c, context, copied), self.source, available_memory,
                     hint=f"lower max_context (each token costs {per_token:,} bytes of KV cache) or pass "
                          f"interleave=False (no copies)")
        return copy_as

    def _copy(self, tensors, names, copy_as) -> tuple[dict, dict]:
        """Make the copies ``_plan_copies`` decided: (tensor per name, (nibbles, scales) planes per name)."""
        stacked, planes = {}, {}
        G = variants.PLANE_LAYOUTS.get(self.q4_layout, 1)
        for name in names:
            t = tensors[name]
            if copy_as[name] is None:
                stacked[name] = t
                continue
            t0 = time.perf_counter()
            src = t.data.reshape(t.rows, t.data.size // t.rows)
            if copy_as[name] == "planes":
                nb = t.cols // K.QK
                nib = _plane((t.rows // G, nb * 16 * G), np.uint8)
                sc = _plane((t.rows // G, nb * G), np.uint16)
                variants.repack_for(self.q4_layout)(src, nib, sc, K.n_chunks(t.rows // G))
                nib.setflags(write=False)
                sc.setflags(write=False)
                planes[name], copied = (nib, sc), nib.nbytes + sc.nbytes
                stacked[name] = t
            else:
                dst = np.empty(t.data.size, np.uint8)
                K.repack_q4_0_to_8x8l(src, dst, K.n_chunks(t.rows // 8))
                stacked[name], copied = RawTensor(Q.Q4_8X8L.id, t.rows, t.cols, dst), dst.nbytes
            self.repack_seconds += time.perf_counter() - t0
            del self.bytes_in_place[name]
            self.bytes_copied[name] = copied
        return stacked, planes

    def _bind_layers(self, tensors, stacked, planes, per_layer) -> None:
        """One dict of ``Linear`` per layer (views of each stacked matrix, or of its planes), the MoE
        layers, the lm head, and the whole-step kernel when every layer matrix has planes."""
        c = self.config
        is_moe = c.arch == "qwen3_moe"
        G = variants.PLANE_LAYOUTS.get(self.q4_layout, 1)

        def linear(name, rows, cols, data, label, g0=0, g1=None):
            nib_sc = (planes[name][0][g0:g1], planes[name][1][g0:g1]) if name in planes else None
            return Linear(stacked[name].qtype, rows, cols, data, label, r32=nib_sc, planes_layout=self.q4_layout)

        # The whole-step kernel (registry call "layers") needs every layer matrix in planes.
        self._planes = (tuple(a for name in MATRICES for a in planes[name])
                        if all(name in planes for name in MATRICES) else None)
        self._step = kernel_for(self.q4_layout, "layers") if self._planes is not None else None
        self.prefetch_bytes = choice.prefetch_bytes()      # the decode kernels' prefetch distance, measured here
        self.layers, self.moe_layers = [], {}
        for layer in range(c.num_hidden_layers):
            mats = {}
            for name in (ATTENTION if is_moe else MATRICES):
                rows, t = per_layer[name], stacked[name]
                mats[name] = linear(name, rows, t.cols, _rows_slice(t, layer * rows, (layer + 1) * rows),
                                    f"{name}[{layer}]", layer * rows // G, (layer + 1) * rows // G)
            if is_moe and c.is_moe_layer(layer):
                self.moe_layers[layer] = self._moe_layer(tensors, c.moe_layers.index(layer))
            elif is_moe:
                for kind, name in zip(FFN, (dense_ffn_name(k, layer) for k in ("gate", "up", "down"))):
                    t = stacked[name]
                    mats[kind] = linear(name, t.rows, t.cols, t.data.reshape(-1), name)
            self.layers.append(mats)
        t = stacked["q4_lm"]
        self.lm_head = linear("q4_lm", t.rows, t.cols, t.data.reshape(-1), "q4_lm")
        self.weight_qtypes = {name: Q.qtype(stacked[name].qtype).name for name in stacked}
        if self.moe_layers:
            self.weight_qtypes.update({n: Q.qtype(tensors[n].qtype).name
                                       for n in ("moe_router", "q4_gate_exps", "q4_up_exps", "q4_down_exps")})

    def _allocate(self, context: int) -> None:
        """The KV cache, the RoPE tables for every position of the context, the counters."""
        c = self.config
        self.max_context = context
        self.cache = KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.max_context)
        self._cos, self._sin = rope_cos_sin(np.arange(self.max_context), c.head_dim, c.rope_theta, c.rope_scaling)
        # The rope position is not the cache length once an image is in the cache (MRoPE: an image of
        # H'×W' tokens advances the position by max(H', W') only). ``_rope_next[n]`` is the position the
        # next token takes when the cache holds n tokens, so decode, truncate and reuse all read it.
        self._rope_next = np.zeros(self.max_context + 1, np.int64)
        self.stats = {"prefill_s": 0.0, "prefill_tokens": 0, "decode_s": 0.0, "decode_tokens": 0}
        # Tracing hook: when set, ``trace(layer, h)`` is called after each layer with the residual
        # stream h (T, hidden) float32 — the engine's own buffer, so copy what you keep. A traced
        # decode step runs layer by layer (the whole-step kernel has no seam to look through).
        # Used by ``kestrel_lab.eval.hidden_cosine``; None costs nothing.
        self.trace = None

    def _moe_layer(self, tensors, k: int) -> "M.MoELayer":
        """MoE layer number ``k`` (of ``config.moe_layers``): its router rows and views of its experts."""
        c = self.config
        E = c.num_experts
        r = tensors["moe_router"]
        if r.qtype != Q.F32.id:
            raise ValueError(f"{self.source}: tensor 'moe_router' has qtype {Q.qtype(r.qtype).name}, expected F32")
        router = Linear(r.qtype, E, r.cols, _rows_slice(r, k * E, (k + 1) * E), f"moe_router[{k}]")
        q = {tensors[n].qtype for n in ("q4_gate_exps", "q4_up_exps", "q4_down_exps")}
        if len(q) != 1:
            raise ValueError(f"{self.source}: the three expert stacks have different qtypes "
                             f"{sorted(Q.qtype(x).name for x in q)}")
        stack = M.ExpertStack(k, c, tensors["q4_gate_exps"], tensors["q4_up_exps"], tensors["q4_down_exps"])
        return M.MoELayer(router, stack, c.num_experts_per_tok, c.norm_topk_prob, self.expert_paging,
                          route_fn=self.pieces.get("moe.route"))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_vqf(cls, path, max_context: int = 4096, threads: int | None = None, repack: bool = False,
                 interleave: bool = True, expert_paging: str = "os", key_file=None,
                 available_memory: int | None = None) -> "Qwen3Engine":
        """Open a VQF file (mmap, zero copy) and build the engine on it. An encrypted file needs
        ``key_file`` (or ``KESTREL_KEY_FILE``); its weights are decrypted into anonymous memory once
        the tag matches (``vqf.protect``), and the decrypted originals of the matrices copied at load
        are given back (``VQFFile.release``). ``expert_paging`` (Qwen3-MoE): "os" or "exact" (see ``engine.moe``).
        Taught in day17_3 and day26_3."""
        from kestrel_lab.vqf.reader import open_vqf

        f = open_vqf(path, key_file=key_file)
        eng = cls(f.config, f.tensors, max_context=max_context, threads=threads, repack=repack,
                  source=str(os.fspath(path)), keepalive=f, interleave=interleave,
                  expert_paging=expert_paging, available_memory=available_memory)
        eng.bytes_released = f.release(list(eng.bytes_copied))   # an encrypted file's decrypted originals
        return eng

    @classmethod
    def from_tensors(cls, config: ModelConfig, tensors: dict, **kw) -> "Qwen3Engine":
        """Build from a mapping name → tensor (``RawTensor`` or anything with qtype/rows/cols/data).

        Taught in day12_1.
        """
        return cls(config, tensors, **kw)

    # ------------------------------------------------------------------ facts
    @property
    def pos(self) -> int:
        """Tokens currently in the KV cache. Taught in day11_1."""
        return self.cache.pos

    @property
    def rope_pos(self) -> int:
        """The rope position the next token takes (equals ``pos`` until an image is cached). Taught in day21_3."""
        return int(self._rope_next[self.cache.pos])

    @property
    def rope_delta(self) -> int:
        """``rope_pos − pos``: transformers' ``rope_deltas`` (≤ 0 after an image). Taught in day21_3."""
        return self.rope_pos - self.cache.pos

    def memory_report(self) -> dict:
        """Weight bytes used in place from the file's mapping vs copied at load into anonymous memory.

        Mapped bytes are page cache, shared by every process that maps the same file; copied bytes are
        private to this process (the default engine row-interleaves plain Q4_0 at load, see the module
        docstring). Writing the interleaved layout at conversion time would make every byte in place.
        Taught in day16_1, day17_3 and day24_1.
        """
        out = {"in_place_bytes": sum(self.bytes_in_place.values()),
               "copied_at_load_bytes": sum(self.bytes_copied.values()),
               "copied_tensors": sorted(self.bytes_copied), "in_place_tensors": sorted(self.bytes_in_place),
               "copy_seconds": self.repack_seconds, "released_after_copy_bytes": self.bytes_released}
        if self.moe_layers:   # Qwen3-MoE: the experts are never copied; a token pages in only its own
            out["experts_in_place_bytes"] = sum(self.bytes_in_place.get(n, 0) for n in
                                                ("q4_gate_exps", "q4_up_exps", "q4_down_exps"))
        return out

    def kernel_paths(self) -> dict:
        """Which registered kernel each product uses, by weight layout (and the whole-step kernel).

        Recorded by the bench, since the speed depends on it. Taught in day29_1.
        """
        mats = [*(m for layer in self.layers for m in layer.values()), self.lm_head]
        by_layout: dict[str, dict] = {}
        for w in mats:
            by_layout.setdefault(w.layout, {"one": w.kernel_one.name, "many": w.kernel_many.name,
                                            **{c: (k.name if (k := kernel_for(w.layout, c)) else None)
                                               for c in ("qkv", "swiglu")}})
        experts = {}
        for ml in self.moe_layers.values():
            experts.setdefault(ml.experts.layout, {"experts": ml.kernel.name, "router": ml.router.kernel_one.name,
                                                   "router_many": ml.router.kernel_many.name})
        return {"matrices": by_layout, "experts": experts,
                "decode_step": self._step.name if self._step else None,
                "q4_layout": self.q4_layout if any(w.nib is not None for w in mats) else None,
                "q4_choice": _choice_summary(),
                "isa": sorted(f for f in host_features() if f in ("avx2", "avx512f", "avx512_vnni",
                                                                            "avx_vnni", "dotprod", "i8mm"))}

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads: every matrix, the lm head, the norms, one embedding row.

        For Qwen3-MoE, each MoE layer counts its router and ``num_experts_per_tok`` experts' three
        matrices (what a token reads; which experts depends on the token, their size does not).
        Taught in day07_3.
        """
        c = self.config
        mats = sum(m.nbytes for layer in self.layers for m in layer.values()) + self.lm_head.nbytes
        mats += sum(ml.router.nbytes + ml.top_k * ml.experts.expert_bytes for ml in self.moe_layers.values())
        small = (self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm, self.q_bias, self.k_bias, self.v_bias)
        norms = sum(a.nbytes for a in small) + 4 * c.hidden_size
        return int(mats + norms + self.embed.itemsize * c.hidden_size)

    def moe_report(self) -> dict:
        """What the MoE layers touched since the last ``reset_moe_counters``: weight bytes of the router
        rows and expert runs read (an expert counted once per forward call however many tokens chose
        it), per layer the distinct experts chosen and the tokens per expert. Taught in day22_2."""
        layers = sorted(self.moe_layers)
        hits = np.stack([self.moe_layers[i].hits for i in layers]) if layers else np.zeros((0, 0), np.int64)
        return {"moe_layers": layers,
                "bytes_touched": int(sum(ml.bytes_touched for ml in self.moe_layers.values())),
                "calls": int(sum(ml.calls for ml in self.moe_layers.values())),
                "distinct_experts": [int((h > 0).sum()) for h in hits],
                "hits": hits}

    def reset_moe_counters(self) -> None:
        """Zero every MoE layer's counters (bytes touched, expert hits). Taught in day22_2."""
        for ml in self.moe_layers.values():
            ml.reset_counters()

    def reset(self) -> None:
        """Empty the KV cache. Taught in day11_1."""
        self.cache.reset()

    def truncate(self, pos: int) -> None:
        """Drop cache entries at positions ≥ ``pos`` (multi-turn reuse of a common prefix). Taught in day14_2."""
        self.cache.truncate(pos)

    # ------------------------------------------------------------------ public steps
    def prefill(self, ids, positions=None, images: ImageEmbeds | None = None) -> np.ndarray:
        """Run ``ids`` through the model from the current position; logits after the last one (float32).

        Batched: up to 64 tokens per forward, every matrix applied as a matmul. ``positions`` (3, n):
        explicit MRoPE positions (t, h, w) of the ids (Qwen3-VL with images; default: the next rope
        positions, all three equal); ``images``: the vision features of the ids' image tokens (each
        chunk takes its slice, DeepStack included). Taught in day10_3 and day21_3.
        """
        ids = self._check_ids(ids)
        if ids.size == 0:
            raise ValueError("prefill() needs at least one token id")
        positions, images = self._check_extras(ids, positions, images)
        t0 = time.perf_counter()
        logits = None
        for s in range(0, ids.size, PREFILL_CHUNK):
            e = min(ids.size, s + PREFILL_CHUNK)
            logits = self._forward(ids[s:e], last_only=True,
                                   positions=None if positions is None else positions[:, s:e],
                                   images=None if images is None else images.chunk(s, e))
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

    def forward_all(self, ids, positions=None, images: ImageEmbeds | None = None) -> np.ndarray:
        """Logits (len(ids), vocab) of every position, from the current ``pos`` (tests, perplexity).

        ``positions``/``images`` as in ``prefill``. Taught in day12_3.
        """
        ids = self._check_ids(ids)
        positions, images = self._check_extras(ids, positions, images)
        out = [self._forward(ids[s:s + PREFILL_CHUNK], last_only=False,
                             positions=None if positions is None else positions[:, s:s + PREFILL_CHUNK],
                             images=None if images is None else images.chunk(s, s + PREFILL_CHUNK))
               for s in range(0, ids.size, PREFILL_CHUNK)]
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
            raise ValueError(f"token id {int(arr[i])} at index {i} is outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        self.cache.check_room(arr.size)
        return arr

    def _check_extras(self, ids: np.ndarray, positions, images):
        """Validate ``prefill``'s optional MRoPE positions and image features against ``ids``."""
        c = self.config
        if positions is not None:
            if c.mrope_section is None:
                raise ValueError(f"{self.source}: explicit 3-D positions need an MRoPE model (mrope_section)")
            positions = np.asarray(positions, dtype=np.int64)
            if positions.shape != (3, ids.size):
                raise ValueError(f"positions must have shape (3, {ids.size}), got {positions.shape}")
        if images is not None:
            mask = np.asarray(images.mask, dtype=bool)
            n = int(mask.sum())
            if mask.shape != ids.shape:
                raise ValueError(f"images.mask has shape {mask.shape}, the ids {ids.shape}")
            for what, a in [("embeds", images.embeds),
                            *((f"deepstack[{i}]", d) for i, d in enumerate(images.deepstack))]:
                if np.shape(a) != (n, c.hidden_size):
                    raise ValueError(f"images.{what} has shape {np.shape(a)}, expected ({n}, {c.hidden_size}): "
                                     f"one row per image token of the prompt")
            if len(images.deepstack) > c.num_hidden_layers:
                raise ValueError(f"{len(images.deepstack)} DeepStack features for {c.num_hidden_layers} layers")
            images = ImageEmbeds(mask, np.asarray(images.embeds, np.float32),
                                 [np.asarray(d, np.float32) for d in images.deepstack])
        return positions, images

    def _rope_tables(self, T: int, positions, ops=None):
        """cos/sin (T, D/2) of the next T tokens, and record where the rope position goes next. ``ops``:
        the student's pieces (``engine.pieces.PieceOps``), whose ``rope_tables`` then computes them."""
        c = self.config
        pos0 = self.cache.pos
        r0 = int(self._rope_next[pos0])
        # transformers' Qwen3-VL always interleaves (it never reads ``mrope_interleaved``)
        mrope = (c.mrope_section, c.mrope_interleaved or c.arch == "qwen3_vl")
        if positions is None:
            self._rope_next[pos0 + 1:pos0 + T + 1] = r0 + 1 + np.arange(T)
            if ops is not None:
                return ops.rope_tables(np.arange(r0, r0 + T), c.head_dim, c.rope_theta, scaling=c.rope_scaling)
            if r0 + T <= self.max_context:
                return self._cos[r0:r0 + T], self._sin[r0:r0 + T]
            return rope_cos_sin(np.arange(r0, r0 + T), c.head_dim, c.rope_theta, c.rope_scaling)
        nxt = np.maximum.accumulate(np.concatenate([[r0], positions.max(axis=0) + 1]))
        self._rope_next[pos0 + 1:pos0 + T + 1] = nxt[1:]
        if ops is not None:
            return ops.rope_tables(positions, c.head_dim, c.rope_theta, mrope, c.rope_scaling)
        return mrope_cos_sin(positions, c.head_dim, c.rope_theta, *mrope, c.rope_scaling)

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        if self.embed_qtype == Q.F16.id:
            out = np.empty((ids.size, self.config.hidden_size), np.float32)
            K.embed_f16(self.embed, ids, K.F16_TO_F32, out)
            return out
        return np.array(self.embed[ids], dtype=np.float32)

    def _forward(self, ids: np.ndarray, last_only: bool, positions=None,
                 images: ImageEmbeds | None = None) -> np.ndarray:
        if self._ops is not None:                  # the student's pieces are in this engine (``engine.pieces``)
            with numba_threads(self.threads):
                return P.forward(self, self._ops, ids, last_only, positions, images)
        c = self.config
        T = ids.size
        H, KVH, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        eps = np.float32(c.rms_norm_eps)
        pos0 = self.cache.pos
        cos, sin = self._rope_tables(T, positions)
        with numba_threads(self.threads) as nt:
            h = self._embed(ids)
            if images is not None:
                h[images.mask] = images.embeds          # the merger's output replaces the pad embeddings
            x = np.empty_like(h)
            o = np.empty((T, H, D), np.float32)
            if T == 1 and self._step is not None and self.trace is None and images is None:
                self._step(h, eps, self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm,
                           (self.q_bias, self.k_bias, self.v_bias), self.qk_norm, self.qkv_bias, self._planes,
                           self.cache.k, self.cache.v, pos0, cos, sin, H, nt, self.prefetch_bytes)
            else:
                for layer, m in enumerate(self.layers):
                    K.rmsnorm(h, self.attn_norm[layer], eps, x)
                    a = Activation(x)
                    q, k, v = _qkv(m, a)
                    if self.qkv_bias:                      # Qwen2: q/k/v projections with bias
                        q += self.q_bias[layer]
                        k += self.k_bias[layer]
                        v += self.v_bias[layer]
                    q, k, v = q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D)
                    if self.qk_norm:                       # Qwen3: per-head RMSNorm of q and k
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
                    if layer in self.moe_layers:
                        h += self.moe_layers[layer](x)
                    else:
                        g = _swiglu(m, Activation(x))
                        h += m["q4_down"](Activation(g))
                    if images is not None and layer < len(images.deepstack):
                        h[images.mask] += images.deepstack[layer]   # DeepStack: after layer 0, 1, …
                    if self.trace is not None:
                        self.trace(layer, h)
            self.cache.pos = pos0 + T
            hs = h[-1:] if last_only else h
            hn = np.empty_like(hs)
            K.rmsnorm(hs, self.final_norm, eps, hn)
            return self.lm_head(Activation(hn))


__all__ = ["Qwen3Engine", "ImageEmbeds", "ContextFullError"]
