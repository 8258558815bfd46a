"""Evaluation: perplexity with a sliding window, KL and top-1 against the F32 twin, hidden-state cosine, SNR.

What quantization costs, measured four ways, from the outside in:

- ``perplexity(engine, tokens)`` — ``exp(mean NLL)`` of a token stream. The stream is cut into windows
  of ``WINDOW`` = 256 tokens that start every ``STRIDE`` = 128 tokens, as Hugging Face's perplexity
  guide does: in each window the tokens after the overlap with the previous window are scored and the
  overlap is only context, so every token but the first is scored exactly once, each with at least
  128 tokens of context (except at the start). Each window runs from position 0 of a fresh KV cache:
  its context goes in with ``prefill``, then the scored part in chunks of ``CHUNK`` positions, whose
  logits are reduced to one NLL each at once — memory stays at one chunk's logits, whatever the length.
- ``kl_top1(quant_engine, f32_engine, tokens)`` — per position, KL(F32 ‖ quantized) of the next-token
  distributions and whether the argmax agrees; ``logit_agreement`` summarizes two logit arrays.
- ``hidden_cosine(quant_engine, f32_engine, tokens)`` — cosine of the residual stream after every layer,
  through the engine's tracing hook (``Qwen3Engine.trace``): where along the depth the error grows.
- ``snr_table(f32_vqf, quant_vqf)`` — each tensor's SNR in the quantized file's format
  (``quant.tensor_snr_db``): where the error comes from.

Data nobody here wrote: Debian's ``fortunes-zh`` (``read_fortunes``). Its ``tang300`` / ``song100``
files are what the poem model was trained on (in-domain: it memorised them, perplexity ≈ 1); its
``chinese`` file is modern prose, out-of-domain text for that model.

Checked against transformers' loss on the same tokens and windows (``perplexity_hf``; tests/test_eval.py).
Taught in day25_1 (perplexity) and day25_2 (KL, top-1, cosine, SNR).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kestrel_lab import quant as Q

WINDOW = 256   # tokens per window (HF's max_length)
STRIDE = 128   # a new window every STRIDE tokens; the rest of the window is context
CHUNK = 64     # scored positions per forward: bounds the (CHUNK, vocab) logits held at once

FORTUNES_DIR = Path("/usr/share/games/fortunes")
IN_DOMAIN = ("tang300", "song100")   # the poem model's training corpus (fortunes-zh 2.98)
OUT_OF_DOMAIN = ("chinese",)         # modern prose from the same package: not poems, not seen in training
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ----------------------------------------------------------------------------- data
def fortunes_path(name: str, root: str | os.PathLike | None = None) -> Path | None:
    """The fortunes-zh file ``name`` (``tang300``, ``song100``, ``chinese``), or None when absent.

    Taught in day25_1.
    """
    p = Path(root or FORTUNES_DIR) / name
    return p if p.is_file() else None


def fortunes_version(doc: str | os.PathLike = "/usr/share/doc/fortunes-zh/changelog.gz") -> str | None:
    """The installed fortunes-zh version (the first line of its Debian changelog), or None: the
    lessons put it in their provenance, since a new release may change the text. Taught in day25_1.
    """
    import gzip

    try:
        with gzip.open(doc, "rt", encoding="utf-8") as f:
            m = re.match(r"\S+ \(([^)]+)\)", f.readline())
    except OSError:
        return None
    return m.group(1) if m else None


def read_fortunes(path: str | os.PathLike) -> list[str]:
    """The entries of a fortune file (separated by lines ``%``), colour codes removed, each ending in
    one newline: ``《title》\\n作者：author\\n<lines>\\n`` for the poem files. Taught in day25_1.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 at byte offset {e.start}") from None
    entries = []
    for raw in re.split(r"^%\s*$", _ANSI.sub("", text), flags=re.M):
        body = raw.strip("\n")
        if body.strip():
            entries.append(body.rstrip() + "\n")
    return entries


def encode_entries(entries, tokenizer, separator: int, max_tokens: int | None = None) -> np.ndarray:
    """Token ids of the entries joined by ``separator`` (the poem model's ``<|endoftext|>``), as its
    training corpus was; stop encoding once ``max_tokens`` are reached. Taught in day25_1.
    """
    out: list[int] = []
    for text in entries:
        if out:
            out.append(int(separator))
        out.extend(tokenizer.encode(text, allow_special=False))
        if max_tokens is not None and len(out) >= max_tokens:
            return np.asarray(out[:max_tokens], dtype=np.int64)
    return np.asarray(out, dtype=np.int64)


# ----------------------------------------------------------------------------- the pieces
def log_softmax(z: np.ndarray) -> np.ndarray:
    """log softmax over the last axis in float64, max-shifted so nothing overflows. Taught in day25_1."""
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def token_nll(logits: np.ndarray, targets) -> np.ndarray:
    """−log p(target) at each row of ``logits`` (T, vocab): the loss of each scored token, in nats.

    Taught in day25_1.
    """
    targets = np.asarray(targets, np.int64)
    return -log_softmax(logits)[np.arange(targets.size), targets]


@dataclass(frozen=True)
class Window:
    """One window of the sliding evaluation: tokens ``[begin, end)`` are fed, ``[first, end)`` scored."""
    begin: int
    first: int
    end: int

    @property
    def scored(self) -> int:
        return self.end - self.first


def windows(n_tokens: int, window: int = WINDOW, stride: int = STRIDE) -> list[Window]:
    """HF's sliding windows over ``n_tokens``: starts every ``stride``, ``window`` long, each scoring
    the tokens after the previous window's end (the first window all but token 0). Taught in day25_1.
    """
    if not 0 < stride < window:
        raise ValueError(f"stride must be in (0, window) so that every window has context for its first scored "
                         f"token: stride={stride}, window={window}")
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + window, n_tokens)
        first = max(prev_end, begin + 1)
        if first < end:
            out.append(Window(begin, first, end))
        prev_end = end
        if end == n_tokens:
            break
    return out


@dataclass
class Perplexity:
    """A perplexity run: ``ppl = exp(mean_nll)`` over ``scored`` tokens, and each token's NLL."""
    ppl: float
    mean_nll: float
    scored: int
    windows: int
    window: int
    stride: int
    nll: np.ndarray = field(repr=False)   # nll[i] is the loss of token i + 1


def _engine(e, max_context: int):
    if isinstance(e, (str, os.PathLike)):
        from kestrel_lab.engine.model import Qwen3Engine

        return Qwen3Engine.from_vqf(e, max_context=max_context)
    if e.max_context < max_context:
        raise ValueError(f"{e.source}: max_context {e.max_context} is shorter than the {max_context} tokens asked for")
    return e


def _tokens(tokens) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.ndim != 1 or arr.size < 2 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D integer sequence of at least 2 ids, got {arr.dtype} shape {arr.shape}")
    return arr.astype(np.int64)


def perplexity(engine, tokens, window: int = WINDOW, stride: int = STRIDE, chunk: int = CHUNK) -> Perplexity:
    """Perplexity of ``tokens`` under ``engine`` (a ``Qwen3Engine`` or the path of any VQF file) with the
    sliding window (module docstring). The engine's KV cache is reset per window. Taught in day25_1.
    """
    ids = _tokens(tokens)
    eng = _engine(engine, window)
    nll = np.full(ids.size - 1, np.nan)
    wins = windows(ids.size, window, stride)
    for w in wins:
        eng.reset()
        ctx_end = w.first - 1                  # logits at positions first−1 … end−2 score first … end−1
        if ctx_end > w.begin:
            eng.prefill(ids[w.begin:ctx_end])
        for s in range(ctx_end, w.end - 1, chunk):
            e = min(s + chunk, w.end - 1)
            nll[s:e] = token_nll(eng.forward_all(ids[s:e]), ids[s + 1:e + 1])
    eng.reset()
    assert not np.isnan(nll).any(), "a token was not scored"
    mean = float(nll.mean())
    return Perplexity(float(math.exp(mean)), mean, int(nll.size), len(wins), window, stride, nll)


def perplexity_hf(model, tokens, window: int = WINDOW, stride: int = STRIDE) -> Perplexity:
    """The same perplexity with a transformers causal LM, by HF's guide: each window is one forward with
    ``labels`` (−100 on the context), and transformers computes the loss. Each window's mean loss is
    weighted by the tokens transformers really scored there (labels shift by one inside the model), so
    the result is the mean over every token once — the guide's ``num_valid − 1`` is one short after the
    first window. The result's ``nll`` holds each window's mean loss (not one per token). Needs torch.
    Taught in day25_1.
    """
    import torch

    ids = _tokens(tokens)
    total, count, per = 0.0, 0, []
    wins = windows(ids.size, window, stride)
    with torch.no_grad():
        for w in wins:
            inp = torch.tensor(ids[None, w.begin:w.end])
            labels = inp.clone()
            labels[:, :w.first - w.begin] = -100
            n = int((labels[:, 1:] != -100).sum())
            assert n == w.scored
            loss = float(model(input_ids=inp, labels=labels).loss)
            total += loss * n
            count += n
            per.append(loss)
    mean = total / count
    return Perplexity(float(math.exp(mean)), mean, count, len(wins), window, stride, np.asarray(per))


# ----------------------------------------------------------------------------- quantized vs F32
def logit_agreement(ref: np.ndarray, other: np.ndarray) -> dict:
    """How far ``other`` logits (T, vocab) are from ``ref``: KL(ref‖other) of the softmaxes (mean, max,
    in nats), top-1 agreement (fraction of positions whose argmax agrees), max abs difference and the
    logits' scale; day12_3's exercise A1 re-derives it (through the re-export in ``engine.reference``).
    Taught in day25_2.
    """
    ref = np.asarray(ref, np.float64).reshape(-1, np.shape(ref)[-1])
    other = np.asarray(other, np.float64).reshape(ref.shape)
    lp, lq = log_softmax(ref), log_softmax(other)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1_agreement": float((ref.argmax(-1) == other.argmax(-1)).mean()),
            "max_abs_diff": float(np.abs(ref - other).max()), "logit_scale": float(np.abs(ref).max()),
            "positions": int(ref.shape[0])}


@dataclass
class KLTop1:
    """Per position: KL(F32 ‖ quantized) in nats, and whether the two argmaxes agree."""
    kl: np.ndarray
    top1: np.ndarray

    @property
    def kl_mean(self) -> float:
        return float(self.kl.mean())

    @property
    def kl_max(self) -> float:
        return float(self.kl.max())

    @property
    def top1_agreement(self) -> float:
        return float(self.top1.mean())


def kl_top1(quant_engine, f32_engine, tokens, chunk: int = CHUNK) -> KLTop1:
    """KL and top-1 agreement of a quantized file against its F32 twin at every position of ``tokens``
    (one pass from position 0; engines or VQF paths). Chunked: one chunk's logits at a time.
    Taught in day25_2.
    """
    ids = np.asarray(tokens, np.int64)
    qe, fe = _engine(quant_engine, ids.size), _engine(f32_engine, ids.size)
    if qe is fe:
        raise ValueError(f"{qe.source}: kl_top1 needs two engines (the two KV caches advance chunk by chunk)")
    qe.reset()
    fe.reset()
    kl, top1 = [], []
    for s in range(0, ids.size, chunk):
        zf, zq = fe.forward_all(ids[s:s + chunk]), qe.forward_all(ids[s:s + chunk])
        lp, lq = log_softmax(zf), log_softmax(zq)
        kl.append((np.exp(lp) * (lp - lq)).sum(-1))
        top1.append(zf.argmax(-1) == zq.argmax(-1))
    qe.reset()
    fe.reset()
    return KLTop1(np.concatenate(kl), np.concatenate(top1))


def trace_hidden(engine, tokens) -> np.ndarray:
    """The residual stream after every layer, (layers, T, hidden) float32, through ``engine.trace``.

    Taught in day25_2.
    """
    ids = np.asarray(tokens, np.int64)
    eng = _engine(engine, ids.size)
    L, D = eng.config.num_hidden_layers, eng.config.hidden_size
    out = np.empty((L, ids.size, D), np.float32)
    pos = [0]

    def keep(layer, h):
        out[layer, pos[0]:pos[0] + h.shape[0]] = h

    eng.reset()
    eng.trace = keep
    try:
        for s in range(0, ids.size, CHUNK):
            pos[0] = s
            eng.forward_all(ids[s:s + CHUNK])
    finally:
        eng.trace = None
        eng.reset()
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity over the last axis, in float64. Taught in day25_2."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def hidden_cosine(quant_engine, f32_engine, tokens) -> np.ndarray:
    """Cosine (layers, T) between the quantized and the F32 engine's hidden state after each layer.

    Taught in day25_2.
    """
    return cosine(trace_hidden(quant_engine, tokens), trace_hidden(f32_engine, tokens))


def snr_table(f32_vqf, quant_vqf) -> list[dict]:
    """One row per tensor of ``quant_vqf``: its qtype and ``quant.tensor_snr_db`` of the F32 twin's
    values in that qtype (+inf where the tensor stays F32). Taught in day25_2.
    """
    from kestrel_lab.vqf.reader import open_vqf

    ref, qf = open_vqf(f32_vqf), open_vqf(quant_vqf)
    rows = []
    for name, t in qf.tensors.items():
        if name not in ref.tensors:
            raise ValueError(f"{quant_vqf}: tensor {name!r} has no twin in {f32_vqf}")
        r = ref.tensors[name]
        if r.qtype != Q.F32.id or (r.rows, r.cols) != (t.rows, t.cols):
            raise ValueError(f"{f32_vqf}: tensor {name!r} is {Q.qtype(r.qtype).name} {r.rows}×{r.cols}; "
                             f"an F32 {t.rows}×{t.cols} twin is needed")
        x = r.data.view("<f4").reshape(r.rows, r.cols)
        rows.append({"tensor": name, "qtype": Q.qtype(t.qtype).name, "rows": t.rows, "cols": t.cols,
                     "bytes": int(t.data.nbytes), "snr_db": Q.tensor_snr_db(x, t.qtype)})
    return rows
