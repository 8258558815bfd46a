"""The generation loop shared by ``kestrel-lab generate``, ``kestrel-lab chat`` and the notebooks.

One turn is: prefill the prompt (one batched forward over all its tokens) → sample the first token →
then, until a stop token, the length limit or the context limit: decode one token (one forward step
that appends to the KV cache) → sample. Each complete piece of text goes to ``on_text`` as soon as it
exists (through ``StreamDecoder``, so never half a character).

The per-turn ``TurnStats`` are what a user feels: prompt tokens (and how many of them the KV cache
already held), prefill tok/s, time to first token (TTFT: from the start of the turn to the first
sampled token), decode tok/s (engine forward steps only; sampling time is counted apart).

Taught in day13_1 (the loop) and day14_2 (per-turn statistics, TTFT).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from kestrel_lab.engine.sample import Sampler, SamplingParams
from kestrel_lab.engine.stream import StreamDecoder

__all__ = ["ENDOFTEXT", "IM_END", "STOP_IDS", "TurnStats", "GenerationOutput", "run_turn", "generate"]

ENDOFTEXT = 151643  # <|endoftext|>: ends a document (the poem model ends every poem with it)
IM_END = 151645     # <|im_end|>: ends a chat message
#: The ids that end a turn by default: the one set, used by ``generate``, ``run_turn`` and ``chat``.
STOP_IDS = frozenset({IM_END, ENDOFTEXT})


@dataclass
class TurnStats:
    """What one turn cost. Times in seconds. Taught in day14_2."""

    prompt_tokens: int = 0      # tokens of the whole prompt (history included)
    reused_tokens: int = 0      # of those, already in the KV cache
    prefilled_tokens: int = 0   # of those, run through prefill this turn
    new_tokens: int = 0         # tokens generated (the stop token not counted)
    decoded_tokens: int = 0     # forward steps run by decode()
    prefill_s: float = 0.0
    decode_s: float = 0.0       # time inside engine.decode
    sample_s: float = 0.0       # time inside the sampler
    ttft_s: float = 0.0         # start of turn → first token sampled
    total_s: float = 0.0
    stop_reason: str = ""       # "stop" (a stop token), "length" (max_new), "context" (cache full)
    # Qwen3-VL: one (LLM tokens, encode seconds, reused from the feature cache) per image of the turn
    images: list = field(default_factory=list)

    @property
    def prefill_tok_s(self) -> float:
        return self.prefilled_tokens / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tok_s(self) -> float:
        return self.decoded_tokens / self.decode_s if self.decode_s > 0 else float("nan")

    def line(self) -> str:
        """The one-line summary printed after each turn."""
        reuse = f" ({self.reused_tokens} cached)" if self.reused_tokens else ""
        dec = (f"decode {self.new_tokens} tok, {self.decode_tok_s:.1f} tok/s"
               if self.decoded_tokens else f"decode {self.new_tokens} tok")
        vision = ""
        if self.images:
            per = ", ".join(f"{n} tok {'cached' if reused else f'{s * 1e3:.0f} ms'}" for n, s, reused in self.images)
            vision = f" | vision {len(self.images)} img: {per}, encode {self.vision_s * 1e3:.0f} ms"
        return (f"[prompt {self.prompt_tokens} tok{reuse}{vision} | prefill {self.prefilled_tokens} tok, "
                f"{self.prefill_tok_s:.1f} tok/s | TTFT {self.ttft_s * 1e3:.0f} ms | {dec} | "
                f"stop: {self.stop_reason}]")

    @property
    def vision_s(self) -> float:
        """Seconds spent in the vision tower this turn (images encoded, not reused)."""
        return float(sum(s for _, s, reused in self.images if not reused))

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(prefill_tok_s=self.prefill_tok_s, decode_tok_s=self.decode_tok_s, vision_s=self.vision_s)
        return d


@dataclass
class GenerationOutput:
    """The generated ids (stop token excluded), their text, the stop token (or None) and the stats.

    ``fed_ids`` are the generated ids that went through ``decode`` and so sit in the KV cache (all of
    ``ids`` except the last one when generation ended on a limit rather than on a stop token).
    Taught in day13_1.
    """

    ids: list[int]
    text: str
    stop_id: int | None
    fed_ids: list[int]
    stats: TurnStats = field(default_factory=TurnStats)


def _max_context(engine) -> int | None:
    """The engine's context limit (``Qwen3Engine.max_context``), or None for an engine without one."""
    v = getattr(engine, "max_context", None)
    return v if isinstance(v, int) else None


def run_turn(engine, tokenizer, logits, sampler: Sampler, *, max_new: int,
             stop_ids: Iterable[int] = STOP_IDS, history: Sequence[int] = (),
             on_text: Callable[[str], None] | None = None, stats: TurnStats | None = None,
             t_start: float | None = None) -> GenerationOutput:
    """Sample from ``logits`` (the prefill's), then decode until a stop token or a limit.

    ``history`` (the prompt ids) feeds the repetition penalty together with the generated ids.
    ``stats``: the turn's ``TurnStats`` with the prompt's part filled in by the caller (prompt,
    reused and prefilled tokens, prefill seconds); the loop fills in the rest and returns it in the
    output. ``t_start`` (``time.perf_counter()`` at the start of the turn) anchors TTFT. Taught in day13_1.
    """
    if max_new < 0:
        raise ValueError(f"max_new = {max_new} must be ≥ 0")
    t_start = time.perf_counter() if t_start is None else t_start
    stops = frozenset(int(s) for s in stop_ids)
    stats = TurnStats() if stats is None else stats
    stream = StreamDecoder(tokenizer.token_bytes)
    hist = list(history)
    ids: list[int] = []
    stop_id = None
    n_fed = 0
    ctx = _max_context(engine)
    stats.stop_reason = "length"
    while len(ids) < max_new:
        t = time.perf_counter()
        tok = sampler(logits, hist)
        now = time.perf_counter()
        stats.sample_s += now - t
        if not ids and stop_id is None:
            stats.ttft_s = now - t_start
        if tok in stops:
            stop_id, stats.stop_reason = tok, "stop"
            break
        ids.append(tok)
        hist.append(tok)
        text = stream.push(tok)
        if text and on_text:
            on_text(text)
        if len(ids) >= max_new:
            break
        if ctx is not None and engine.pos >= ctx:
            stats.stop_reason = "context"
            break
        t = time.perf_counter()
        logits = engine.decode(tok)
        stats.decode_s += time.perf_counter() - t
        n_fed += 1
    tail = stream.flush()
    if tail and on_text:
        on_text(tail)
    stats.new_tokens = len(ids)
    stats.decoded_tokens = n_fed
    stats.total_s = time.perf_counter() - t_start
    return GenerationOutput(ids, stream.text, stop_id, ids[:n_fed], stats)


def generate(engine, tokenizer, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
             max_new: int = 256, stop_ids: Iterable[int] = STOP_IDS,
             on_text: Callable[[str], None] | None = None, sampler: Sampler | None = None,
             reset: bool = True) -> GenerationOutput:
    """Complete ``prompt`` (text, tokenized with special tokens recognised, or ids) from an empty cache.

    ``params`` defaults to greedy. A ``sampler`` may be passed instead to continue its random stream.
    Taught in day13_1.
    """
    if sampler is None:
        sampler = Sampler(params if params is not None else SamplingParams(temperature=0.0))
    elif params is not None:
        raise TypeError("generate: pass params or sampler, not both")
    t0 = time.perf_counter()
    ids = list(tokenizer.encode(prompt, allow_special=True)) if isinstance(prompt, str) else [int(i) for i in prompt]
    if not ids:
        raise ValueError("generate: the prompt is empty (nothing to prefill)")
    ctx = _max_context(engine)
    if ctx is not None and len(ids) > ctx:
        raise ValueError(f"generate: the prompt has {len(ids)} tokens, more than the context limit {ctx}")
    if reset:
        engine.reset()
    t1 = time.perf_counter()
    logits = engine.prefill(ids)
    stats = TurnStats(prompt_tokens=len(ids), prefilled_tokens=len(ids), prefill_s=time.perf_counter() - t1)
    return run_turn(engine, tokenizer, logits, sampler, max_new=max_new, stop_ids=stop_ids, history=ids,
                    on_text=on_text, stats=stats, t_start=t0)
