"""The Qwen3 chat template in Python, and a conversation that reuses its KV cache across turns.

A chat model never sees "messages": it sees one token sequence. Qwen3's tokenizer_config.json carries
a Jinja template that lays the messages out as::

    <|im_start|>system\\n{system}<|im_end|>\\n
    <|im_start|>user\\n{question}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>\\n\\n{answer}<|im_end|>\\n
    …
    <|im_start|>assistant\\n                  ← the generation prompt: the model writes from here

``render`` reproduces that template exactly (checked id for id against transformers'
``apply_chat_template`` running the Jinja text in the tests), including its two subtle rules:

- **thinking switch**: with ``enable_thinking=False`` the generation prompt ends with an empty
  ``<think>\\n\\n</think>\\n\\n``, so the model skips its reasoning and answers at once;
- **reasoning is dropped from history**: an assistant turn *before* the latest user question is
  rendered with its answer only (``<think>…</think>`` cut out); turns after it (the reply being written,
  or tool-calling steps) keep their reasoning.

``Conversation`` keeps the ids already in the engine's KV cache. Each turn it renders the whole history,
finds the longest common prefix with the cache, truncates the cache to that prefix when the re-rendered
history differs (e.g. the reasoning just dropped, or a re-tokenization), and prefills only the rest.

Taught in day14_1 (the template and the thinking switch) and day14_2 (multi-turn with KV reuse).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kestrel_lab import seam
from kestrel_lab.chat_blocks import qwen3_tool_calls, tojson, tool_response, tools_section
from kestrel_lab.engine.generate import ENDOFTEXT, IM_END, STOP_IDS, TurnStats, _max_context, run_turn
from kestrel_lab.engine.sample import Sampler, SamplingParams

__all__ = [
    "IM_START", "IM_END", "ENDOFTEXT", "THINK", "END_THINK", "STOP_IDS", "render", "encode_messages",
    "split_reasoning", "common_prefix_len", "Conversation", "TurnResult", "render_qwen2", "template_for",
    "TEMPLATES", "QWEN2_DEFAULT_SYSTEM",
]

# ENDOFTEXT (151643), IM_END (151645) and STOP_IDS come from engine.generate: one set of stop ids.
IM_START = 151644   # <|im_start|>
THINK = 151667      # <think>
END_THINK = 151668  # </think>

ROLES = ("system", "user", "assistant", "tool")


def _check_messages(messages: Sequence[dict]) -> None:
    if not messages:
        raise ValueError("chat template: the message list is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"chat template: messages[{i}] is not a dict with a 'role'")
        if m["role"] not in ROLES:
            raise ValueError(f"chat template: messages[{i}].role = {m['role']!r}, expected one of {ROLES}")
        c = m.get("content")
        if c is not None and not isinstance(c, str):
            raise ValueError(f"chat template: messages[{i}].content must be text or None, "
                             f"got {type(c).__name__}")
    if messages[0]["role"] == "system" and not isinstance(messages[0].get("content"), str):
        raise ValueError("chat template: messages[0] is a system message without text content")


def split_reasoning(content: str) -> tuple[str, str]:
    """Split an assistant text into (reasoning, answer) the way Qwen3's template does.

    Without ``</think>`` there is no reasoning. Taught in day14_1.
    """
    if "</think>" not in content:
        return "", content
    head, _, _ = content.partition("</think>")
    reasoning = head.rstrip("\n").split("<think>")[-1].lstrip("\n")
    answer = content.split("</think>")[-1].lstrip("\n")
    return reasoning, answer


def render(messages: Sequence[dict], *, add_generation_prompt: bool = True, enable_thinking: bool = True,
           tools: Sequence[dict] | None = None) -> str:
    """Qwen3's chat template, statement for statement, as text (special tokens written out).

    ``messages``: dicts with ``role`` (system/user/assistant/tool), ``content`` and optionally
    ``reasoning_content`` and ``tool_calls`` (assistant). Taught in day14_1.
    """
    _check_messages(messages)
    out: list[str] = []
    first = messages[0]
    if tools:
        out.append("<|im_start|>system\n")
        if first["role"] == "system":
            out.append(first["content"] + "\n\n")
        out.append(tools_section(tools))
    elif first["role"] == "system":
        out.append("<|im_start|>system\n" + first["content"] + "<|im_end|>\n")

    # The latest real user question (not a tool response wrapped as a user turn): reasoning before it
    # is history and gets dropped.
    last_query = len(messages) - 1
    for index in range(len(messages) - 1, -1, -1):
        m = messages[index]
        c = m.get("content")
        if m["role"] == "user" and isinstance(c, str) and not (
                c.startswith("<tool_response>") and c.endswith("</tool_response>")):
            last_query = index
            break

    n = len(messages)
    for i, m in enumerate(messages):
        role = m["role"]
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        if role == "user" or (role == "system" and i > 0):
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            reasoning = ""
            if isinstance(m.get("reasoning_content"), str):
                reasoning = m["reasoning_content"]
            elif "</think>" in content:
                reasoning, content = split_reasoning(content)
            last = i == n - 1
            if i > last_query and (last or reasoning):
                out.append(f"<|im_start|>{role}\n<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
                           + content.lstrip("\n"))
            else:
                out.append(f"<|im_start|>{role}\n{content}")
            out.append(qwen3_tool_calls(m.get("tool_calls") or (), after_text=bool(content)))
            out.append("<|im_end|>\n")
        elif role == "tool":
            out.append(tool_response(messages, i, content))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if not enable_thinking:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


QWEN2_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def render_qwen2(messages: Sequence[dict], *, add_generation_prompt: bool = True, enable_thinking: bool = True,
                 tools: Sequence[dict] | None = None) -> str:
    """Qwen2.5-Instruct's chat template (its tokenizer_config.json), statement for statement, as text.

    The differences from Qwen3's: a default system message (``QWEN2_DEFAULT_SYSTEM``) when the first
    message is not a system one, no ``<think>`` blocks (``enable_thinking`` is accepted and ignored), and
    an assistant turn is rendered as written. Checked against transformers' ``apply_chat_template``
    running the Jinja text in the tests. Taught in day29_3.
    """
    _check_messages(messages)
    out: list[str] = []
    first = messages[0]
    system = first["content"] if first["role"] == "system" else QWEN2_DEFAULT_SYSTEM
    if tools:
        out.append("<|im_start|>system\n" + system)
        out.append("\n\n" + tools_section(tools))
    else:
        out.append("<|im_start|>system\n" + system + "<|im_end|>\n")
    for i, m in enumerate(messages):
        role = m["role"]
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        calls = m.get("tool_calls") or ()
        if role == "user" or (role == "system" and i > 0) or (role == "assistant" and not calls):
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            out.append(f"<|im_start|>{role}")
            if content:
                out.append("\n" + content)
            for call in calls:
                if call.get("function"):
                    call = call["function"]
                out.append('\n<tool_call>\n{"name": "' + str(call["name"]) + '", "arguments": '
                           + tojson(call["arguments"]) + "}\n</tool_call>")
            out.append("<|im_end|>\n")
        elif role == "tool":
            out.append(tool_response(messages, i, content))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


# The chat template of each architecture (Qwen3-VL's image turns are rendered by ``vision.prompt``).
TEMPLATES = {"qwen3": render, "qwen3_vl": render, "qwen3_moe": render, "qwen2": render_qwen2}


def template_for(arch: str | None):
    """The ``render`` function of an architecture's chat template (Qwen3's for unknown or None).

    ``chat`` and ``generate --chat`` pick it from the model file's arch. Taught in day29_3.
    """
    return TEMPLATES.get(arch or "qwen3", render)


def encode_messages(tokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = True,
                    enable_thinking: bool = True, arch: str | None = None) -> list[int]:
    """The template of ``arch`` (``template_for``; default Qwen3's ``render``), then tokenize with
    special tokens recognised (``<|im_start|>`` → one id).

    Taught in day14_1.
    """
    mine = seam.get("chat.render")       # a student's Qwen3 template (``kestrel_lab.seam``): plain chats only
    if mine is not None and template_for(arch) is render and enable_thinking \
            and all(set(m) <= {"role", "content"} for m in messages):
        text = mine(list(messages), add_generation_prompt=add_generation_prompt)
    else:
        text = template_for(arch)(messages, add_generation_prompt=add_generation_prompt,
                                  enable_thinking=enable_thinking)
    return list(tokenizer.encode(text, allow_special=True))


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences. Taught in day14_2."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class TurnResult:
    """One assistant reply (``reasoning`` and ``answer`` split as the template does) and what it cost.

    ``stats`` is a ``generate.TurnStats``. Taught in day14_2.
    """

    text: str
    ids: list[int]
    stats: "object"
    reasoning: str = ""
    answer: str = ""


@dataclass
class Conversation:
    """A multi-turn chat on one engine whose KV cache holds the conversation so far.

    ``cached_ids`` mirrors the engine's cache (``engine.pos == len(cached_ids)``). Each ``ask`` appends
    the user message, renders the history with the generation prompt, prefills only what the cache does
    not already hold, generates the reply (streamed through ``on_text``) and appends it as an assistant
    message. Taught in day14_2.
    """

    engine: object
    tokenizer: object
    system: str | None = None
    enable_thinking: bool = True
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    max_new: int = 512
    stop_ids: frozenset = STOP_IDS
    messages: list[dict] = field(default_factory=list)
    cached_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.system is not None and not self.messages:
            self.messages.append({"role": "system", "content": self.system})
        self.sampler = Sampler(self.params)
        self.engine.reset()
        self.cached_ids = []

    def prompt_ids(self, messages: Sequence[dict] | None = None) -> list[int]:
        """The ids of the history plus the generation prompt."""
        return encode_messages(self.tokenizer, self.messages if messages is None else messages,
                               enable_thinking=self.enable_thinking,
                               arch=getattr(getattr(self.engine, "config", None), "arch", None))

    def sync(self, ids: Sequence[int]):
        """Make the cache hold ``ids``; prefill only the part not already cached.

        Returns (logits after the last id, tokens reused, tokens prefilled). When ``ids`` is entirely
        cached already, the last id is re-run so there are logits to sample from.
        """
        ids = list(ids)
        if not ids:
            raise ValueError("Conversation.sync: nothing to prefill")
        ctx = _max_context(self.engine)
        if ctx is not None and len(ids) >= ctx:
            raise ValueError(f"the conversation has {len(ids)} tokens: no room left in the context "
                             f"limit of {ctx} tokens (start afresh, or allow a longer context)")
        keep = common_prefix_len(self.cached_ids, ids)
        keep = min(keep, len(ids) - 1)  # always prefill at least one token: its logits are needed
        if keep < len(self.cached_ids):
            self.engine.truncate(keep)
        logits = self.engine.prefill(ids[keep:])
        self.cached_ids = ids
        return logits, keep, len(ids) - keep

    def ask(self, text: str, on_text: Callable[[str], None] | None = None,
            max_new: int | None = None) -> TurnResult:
        """One user turn: returns the reply (streamed through ``on_text`` as it is generated)."""
        self.messages.append({"role": "user", "content": text})
        try:
            t0 = time.perf_counter()  # TTFT counts the template and the tokenizer too
            ids = self.prompt_ids()
            t1 = time.perf_counter()
            logits, reused, prefilled = self.sync(ids)
            stats = TurnStats(prompt_tokens=len(ids), reused_tokens=reused, prefilled_tokens=prefilled,
                              prefill_s=time.perf_counter() - t1)
            out = run_turn(self.engine, self.tokenizer, logits, self.sampler,
                           max_new=self.max_new if max_new is None else max_new, stop_ids=self.stop_ids,
                           history=ids, on_text=on_text, stats=stats, t_start=t0)
        except BaseException:
            self.messages.pop()
            self.engine.reset()
            self.cached_ids = []
            raise
        # What the cache now holds: the prompt and every generated id that was fed back (the final
        # stop token was sampled but never decoded, so it is not in the cache).
        self.cached_ids = ids + out.fed_ids
        reasoning, answer = split_reasoning(out.text)
        self.messages.append({"role": "assistant", "content": out.text})
        return TurnResult(out.text, out.ids, out.stats, reasoning, answer)

    def reset(self) -> None:
        """Forget the conversation (the system message stays) and empty the cache."""
        self.messages = [m for m in self.messages[:1] if m["role"] == "system"]
        self.engine.reset()
        self.cached_ids = []
