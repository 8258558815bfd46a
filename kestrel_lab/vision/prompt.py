"""The image side of a Qwen3-VL prompt: its chat template, the image pads and what marks them.

Qwen3-VL-Instruct's chat template (the Jinja ``chat_template`` of its tokenizer) writes each image of a
message as ``<|vision_start|><|image_pad|><|vision_end|>`` where it stands in the content list, and —
unlike Qwen3's text template — adds no default system message and no ``<think>`` block. The one
``<|image_pad|>`` is a placeholder: before the model runs, it becomes t·h·w/merge² copies, one per LLM
token of the image (300 for a 640×480 photo), and the vision tower's output later overwrites exactly
those positions. transformers 5.24 also wants ``mm_token_type_ids`` (1 at image pads, 0 elsewhere:
``<|vision_start|>``/``<|vision_end|>`` are text) to place the 3-D positions.

The trap this module closes: two different pictures with the same grid give *identical* ids, so a KV
cache reused by common token prefix would silently keep the old picture. ``image_key`` hashes an image's
pixels and grid, and ``reuse_keys`` turns the ids into a sequence whose pads carry that key, so the
common prefix stops where the pictures differ.

Taught in day21_1.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from kestrel_lab.chat_blocks import qwen3_tool_calls, tool_response, tools_section
from kestrel_lab.vocab.tokenizer_json import QWEN3_ADDED_TOKENS, QWEN3_FIRST_ADDED_ID
from kestrel_lab.vision.positions import image_token_count

__all__ = ["IMAGE_PAD", "VIDEO_PAD", "VISION_START", "VISION_END", "VisionTokens", "vision_tokens",
           "render_vl_chat", "encode_vl_chat", "expand_image_pads", "mm_token_type_ids", "image_key",
           "reuse_keys"]

_ADDED = {text: QWEN3_FIRST_ADDED_ID + i for i, (text, _special) in enumerate(QWEN3_ADDED_TOKENS)}

#: Ids of the vision tokens in the Qwen vocabulary (read from its added-token table, not typed).
IMAGE_PAD = _ADDED["<|image_pad|>"]
VIDEO_PAD = _ADDED["<|video_pad|>"]
VISION_START = _ADDED["<|vision_start|>"]
VISION_END = _ADDED["<|vision_end|>"]

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class VisionTokens:
    """The three ids that frame an image in the token sequence."""

    image_pad: int = IMAGE_PAD
    vision_start: int = VISION_START
    vision_end: int = VISION_END


def vision_tokens(config: dict | str | os.PathLike | None = None) -> VisionTokens:
    """The image pad / vision start / vision end ids: from a Qwen3-VL ``config.json`` (path or dict)
    when given (``image_token_id``, ``vision_start_token_id``, ``vision_end_token_id``), else the
    vocabulary's. Taught in day21_1.
    """
    if config is None:
        return VisionTokens()
    if not isinstance(config, dict):
        path = Path(config)
        config = json.loads(path.read_text(encoding="utf-8"))
    else:
        path = "config"
    try:
        return VisionTokens(int(config["image_token_id"]), int(config["vision_start_token_id"]),
                            int(config["vision_end_token_id"]))
    except KeyError as e:
        raise ValueError(f"{path}: no {e.args[0]!r} field — not a Qwen3-VL config") from None


# ---------------------------------------------------------------------------------------------- template
def _is_image(item: dict) -> bool:
    return item.get("type") == "image" or "image" in item or "image_url" in item


def _is_video(item: dict) -> bool:
    return item.get("type") == "video" or "video" in item


def _check(messages: Sequence[dict]) -> None:
    if not messages:
        raise ValueError("VL chat template: the message list is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"VL chat template: messages[{i}] must be a dict with a role in {ROLES}")
        if m["role"] == "system" and i > 0:
            raise ValueError(f"VL chat template: messages[{i}] is a system message; the template renders "
                             "a system message only as the first one (it would drop this one)")
        c = m.get("content")
        if c is None or isinstance(c, str):
            continue
        if not isinstance(c, (list, tuple)) or not all(isinstance(x, dict) for x in c):
            raise ValueError(f"VL chat template: messages[{i}].content must be text or a list of dicts")
        for j, item in enumerate(c):
            if _is_video(item) and not _is_image(item):
                raise ValueError(f"VL chat template: messages[{i}].content[{j}] is a video; this engine "
                                 "takes images only")


def _text_only(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(item["text"]) for item in content if "text" in item)


def _with_vision(content, counter: list[int], add_vision_id: bool) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for item in content:
        if _is_image(item):
            counter[0] += 1
            if add_vision_id:
                out.append(f"Picture {counter[0]}: ")
            out.append("<|vision_start|><|image_pad|><|vision_end|>")
        elif "text" in item:
            out.append(str(item["text"]))
    return "".join(out)


def render_vl_chat(messages: Sequence[dict], *, add_generation_prompt: bool = True,
                   add_vision_id: bool = False, tools: Sequence[dict] | None = None) -> str:
    """Qwen3-VL-Instruct's chat template, statement for statement, as text (special tokens written out).

    ``messages``: ``{"role", "content"}`` where content is a string or a list of items
    ``{"type": "image"}`` / ``{"type": "text", "text": …}`` in the order they are shown (this course puts
    a turn's images before its text). No default system message, no ``<think>``. Taught in day21_1.
    """
    _check(messages)
    out: list[str] = []
    first = messages[0]
    if tools:
        out.append("<|im_start|>system\n")
        if first["role"] == "system":
            out.append(_text_only(first.get("content")) + "\n\n")
        out.append(tools_section(tools))
    elif first["role"] == "system":
        out.append("<|im_start|>system\n" + _text_only(first.get("content")) + "<|im_end|>\n")
    images = [0]
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content")
        if role == "user":
            out.append("<|im_start|>user\n" + _with_vision(content, images, add_vision_id) + "<|im_end|>\n")
        elif role == "assistant":
            text = _text_only(content)
            out.append("<|im_start|>assistant\n" + text)
            out.append(qwen3_tool_calls(m.get("tool_calls") or (), after_text=bool(text)))
            out.append("<|im_end|>\n")
        elif role == "tool":
            out.append(tool_response(messages, i, _with_vision(content, images, add_vision_id)))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def count_images(messages: Sequence[dict]) -> int:
    """How many image items the messages hold (the template writes one pad for each). Taught in day21_1."""
    return sum(1 for m in messages if isinstance(m.get("content"), (list, tuple))
               for item in m["content"] if _is_image(item))


# ---------------------------------------------------------------------------------------------- ids
def expand_image_pads(ids: Sequence[int], grid_thws, *, image_pad_id: int = IMAGE_PAD,
                      merge_size: int = 2) -> list[int]:
    """Each single image pad → t·h·w/merge² pads, image k taking ``grid_thws[k]``; the rest unchanged.

    The ids must hold exactly one pad per image (as the template writes them). Taught in day21_1.
    """
    grids = [tuple(int(x) for x in g) for g in grid_thws]
    where = [i for i, t in enumerate(ids) if t == image_pad_id]
    if len(where) != len(grids):
        raise ValueError(f"expand_image_pads: {len(where)} image pads (id {image_pad_id}) in the ids but "
                         f"{len(grids)} images — each image needs exactly one pad before expansion")
    out: list[int] = []
    prev = 0
    for i, g in zip(where, grids):
        out.extend(ids[prev:i])
        out.extend([image_pad_id] * image_token_count(g, merge_size))
        prev = i + 1
    out.extend(ids[prev:])
    return out


def encode_vl_chat(tokenizer, messages: Sequence[dict], grid_thws, *, merge_size: int = 2,
                   add_generation_prompt: bool = True, image_pad_id: int = IMAGE_PAD) -> list[int]:
    """``render_vl_chat`` → tokenize (special tokens as one id each) → ``expand_image_pads``.

    ``grid_thws``: one grid per image item, in order. Taught in day21_1.
    """
    n = count_images(messages)
    if n != len(grid_thws):
        raise ValueError(f"encode_vl_chat: the messages hold {n} images but {len(grid_thws)} grids were given")
    text = render_vl_chat(messages, add_generation_prompt=add_generation_prompt)
    ids = list(tokenizer.encode(text, allow_special=True))
    return expand_image_pads(ids, grid_thws, image_pad_id=image_pad_id, merge_size=merge_size)


def mm_token_type_ids(ids, image_pad_id: int = IMAGE_PAD, video_pad_id: int | None = None) -> np.ndarray:
    """int64 per token: 1 at image pads, 2 at video pads (when given), 0 for text — what transformers
    5.24 needs beside ``input_ids`` to place MRoPE positions. Taught in day21_1.
    """
    a = np.asarray(ids, dtype=np.int64).reshape(-1)
    out = (a == image_pad_id).astype(np.int64)
    if video_pad_id is not None:
        out[a == video_pad_id] = 2
    return out


def image_key(pixel_values, grid_thw=None) -> str:
    """sha256 (hex) of an image's preprocessed pixels (float32 bytes, with their shape) and grid.

    Two pictures with the same grid have the same ids but different keys. Taught in day21_1.
    """
    pv = np.ascontiguousarray(pixel_values, dtype=np.float32)
    h = hashlib.sha256()
    h.update(np.asarray(pv.shape, dtype="<i8").tobytes())
    if grid_thw is not None:
        h.update(np.asarray(grid_thw, dtype="<i8").reshape(-1).tobytes())
    h.update(pv.astype("<f4", copy=False).tobytes())
    return h.hexdigest()


def reuse_keys(ids: Sequence[int], image_keys: Sequence[str], *, image_pad_id: int = IMAGE_PAD) -> list:
    """The ids as a list to compare for KV reuse: text ids stay ints, the pads of image k become
    ``(key_k, j)`` (j-th pad of that image), so a common prefix ends at the first differing picture.

    ``ids`` are expanded; each image is one contiguous run of pads. Taught in day21_1.
    """
    out: list = []
    k = -1
    j = 0
    prev_pad = False
    for t in ids:
        if t == image_pad_id:
            if not prev_pad:
                k += 1
                j = 0
                if k >= len(image_keys):
                    raise ValueError(f"reuse_keys: more runs of image pads than the {len(image_keys)} image keys")
            out.append((image_keys[k], j))
            j += 1
            prev_pad = True
        else:
            out.append(int(t))
            prev_pad = False
    if k + 1 != len(image_keys):
        raise ValueError(f"reuse_keys: {k + 1} runs of image pads but {len(image_keys)} image keys")
    return out
