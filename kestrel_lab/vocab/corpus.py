"""A deterministic mixed-language corpus from text that ships with the installed packages.

No downloads: the translations of Sphinx (pinned in requirements.txt) give real sentences in a
dozen languages (``sphinx/locale/<lang>/LC_MESSAGES/sphinx.po``: the English ``msgid`` and each
language's ``msgstr``), Sphinx's own Python sources give code, and the tiny poem model's
``greedy.json`` gives classical Chinese. Each translated message, code paragraph or poem is one
document, labelled by language; the order is fixed, so the corpus is the same on every machine with
the same packages.

Taught in day18_1 (greedy vs BPE by language) and used by benchmarks/bench_vocab.py.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: (label, sphinx locale folder) of the translated languages used, in corpus order.
LANGUAGES = (("zh", "zh_CN"), ("ja", "ja"), ("ko", "ko"), ("ru", "ru"), ("de", "de"), ("fr", "fr"),
             ("es", "es"), ("pl", "pl"), ("cs", "cs"), ("tr", "tr"), ("vi", "vi"), ("ar", "ar"))


@dataclass(frozen=True)
class Doc:
    lang: str
    text: str


def _unquote(s: str) -> str:
    s = s.strip()
    if len(s) < 2 or s[0] != '"' or s[-1] != '"':
        return ""
    body, out, i = s[1:-1], [], 0
    escapes = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "r": "\r"}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            out.append(escapes.get(body[i + 1], body[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def read_po(path: Path) -> list[tuple[str, str]]:
    """(msgid, msgstr) pairs of a gettext .po file (plural forms: the first msgstr). Taught in day18_1."""
    pairs, cur, field = [], {"msgid": [], "msgstr": []}, None
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        line = line.strip()
        if line.startswith("msgid ") or not line:
            if cur["msgid"] or cur["msgstr"]:
                pairs.append(("".join(cur["msgid"]), "".join(cur["msgstr"])))
            cur, field = {"msgid": [], "msgstr": []}, None
        if line.startswith("msgid "):
            field, line = "msgid", line[6:]
        elif line.startswith("msgstr ") or line.startswith("msgstr[0] "):
            field, line = "msgstr", line.split(" ", 1)[1]
        elif line.startswith(("msgid_plural", "msgstr[", "#", "msgctxt")):
            field = None
            continue
        if field and line.startswith('"'):
            cur[field].append(_unquote(line))
    return [(a, b) for a, b in pairs if a]


def _sphinx_dir() -> Path:
    import sphinx

    return Path(sphinx.__file__).resolve().parent


def _poems() -> list[str]:
    from kestrel_lab.paths import tiny_poem_dir

    path = tiny_poem_dir() / "greedy.json"
    if not path.exists():
        return []
    cases = json.loads(path.read_text(encoding="utf-8"))["cases"]
    return [c["prompt"] + c["greedy_text"].replace("<|endoftext|>", "") for c in cases]


def mixed_corpus(min_bytes: int = 1 << 20, code_share: float = 0.3) -> list[Doc]:
    """Documents of every language (all of them), then code paragraphs until ``min_bytes``.

    ``code_share`` of ``min_bytes`` is reserved for code; when the translations fall short the rest
    is filled with code too. Taught in day18_1.
    """
    root = _sphinx_dir()
    docs: list[Doc] = [Doc("poem", p) for p in _poems()]
    pot = read_po(root / "locale" / "sphinx.pot")
    docs += [Doc("en", mid) for mid, _ in pot if mid.strip()]
    for label, folder in LANGUAGES:
        po = root / "locale" / folder / "LC_MESSAGES" / "sphinx.po"
        if po.exists():
            docs += [Doc(label, s) for _, s in read_po(po) if s.strip()]
    text_bytes = sum(len(d.text.encode("utf-8")) for d in docs)
    target_code = max(int(min_bytes * code_share), min_bytes - text_bytes)
    code_bytes = 0
    for src in sorted(root.rglob("*.py")):
        for para in src.read_text(encoding="utf-8").split("\n\n"):
            if para.strip():
                docs.append(Doc("code", para + "\n\n"))
                code_bytes += len(para.encode("utf-8")) + 2
        if code_bytes >= target_code:
            break
    return docs


def corpus_text(docs: list[Doc]) -> str:
    """All documents joined by newlines (the benchmark's single input). Taught in day18_1."""
    return "\n".join(d.text for d in docs)
