"""The engine that sees: Qwen3-VL's text tower plus its vision tower, images in the prompt, image chat.

How an image enters the language model (transformers' ``Qwen3VLModel.forward``, 5.24):

1. the chat template writes ``<|vision_start|><|image_pad|><|vision_end|>`` per image and the one pad
   is expanded to t·h·w/4 pads (``vision.prompt.encode_vl_chat``);
2. the vision tower turns the image into one feature per pad (``vision.tower``), which **replaces** the
   pads' token embeddings, in order; its DeepStack features are **added** to the hidden state at the
   same positions after decoder layers 0, 1, 2 (each prefill chunk adds its own slice);
3. positions are 3-D (MRoPE, ``vision.positions.mrope_positions``): an image of H'×W' LLM tokens starting
   at position s takes t = s, h = s + row, w = s + col, and the text after it continues from
   s + max(H', W') — so the rope position is no longer the cache length. The engine keeps the two apart
   (``Qwen3Engine.rope_pos``); decode continues from the rope position, truncate and reuse restore it.

KV reuse across turns compares ``vision.prompt.reuse_keys`` (each pad carries its image's content key),
not the ids: two different pictures with the same grid have the same ids. Features of an image already
encoded in this conversation are kept by key (``features_cache``) so a later turn does not re-encode it.
Taught in day21_3.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from kestrel_lab import seam
from kestrel_lab.engine.chat import common_prefix_len
from kestrel_lab.engine.generate import STOP_IDS, TurnStats, _max_context, run_turn
from kestrel_lab.engine.model import ImageEmbeds, Qwen3Engine
from kestrel_lab.engine.sample import Sampler, SamplingParams
from kestrel_lab.vision import positions as P
from kestrel_lab.vision import prompt as VP
from kestrel_lab.vision.tower import VisionOutput, VisionTower

__all__ = ["Qwen3VLEngine", "VLConversation", "VLTurnResult", "open_engine"]

FEATURE_CACHE = 16  # images whose tower output a conversation keeps (by content key)


def _key(image) -> str:
    k = getattr(image, "key", None)
    return k if k else VP.image_key(image.pixel_values, tuple(image.grid_thw))


class Qwen3VLEngine(Qwen3Engine):
    """``Qwen3Engine`` plus the vision tower of the same VQF file, and prompts with images.

    ``prefill_vl(ids, images, keep)`` runs an expanded prompt whose first ``keep`` tokens are already in
    the cache; ``encode(image)`` runs (or reuses) the tower on one preprocessed image. Taught in day21_3.
    """

    def __init__(self, config, tensors, **kw):
        super().__init__(config, tensors, **kw)
        if config.vision is None:
            raise ValueError(f"{self.source}: not a Qwen3-VL model (no vision config)")
        self.vision = VisionTower(config, tensors, threads=self.threads, source=self.source)
        self.image_pad_id = VP.IMAGE_PAD
        self.positions_piece = seam.get("vision.image_positions")   # a student's piece (``kestrel_lab.seam``)
        self.features_cache: OrderedDict[str, VisionOutput] = OrderedDict()
        self.last_images: list[tuple[int, float, bool]] = []

    @property
    def merge(self) -> int:
        return self.config.vision.spatial_merge_size

    def encode(self, image) -> tuple[VisionOutput, bool]:
        """The tower's output for one image (``pixel_values``, ``grid_thw``), and whether it was cached."""
        key = _key(image)
        if key in self.features_cache:
            self.features_cache.move_to_end(key)
            return self.features_cache[key], True
        out = self.vision.encode(image.pixel_values, [tuple(image.grid_thw)])
        self.features_cache[key] = out
        while len(self.features_cache) > FEATURE_CACHE:
            self.features_cache.popitem(last=False)
        return out, False

    def positions_for(self, ids, images) -> np.ndarray:
        """MRoPE positions (3, len(ids)) of an expanded prompt from position 0 (``mrope_positions``)."""
        pos, _ = P.mrope_positions(ids, [tuple(im.grid_thw) for im in images], image_pad_id=self.image_pad_id,
                                   merge_size=self.merge, image_positions=self.positions_piece)
        return pos

    def prefill_vl(self, ids: Sequence[int], images: Sequence, keep: int = 0) -> np.ndarray:
        """Make the cache hold the expanded prompt ``ids`` (its images in ``images``, in order) and return
        the logits after its last token. The first ``keep`` tokens are taken as already cached (the cache is
        truncated to them); only images with pads at or after ``keep`` are encoded. Per-image
        (tokens, seconds, reused) go to ``last_images``. Taught in day21_3.
        """
        ids = np.asarray(ids, dtype=np.int64)
        images = list(images)
        if not 0 <= keep < ids.size:
            raise ValueError(f"prefill_vl: keep={keep} must be in [0, {ids.size})")
        if keep > self.pos:
            raise ValueError(f"prefill_vl: keep={keep} but the cache holds only {self.pos} tokens")
        runs = P.image_pad_runs(ids, self.image_pad_id)
        if len(runs) != len(images):
            raise ValueError(f"prefill_vl: {len(runs)} runs of image pads in the ids but {len(images)} images")
        positions = self.positions_for(ids, images)
        embeds, deep, self.last_images = [], [], []
        for (a, b), im in zip(runs, images):
            if b <= keep:
                continue
            out, reused = self.encode(im)
            if out.embeds.shape[0] != b - a:
                raise ValueError(f"prefill_vl: an image of grid {tuple(im.grid_thw)} gives {out.embeds.shape[0]} "
                                 f"tokens, its run of pads has {b - a}")
            s = max(a, keep) - a
            embeds.append(out.embeds[s:])
            deep.append([d[s:] for d in out.deepstack])
            self.last_images.append((b - a, 0.0 if reused else out.seconds, reused))
        self.truncate(keep)
        tail = ids[keep:]
        feats = None
        if embeds:
            feats = ImageEmbeds(tail == self.image_pad_id, np.concatenate(embeds),
                                [np.concatenate([d[i] for d in deep]) for i in range(len(deep[0]))])
        return self.prefill(tail, positions=positions[:, keep:], images=feats)


def open_engine(path, key_file=None, **kw) -> Qwen3Engine:
    """A ``Qwen3VLEngine`` for a VQF file with a vision tower, else a ``Qwen3Engine`` (an encrypted
    file opened with ``key_file``, as ``Qwen3Engine.from_vqf`` does). Taught in day21_3."""
    from kestrel_lab.vqf.reader import open_vqf

    f = open_vqf(path, key_file=key_file)
    cls = Qwen3VLEngine if f.config.vision is not None and "v_patch" in f.tensors else Qwen3Engine
    eng = cls(f.config, f.tensors, source=str(path), keepalive=f, **kw)
    eng.bytes_released = f.release(list(eng.bytes_copied))   # an encrypted file's decrypted originals
    return eng


@dataclass
class VLTurnResult:
    """One assistant reply and what it cost (``stats.images``: tokens and encode time per image)."""

    text: str
    ids: list[int]
    stats: TurnStats


@dataclass
class VLConversation:
    """A multi-turn image chat on a ``Qwen3VLEngine`` with Qwen3-VL-Instruct's template.

    ``ask(text, images)`` appends a user turn (its images before its text), renders the whole history,
    expands the pads, compares ``reuse_keys`` with what the cache holds, prefills only the rest (encoding
    only new images) and generates the reply.
    """

    engine: Qwen3VLEngine
    tokenizer: object
    system: str | None = None
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    max_new: int = 512
    stop_ids: frozenset = STOP_IDS
    messages: list[dict] = field(default_factory=list)
    images: list = field(default_factory=list)
    cached_keys: list = field(default_factory=list)

    def __post_init__(self):
        if self.system is not None and not self.messages:
            self.messages.append({"role": "system", "content": self.system})
        self.sampler = Sampler(self.params)
        self.engine.reset()
        self.cached_keys = []

    def prompt_ids(self) -> list[int]:
        """The expanded ids of the history plus the generation prompt."""
        return VP.encode_vl_chat(self.tokenizer, self.messages, [tuple(im.grid_thw) for im in self.images],
                                 merge_size=self.engine.merge, image_pad_id=self.engine.image_pad_id)

    def ask(self, text: str, images: Sequence = (), on_text: Callable[[str], None] | None = None,
            max_new: int | None = None) -> VLTurnResult:
        """One user turn with ``images`` (preprocessed: ``pixel_values``, ``grid_thw``, ``key``) before ``text``."""
        images = list(images)
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
        self.messages.append({"role": "user", "content": content})
        self.images.extend(images)
        try:
            t0 = time.perf_counter()
            ids = self.prompt_ids()
            ctx = _max_context(self.engine)
            if ctx is not None and len(ids) >= ctx:
                raise ValueError(f"the conversation has {len(ids)} tokens: no room left in the context limit "
                                 f"of {ctx} tokens (start afresh, or allow a longer context)")
            keys = VP.reuse_keys(ids, [_key(im) for im in self.images], image_pad_id=self.engine.image_pad_id)
            keep = min(common_prefix_len(self.cached_keys, keys), len(ids) - 1, self.engine.pos)
            t1 = time.perf_counter()
            logits = self.engine.prefill_vl(ids, self.images, keep)
            per_image = list(self.engine.last_images)
            vision_s = sum(s for _, s, _ in per_image)
            stats = TurnStats(prompt_tokens=len(ids), reused_tokens=keep, prefilled_tokens=len(ids) - keep,
                              prefill_s=time.perf_counter() - t1 - vision_s, images=per_image)
            out = run_turn(self.engine, self.tokenizer, logits, self.sampler,
                           max_new=self.max_new if max_new is None else max_new, stop_ids=self.stop_ids,
                           history=ids, on_text=on_text, stats=stats, t_start=t0)
        except BaseException:
            self.messages.pop()
            del self.images[len(self.images) - len(images):]
            self.engine.reset()
            self.cached_keys = []
            raise
        self.cached_keys = keys + list(out.fed_ids)
        self.messages.append({"role": "assistant", "content": out.text})
        return VLTurnResult(out.text, out.ids, out.stats)

    def reset(self) -> None:
        """Forget the conversation and its images (the system message stays); empty the cache."""
        self.messages = [m for m in self.messages[:1] if m["role"] == "system"]
        self.images = []
        self.engine.reset()
        self.engine.features_cache.clear()
        self.cached_keys = []
