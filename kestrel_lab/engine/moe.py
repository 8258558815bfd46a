"""Qwen3-MoE's sparse FFN: the router, the chosen experts' SwiGLU, their weighted sum — experts in place.

One MoE layer, exactly as ``transformers``' ``Qwen3MoeSparseMoeBlock`` (5.24)::

    logits = W_router x                     (F32, one logit per expert, no bias)
    p      = softmax(logits)                (over *all* experts, in float32)
    top    = the k largest p, in descending order (torch.topk)
    w      = p[top] / sum(p[top])  if norm_topk_prob  else  p[top]
    y      = sum_j  w_j · Wdown[e_j] (silu(Wgate[e_j] x) · Wup[e_j] x)

No shared expert (Qwen2-MoE had one; Qwen3-MoE does not). The experts' weights live in three stacked
VQF entries (``q4_gate_exps``, ``q4_up_exps``, ``q4_down_exps``: MoE layer major, expert minor), and
each expert's gate, up and down matrix is one contiguous run of rows there (``vqf.layout.expert_runs``).
The engine takes **views** of those runs from the file's mapping — nothing is copied at load — so a
token touches only its k experts' pages, and on a cold start only the experts the prompt chooses are
read from the disk.

**Grouped by expert** (llama.cpp's ``mul_mat_id``): for a chunk of T tokens the router gives T·k
(token, slot) pairs; ``group`` sorts them by expert, and the expert kernels work on (active expert,
rows) items, so each chosen expert's matrices are read once per chunk whatever the number of its
tokens. For one token (decode) that is exactly k experts × 3 matrices. Which kernel runs comes from
the registry (call ``experts``): plain Q4_0 has a numba kernel on the file's layout
(``kernels.ops.experts_swiglu_q4_0`` / ``experts_down_q4_0``, one parallel region per half); every other
layout goes expert by expert through the ordinary ``many`` kernels on per-expert views.

**Paging** (``paging``): "os" leaves the mapping to the kernel's defaults — a page fault reads ahead
around itself (``read_ahead_kb``, often 128 KB to several MB), so a token also pages in its chosen
experts' neighbours; "exact" turns read-ahead off on the expert stacks (``MADV_RANDOM``) and asks for
exactly the chosen experts' runs before each product (``MADV_WILLNEED``), so what is read from the
disk is what the token uses.

The layer also counts what it touched: weight bytes of the router and of each expert run it read,
and how often each expert was chosen — the engine's own account of "bytes per token" (day22_2) and
of how many distinct experts a prompt pages in (day22_3).
Taught in day22_1 (routing) and day22_2 (experts, grouping, bytes per token).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap as _mmap
from dataclasses import dataclass

import numpy as np

from kestrel_lab.kernels import registry
from kestrel_lab.kernels.linear import Activation, Linear
from kestrel_lab.vqf.layout import plan


def softmax_f32(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32 (subtract the max, exponentiate, divide): the router's probabilities.

    Taught in day22_1.
    """
    z = np.asarray(logits, dtype=np.float32)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def route(logits: np.ndarray, top_k: int, norm_topk_prob: bool) -> tuple[np.ndarray, np.ndarray]:
    """(experts (T, k) int64 in descending probability, weights (T, k) float32) from router logits (T, E).

    Softmax over all experts, the k most probable (ties to the lower expert id, like a stable sort),
    renormalised to sum 1 when ``norm_topk_prob`` (Qwen3-30B-A3B sets it; transformers' default is
    False). Taught in day22_1.
    """
    logits = np.atleast_2d(logits)
    E = logits.shape[-1]
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k = {top_k}: must be between 1 and the {E} experts")
    p = softmax_f32(logits)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, idx, axis=-1)
    if norm_topk_prob:
        w = (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)
    return idx.astype(np.int64), w.astype(np.float32)


@dataclass
class Groups:
    """The (token, slot) pairs of a chunk sorted by expert: what the expert kernels iterate over.

    ``experts``: the active expert ids, ascending; pairs ``start[a]..start[a+1]`` belong to
    ``experts[a]``; ``tok[p]`` is pair ``p``'s token; ``pair_of[t, j]`` is where token ``t``'s slot ``j``
    went. Taught in day22_2.
    """
    experts: np.ndarray
    start: np.ndarray
    tok: np.ndarray
    pair_of: np.ndarray

    @property
    def n_pairs(self) -> int:
        return int(self.tok.size)


def group(selected: np.ndarray) -> Groups:
    """Sort a chunk's routing (T, k) by expert (``mul_mat_id``'s ``matrix_rows``). Taught in day22_2."""
    T, k = selected.shape
    flat = selected.reshape(-1)
    order = np.argsort(flat, kind="stable")
    experts, counts = np.unique(flat[order], return_counts=True)
    start = np.zeros(experts.size + 1, np.int64)
    np.cumsum(counts, out=start[1:])
    pair_of = np.empty(T * k, np.int64)
    pair_of[order] = np.arange(T * k)
    return Groups(experts.astype(np.int64), start, (order // k).astype(np.int64), pair_of.reshape(T, k))


PAGING = ("os", "exact")
_MADV = {"random": getattr(_mmap, "MADV_RANDOM", 1), "willneed": getattr(_mmap, "MADV_WILLNEED", 3)}


def _libc_madvise():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_madvise_fn = _libc_madvise()


def advise(arr: np.ndarray, advice: str) -> bool:
    """``madvise`` the pages under a numpy view of a mapped file ("random": no read-ahead around a
    fault; "willneed": start reading these pages now). False where madvise is unavailable. Taught in day22_3."""
    if _madvise_fn is None or arr.size == 0:
        return False
    addr = arr.__array_interface__["data"][0]
    start = addr & ~(_mmap.PAGESIZE - 1)
    return _madvise_fn(ctypes.c_void_p(start), addr + arr.nbytes - start, _MADV[advice]) == 0


class ExpertStack:
    """One MoE layer's experts: zero-copy views of its runs in the three stacked entries.

    ``gate``/``up``: (E, m, row bytes) and ``down``: (E, h, row bytes) for the plain block layouts (a
    reshape of the mapped bytes, no copy); ``linear(kind, e)`` gives one expert's matrix as a
    ``kernels.linear.Linear`` for the layouts without a grouped kernel. ``expert_bytes``: bytes of one expert's
    three matrices (what a token reads per chosen expert). Taught in day22_2.
    """

    def __init__(self, k: int, config, gate, up, down):
        E, m, h = config.num_experts, config.moe_intermediate_size, config.hidden_size
        self.E, self.m, self.h, self.index = E, m, h, k
        self.qtype = gate.qtype
        self.activation = Activation
        self._cache: dict = {}
        self._raw = {}
        for kind, t, rows in (("gate", gate, m), ("up", up, m), ("down", down, h)):
            per = t.data.size // (t.rows // rows)          # bytes of one expert's matrix
            flat = t.data.reshape(-1)[k * E * per:(k + 1) * E * per]
            if flat.flags.writeable:                        # one numba specialization for mmap and memory
                flat = flat.view()
                flat.setflags(write=False)
            self._raw[kind] = (flat, per, rows, t.cols)
        self.expert_bytes = sum(per for _, per, _, _ in self._raw.values())
        first = Linear(self.qtype, m, gate.cols, self._raw["gate"][0][:self._raw["gate"][1]])
        self.layout = first.layout
        if self.layout in ("F32", "F16", "Q8_0", "Q4_0"):
            g, u, d = (self._raw[x][0].reshape(E, self._raw[x][2], -1) for x in ("gate", "up", "down"))
            self.gate, self.up, self.down = g, u, d
        else:
            self.gate = self.up = self.down = None

    def advise_random(self) -> bool:
        """No read-ahead on this layer's expert runs: a page fault reads only its own page."""
        return all([advise(flat, "random") for flat, _, _, _ in self._raw.values()])

    def prefetch(self, experts) -> None:
        """Ask the OS to read exactly these experts' three runs (``MADV_WILLNEED``), nothing around them."""
        for flat, per, _, _ in self._raw.values():
            for e in experts:
                advise(flat[int(e) * per:(int(e) + 1) * per], "willneed")

    def linear(self, kind: str, e: int):
        """Expert ``e``'s ``kind`` matrix ("gate", "up", "down") as a ``Linear`` on its run (cached)."""
        key = (kind, e)
        if key not in self._cache:
            flat, per, rows, cols = self._raw[kind]
            self._cache[key] = Linear(self.qtype, rows, cols, flat[e * per:(e + 1) * per],
                                     f"{kind}_exps[{self.index}][{e}]")
        return self._cache[key]


class MoELayer:
    """Router + experts of one layer: ``__call__(x)`` → the FFN output (T, hidden) float32.

    ``router`` is the layer's F32 ``Linear`` (E × hidden); ``experts`` an ``ExpertStack``. Counters:
    ``hits`` (how many tokens chose each expert), ``bytes_touched`` (router bytes per call + one
    ``expert_bytes`` per distinct expert per call), ``last`` (the last call's experts and weights) and
    ``last_logits`` (its router logits).
    Taught in day22_2.
    """

    def __init__(self, router, experts: ExpertStack, top_k: int, norm_topk_prob: bool, paging: str = "os",
                 route_fn=None):
        if paging not in PAGING:
            raise ValueError(f"expert paging {paging!r}: expected one of {', '.join(PAGING)}")
        self.router, self.experts = router, experts
        self.paging = paging
        if paging == "exact":
            experts.advise_random()
        self.top_k, self.norm = int(top_k), bool(norm_topk_prob)
        self.route = route_fn or route           # a student's ``moe.route`` piece (``kestrel_lab.seam``), else ours
        self._act = experts.activation
        self.kernel = registry.select(experts.layout, "experts")
        if self.kernel is None:
            raise ValueError(f"no kernel is registered for {experts.layout} experts")
        self.hits = np.zeros(experts.E, np.int64)
        self.bytes_touched = 0
        self.calls = 0
        self.last: tuple[np.ndarray, np.ndarray] | None = None
        self.last_logits: np.ndarray | None = None

    def reset_counters(self) -> None:
        """Zero the hit counts and the bytes touched."""
        self.hits[:] = 0
        self.bytes_touched = 0
        self.calls = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        a = self._act(x)
        logits = self.router(a)
        selected, weights = self.route(logits, self.top_k, self.norm)
        if self.route is not route:             # a student's piece: its results as this layer's types
            selected = np.asarray(selected, np.int64).reshape(logits.shape[0], self.top_k)
            weights = np.asarray(weights, np.float32).reshape(logits.shape[0], self.top_k)
        self.last = (selected, weights)
        self.last_logits = logits
        g = group(selected)
        if self.paging == "exact":
            self.experts.prefetch(g.experts)
        out_pairs = np.empty((g.n_pairs, self.experts.h), np.float32)
        self.kernel(self.experts, a, g, out_pairs)
        self.hits[g.experts] += np.diff(g.start)      # (token, slot) pairs per expert
        self.bytes_touched += self.router.nbytes + g.experts.size * self.experts.expert_bytes
        self.calls += 1
        # weighted sum over each token's k slots, slot order (the weights are per (token, slot))
        return np.einsum("tk,tkh->th", weights, out_pairs[g.pair_of], dtype=np.float32, casting="unsafe")


def active_bytes(config, quant="q4_0") -> dict[str, int]:
    """Weight bytes one decoded token reads, by part, computed from the file's plan (no weights).

    Attention matrices and norms whole; each MoE layer's router whole and ``num_experts_per_tok`` of
    its experts (each expert's three matrices); each dense layer's FFN whole; one row of the
    embedding; the LM head whole. ``total`` sums them; ``file`` is every entry's bytes (what the
    file holds, what a dense reading would touch). Taught in day22_2.
    """
    E, k = max(1, config.num_experts), config.num_experts_per_tok
    out = {"attention": 0, "norms": 0, "router": 0, "experts": 0, "dense_ffn": 0, "embedding_row": 0,
           "lm_head": 0}
    total_file = 0
    for s in plan(config, quant):
        total_file += s.nbytes
        if s.name == "token_embed":
            out["embedding_row"] += s.nbytes // s.rows
        elif s.name.endswith("_exps"):
            out["experts"] += s.nbytes * k // E
        elif s.name == "moe_router":
            out["router"] += s.nbytes
        elif s.name == "q4_lm":
            out["lm_head"] += s.nbytes
        elif s.name in ("q4_q", "q4_k", "q4_v", "q4_o"):
            out["attention"] += s.nbytes
        elif s.name.startswith(("q4_gate", "q4_up", "q4_down")):
            out["dense_ffn"] += s.nbytes
        else:
            out["norms"] += s.nbytes
    out["total"] = sum(out.values())
    out["file"] = total_file
    return out


def active_params(config) -> dict[str, int]:
    """Parameters one decoded token uses, by part (``ModelConfig.param_counts`` restricted to what a token
    reads): the embedding (one table; a tied LM head is the same table, counted once), every attention
    matrix and norm, each MoE layer's router and ``num_experts_per_tok`` of its experts (three matrices
    of ``moe_intermediate_size`` each), each dense layer's FFN, and an untied LM head. ``total`` sums
    them — Qwen3-30B-A3B's "A3B" (about 3.35 B); for a dense model it equals all its parameters
    (Qwen3-4B: 4.02 B). Taught in day22_2."""
    h = config.hidden_size
    n_moe = len(config.moe_layers)
    pc = config.param_counts()
    out = {"embedding": pc["embedding"], "attention": pc["attention"], "norms": pc["norms"],
           "router": n_moe * config.num_experts * h,
           "experts": n_moe * config.num_experts_per_tok * 3 * h * config.moe_intermediate_size,
           "dense_ffn": (config.num_hidden_layers - n_moe) * 3 * h * config.intermediate_size,
           "lm_head": pc["lm_head"]}
    out["total"] = sum(out.values())
    return out


__all__ = ["softmax_f32", "route", "group", "Groups", "ExpertStack", "MoELayer", "active_bytes", "active_params",
           "advise", "PAGING"]
