"""Sampling: turn one step's logits into the next token id.

The engine hands back a float32 vector of ``vocab`` logits per step; everything that decides which
token comes next lives here, as whole-vector numpy operations (no Python loop over the vocabulary):

1. **repetition penalty** (CTRL, Keskar et al. 2019, the convention of HF ``transformers``): for every
   id already in the history, a positive logit is *divided* by the penalty and a negative one
   *multiplied* by it, so both move towards "less likely";
2. **temperature** ``T``: logits / T. ``T = 0`` means greedy (argmax), the limit of T → 0;
3. **top-k**: keep the k largest logits (ties with the k-th are kept, as transformers does);
4. **top-p** (nucleus): keep the smallest set of most-likely tokens whose probability mass is ≥ p;
5. **min-p**: keep tokens whose probability is ≥ min_p × the top token's probability;
6. draw one id from the remaining distribution with a ``numpy.random.Generator`` seeded explicitly, so a
   run with the same seed, prompt and model repeats exactly.

The order (penalty, temperature, then the filters) is transformers' order, so its results can be
compared with ours. Taught in day13_1 (greedy), day13_2 (temperature / top-k / top-p) and day13_3
(repetition penalty and seeds).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

import numpy as np

from kestrel_lab import seam

__all__ = [
    "SamplingParams", "Sampler", "softmax", "entropy", "apply_repetition_penalty", "apply_temperature",
    "top_k_filter", "top_p_filter", "min_p_filter", "greedy",
]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. The defaults are plain sampling at temperature 1 with no filter.

    ``top_k = 0`` and ``top_p = 1`` and ``min_p = 0`` switch the filters off; ``temperature = 0`` is
    greedy decoding; ``repetition_penalty = 1`` switches the penalty off; ``seed = None`` draws fresh
    entropy from the OS (the run is then not reproducible). Taught in day13_2.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        def bad(field: str, value, why: str):
            raise ValueError(f"SamplingParams.{field} = {value!r}: {why}")

        if not np.isfinite(self.temperature) or self.temperature < 0:
            bad("temperature", self.temperature, "must be a finite number ≥ 0 (0 = greedy)")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            bad("top_k", self.top_k, "must be an integer ≥ 0 (0 = off)")
        if not (0.0 < self.top_p <= 1.0):
            bad("top_p", self.top_p, "must be in (0, 1] (1 = off)")
        if not (0.0 <= self.min_p < 1.0):
            bad("min_p", self.min_p, "must be in [0, 1) (0 = off)")
        if not np.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            bad("repetition_penalty", self.repetition_penalty, "must be a finite number > 0 (1 = off)")
        if self.seed is not None and (int(self.seed) != self.seed or self.seed < 0):
            bad("seed", self.seed, "must be an integer ≥ 0 or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **changes) -> "SamplingParams":
        return replace(self, **changes)


# ----------------------------------------------------------------------------- building blocks
def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities from logits in float64 (max subtracted first; -inf logits get probability 0).

    Taught in day13_2.
    """
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x)
    if not np.isfinite(m):
        raise ValueError("softmax: every logit is -inf (or the vector holds NaN/+inf)")
    e = np.exp(x - m)
    return e / e.sum()


def entropy(probs: np.ndarray) -> float:
    """Shannon entropy in bits of a probability vector (zeros contribute nothing). Taught in day13_2."""
    p = np.asarray(probs, dtype=np.float64)
    nz = p[p > 0]
    return float(-(nz * np.log2(nz)).sum())


def greedy(logits: np.ndarray) -> int:
    """The id of the largest logit (the first one on ties, as ``np.argmax``). Taught in day13_1."""
    return int(np.argmax(logits))


def apply_repetition_penalty(logits: np.ndarray, history: Iterable[int] | np.ndarray,
                             penalty: float) -> np.ndarray:
    """CTRL's penalty on every id seen in ``history``: positive logits / penalty, negative × penalty.

    Each id counts once however often it occurred (as in CTRL and transformers). Returns a new array.
    Taught in day13_3.
    """
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0:
        return out
    ids = np.unique(np.fromiter(history, dtype=np.int64) if not isinstance(history, np.ndarray)
                    else history.astype(np.int64))
    if ids.size == 0:
        return out
    if ids[0] < 0 or ids[-1] >= out.size:
        raise ValueError(f"repetition penalty: history holds id {ids[0] if ids[0] < 0 else ids[-1]} "
                         f"outside the vocabulary [0, {out.size})")
    seen = out[ids]
    out[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
    return out


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """logits / T (T > 0). T < 1 sharpens the distribution, T > 1 flattens it. Taught in day13_2."""
    if temperature <= 0:
        raise ValueError(f"temperature {temperature} must be > 0 here (0 means greedy: use greedy())")
    return np.asarray(logits, dtype=np.float64) / temperature


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Set every logit below the k-th largest to -inf (ties with the k-th kept). k = 0: no change.

    ``np.partition`` finds the k-th value in O(vocab) without sorting everything. Taught in day13_2.
    """
    x = np.array(logits, dtype=np.float64, copy=True)
    if k <= 0 or k >= x.size:
        return x
    kth = np.partition(x, x.size - k)[x.size - k]
    x[x < kth] = -np.inf
    return x


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus filter: keep the smallest set of most-likely tokens whose mass is ≥ p; -inf the rest.

    Tokens are sorted by probability (descending, ties by id); a token is kept when the mass of the
    tokens before it is still < p, so the kept prefix is the shortest one that reaches p, and the top
    token is always kept. p = 1: no change.

    Sorting all 151,936 probabilities costs ~20 ms per sampled token, yet the nucleus is usually a
    few hundred tokens. So the candidates are found first with ``np.partition`` (O(vocab)): every
    token at least as likely as the ``n``-th most likely one — all ties included, so they are exactly
    the first tokens of the full (probability, id) order — and only they are sorted. When their mass
    already reaches ``p`` the kept set lies inside them and the result is the full sort's, bit for
    bit (the same cumulative sums over the same prefix); otherwise ``n`` grows until it does.
    Taught in day13_2.
    """
    x = np.array(logits, dtype=np.float64, copy=True)
    if p >= 1.0:
        return x
    probs = softmax(x)
    n = min(probs.size, TOP_P_FIRST_CANDIDATES)
    while True:
        if n >= probs.size:
            cand = np.arange(probs.size)
        else:
            nth = np.partition(probs, probs.size - n)[probs.size - n]
            cand = np.flatnonzero(probs >= nth)  # ascending ids: the stable sort keeps ties by id
        order = cand[np.argsort(-probs[cand], kind="stable")]
        sorted_p = probs[order]
        before = np.cumsum(sorted_p) - sorted_p  # mass strictly before each sorted token
        if cand.size == probs.size or before[-1] + sorted_p[-1] >= p:
            break
        n *= 8
    keep = np.zeros(probs.size, dtype=bool)
    keep[order[before < p]] = True
    x[~keep] = -np.inf
    return x


TOP_P_FIRST_CANDIDATES = 1024  # first guess at the nucleus size: grows ×8 when it holds less than p


def min_p_filter(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Keep tokens with probability ≥ min_p × max probability; -inf the rest. Taught in day13_2."""
    x = np.array(logits, dtype=np.float64, copy=True)
    if min_p <= 0.0:
        return x
    probs = softmax(x)
    x[probs < min_p * probs.max()] = -np.inf
    return x


# ----------------------------------------------------------------------------- the sampler
class Sampler:
    """Picks next tokens with one ``SamplingParams`` and one seeded random generator.

    The generator is created once per sampler: two samplers made with the same seed and fed the same
    logits return the same ids. ``reseed`` starts the stream again. Taught in day13_2 and day13_3.
    """

    def __init__(self, params: SamplingParams | None = None, **kwargs):
        if params is not None and kwargs:
            raise TypeError("Sampler: pass either a SamplingParams or keyword arguments, not both")
        self.params = params if params is not None else SamplingParams(**kwargs)
        self.rng = np.random.default_rng(self.params.seed)
        # a student's ``sampling.draw`` piece swapped in when the sampler is made (``kestrel_lab.seam``)
        self.draw = seam.get("sampling.draw")

    def reseed(self, seed: int | None = None) -> None:
        """Restart the random stream (from ``seed``, or from the params' seed)."""
        self.rng = np.random.default_rng(self.params.seed if seed is None else seed)

    def adjusted_logits(self, logits: np.ndarray, history: Iterable[int] = ()) -> np.ndarray:
        """The logits after penalty, temperature and filters (-inf = excluded), in float64.

        For greedy params only the penalty applies. Taught in day13_2.
        """
        p = self.params
        x = np.asarray(logits)
        if x.ndim != 1 or x.size == 0:
            raise ValueError(f"Sampler: logits must be a non-empty 1-D vector, got shape {x.shape}")
        x = apply_repetition_penalty(x, history, p.repetition_penalty)
        if p.greedy:
            return x.astype(np.float64)
        x = apply_temperature(x, p.temperature)
        x = top_k_filter(x, p.top_k)
        x = top_p_filter(x, p.top_p)
        x = min_p_filter(x, p.min_p)
        return x

    def probs(self, logits: np.ndarray, history: Iterable[int] = ()) -> np.ndarray:
        """The distribution the next id is drawn from (one-hot on the argmax when greedy).

        Taught in day13_2.
        """
        x = self.adjusted_logits(logits, history)
        if self.params.greedy:
            out = np.zeros(x.size, dtype=np.float64)
            out[int(np.argmax(x))] = 1.0
            return out
        return softmax(x)

    def __call__(self, logits: np.ndarray, history: Iterable[int] = ()) -> int:
        """Draw the next id. Greedy consumes no random numbers; sampling consumes exactly one."""
        if self.draw is not None:
            return self._draw_piece(logits, history)
        x = self.adjusted_logits(logits, history)
        if self.params.greedy:
            return int(np.argmax(x))
        probs = softmax(x)
        # Inverse-CDF draw: one uniform number, a cumulative sum, a binary search. The last kept id
        # catches the rounding of the cumulative sum below 1.
        cdf = np.cumsum(probs)
        u = self.rng.random() * cdf[-1]
        i = int(np.searchsorted(cdf, u, side="right"))
        if i >= probs.size or probs[i] == 0.0:
            i = int(np.flatnonzero(probs)[-1] if i >= probs.size else np.flatnonzero(probs[i:])[0] + i)
        return i

    def _draw_piece(self, logits: np.ndarray, history: Iterable[int]) -> int:
        """The student's ``draw(logits, T, top_k, top_p, u)`` on the penalised logits (T = 0: greedy, no
        random number used), with the same one uniform number per draw as the package's own path."""
        p = self.params
        if p.min_p:
            raise ValueError("Sampler: min_p is not part of the sampling.draw piece; use the package's sampler")
        x = apply_repetition_penalty(np.asarray(logits), history, p.repetition_penalty)
        u = 0.0 if p.greedy else float(self.rng.random())
        return int(self.draw(np.array(x, dtype=np.float32), 0.0 if p.greedy else p.temperature, p.top_k, p.top_p, u))

    def __repr__(self) -> str:
        return f"Sampler({self.params})"
