"""Keep book/formats/vqf.md in step with the code: its tables are generated, never typed.

The page marks each generated table with ``<!-- generated:KEY -->`` … ``<!-- /generated:KEY -->``;
``render`` produces the tables from ``kestrel_lab.vqf.format`` (header, VQFSig, entry, flags), the
qtype table from ``kestrel_lab.quant.QTYPES`` and the 41-entry map from the planner; ``splice``
puts them in place. ``kestrel-lab vqf spec`` rewrites the page, and a test fails when it is stale.

The page is read alongside day16_2.
"""
from __future__ import annotations

import re

from kestrel_lab.paths import configs_dir
from kestrel_lab.vqf.format import spec_tables

_REGION = re.compile(r"(<!-- generated:(\w+) -->\n)(.*?)(<!-- /generated:\2 -->)", re.S)


def _map_2b() -> str:
    from kestrel_lab.vqf.planner import plan_file

    fp = plan_file(configs_dir() / "qwen3-vl-2b-instruct.config.json")
    rows = ["| # | name | qtype | rows × cols | offset | bytes |", "|---:|---|---|---|---:|---:|"]
    for i, e in enumerate(fp.entries):
        s = e.spec
        rows.append(f"| {i} | `{s.name}` | {s.qtype} {s.qtype_name} | {s.rows:,} × {s.cols:,} | {e.offset:,} | "
                    f"{s.nbytes:,} |")
    rows.append("")
    rows.append(f"data_offset = {fp.data_offset:,}；目录 bytes 之和 = {fp.dir_bytes_sum:,}；"
                f"file_len = {fp.file_len:,}；文件大小 = {fp.file_size:,}。")
    return "\n".join(rows)


def _sources() -> str:
    from kestrel_lab.config import ModelConfig
    from kestrel_lab.vqf.layout import plan

    cfg = ModelConfig.from_hf(configs_dir() / "qwen3-vl-2b-instruct.config.json")
    rows = ["| VQF 名字 | 来源（HF 张量名，`{i}` 为层/块号，按序堆叠） | 含义 |", "|---|---|---|"]
    for s in plan(cfg):
        src = s.sources[0]
        if len(s.sources) > 1:
            src = re.sub(r"\.(\d+)\.", ".{i}.", src, count=1) + f"（× {len(s.sources)}）"
        rows.append(f"| `{s.name}` | `{src}` | {s.role} |")
    return "\n".join(rows)


def _limits() -> str:
    from kestrel_lab.config import ModelConfig
    from kestrel_lab.limits import spec_table

    return spec_table({p.name.removesuffix(".config.json"): ModelConfig.from_hf(p)
                       for p in sorted(configs_dir().glob("*.config.json"))})


def _protection() -> str:
    from kestrel_lab.vqf.protect import spec_markdown

    return spec_markdown()


def render() -> dict[str, str]:
    """Every generated block of the spec page, by key."""
    out = spec_tables()
    out["limits"] = _limits()
    out["protection"] = _protection()
    out["map2b"] = _map_2b()
    out["sources"] = _sources()
    return out


def splice(text: str, blocks: dict[str, str]) -> str:
    """Replace each marked region of ``text`` with its block; unknown keys are an error."""
    def sub(m):
        key = m.group(2)
        if key not in blocks:
            raise ValueError(f"spec page: unknown generated block {key!r} (known: {sorted(blocks)})")
        return m.group(1) + blocks[key] + "\n" + m.group(4)

    return _REGION.sub(sub, text)


def regions(text: str) -> list[str]:
    """Keys of the generated regions in ``text``."""
    return [m.group(2) for m in _REGION.finditer(text)]
