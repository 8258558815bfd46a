"""The pieces of text every Qwen chat template writes the same way: the tools section, tool calls and
tool responses.

Qwen3's, Qwen2.5's and Qwen3-VL's Jinja templates differ in the system message, the ``<think>`` blocks
and the images, but they share these blocks character for character; ``engine.chat`` (Qwen3, Qwen2.5)
and ``vision.prompt`` (Qwen3-VL) both build on this module, so a fix lands in one place. It imports
nothing of the package, so the text and the vision side can use it without an import circle.

No lesson imports it directly: day14_1 (Qwen3) and day21_1 (Qwen3-VL) teach the templates through
``engine.chat`` and ``vision.prompt``, which the tests compare with transformers' Jinja text.
"""
from __future__ import annotations

import json
from typing import Sequence

__all__ = ["tojson", "tools_section", "qwen3_tool_calls", "tool_response"]


def tojson(obj) -> str:
    """transformers' ``tojson`` filter: ``json.dumps`` with ``ensure_ascii=False`` and default separators."""
    return json.dumps(obj, ensure_ascii=False)


def tools_section(tools: Sequence[dict]) -> str:
    """The tools section the Qwen templates put in the system turn (from "# Tools" to its <|im_end|>)."""
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            + "".join("\n" + tojson(tool) for tool in tools)
            + "\n</tools>\n\nFor each function call, return a json object with function name and "
              "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
              "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")


def qwen3_tool_calls(calls: Sequence[dict], after_text: bool) -> str:
    """An assistant turn's tool calls as Qwen3 and Qwen3-VL write them.

    A newline comes before every call but a first one that follows no text (``after_text`` False);
    ``arguments`` already a string is written as it is, anything else as JSON. (Qwen2.5 always writes the
    newline and always JSON-encodes, so ``engine.chat.render_qwen2`` keeps its own three lines.)
    """
    out: list[str] = []
    for j, call in enumerate(calls):
        if j > 0 or after_text:
            out.append("\n")
        if call.get("function"):
            call = call["function"]
        args = call["arguments"]
        out.append('<tool_call>\n{"name": "' + str(call["name"]) + '", "arguments": '
                   + (args if isinstance(args, str) else tojson(args)) + "}\n</tool_call>")
    return "".join(out)


def tool_response(messages: Sequence[dict], i: int, content: str) -> str:
    """Tool message ``i`` as the Qwen templates write it: consecutive tool messages share one user turn."""
    first = i == 0 or messages[i - 1]["role"] != "tool"
    last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
    return (("<|im_start|>user" if first else "") + "\n<tool_response>\n" + content + "\n</tool_response>"
            + ("<|im_end|>\n" if last else ""))
