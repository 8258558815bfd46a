"""Keep book/formats/vqf.md in step with the code: its tables are generated, never typed.

The page marks each generated table with ``<!-- generated:KEY -->`` … ``<!-- /generated:KEY -->``;
``render`` produces the tables from ``kestrel_lab.vqf.format`` (header, VQFSig, entry, flags), the
qtype table from ``kestrel_lab.quant.QTYPES``, the 41-entry map and Qwen3-30B-A3B's MoE map (with the
dense-layer variant) and Qwen2.5-0.5B-Instruct's map (q/k/v biases) from the planner; ``splice``
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
    return _entries_table(fp, sources=False, totals=f"目录 bytes 之和 = {fp.dir_bytes_sum:,}；")


def _entries_table(fp, sources: bool, totals: str = "") -> str:
    """A planned file's directory as a table (# name qtype rows × cols offset bytes [sources]) and its sizes."""
    from kestrel_lab.convert import source_pattern

    rows = ["| # | name | qtype | rows × cols | offset | bytes |" + (" 来源（按序堆叠） |" if sources else ""),
            "|---:|---|---|---|---:|---:|" + ("---|" if sources else "")]
    for i, e in enumerate(fp.entries):
        s = e.spec
        rows.append(f"| {i} | `{s.name}` | {s.qtype} {s.qtype_name} | {s.rows:,} × {s.cols:,} | {e.offset:,} | "
                    f"{s.nbytes:,} |" + (f" `{source_pattern(s.sources)}` |" if sources else ""))
    rows.append("")
    rows.append(f"data_offset = {fp.data_offset:,}；{totals}file_len = {fp.file_len:,}；文件大小 = {fp.file_size:,}。")
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


def _moe() -> str:
    """Qwen3-30B-A3B's MoE entries, and the same model with layer 0 dense (``mlp_only_layers=[0]``)."""
    import dataclasses

    from kestrel_lab.config import ModelConfig
    from kestrel_lab.convert import source_pattern
    from kestrel_lab.vqf.layout import expert_runs, plan
    from kestrel_lab.vqf.planner import plan_file

    cfg = ModelConfig.from_hf(configs_dir() / "qwen3-30b-a3b.config.json")
    fp = plan_file(cfg)
    rows = ["| # | name | qtype | rows × cols | offset | bytes | 来源（按序堆叠） |",
            "|---:|---|---|---|---:|---:|---|"]
    for i, e in enumerate(fp.entries):
        s = e.spec
        src = source_pattern(s.sources) if len(s.sources) <= cfg.num_hidden_layers else (
            re.sub(r"layers\.0\.", "layers.{i}.", re.sub(r"experts\.0\.", "experts.{e}.", s.sources[0]))
            + f"（× {len(s.sources):,}：i 在外、e 在内）")
        rows.append(f"| {i} | `{s.name}` | {s.qtype} {s.qtype_name} | {s.rows:,} × {s.cols:,} | {e.offset:,} | "
                    f"{s.nbytes:,} | `{src}` |")
    rows.append("")
    rows.append(f"data_offset = {fp.data_offset:,}；file_len = {fp.file_len:,}；文件大小 = {fp.file_size:,}。")
    spec = {s.name: s for s in fp.specs}
    runs = expert_runs(spec["q4_gate_exps"], cfg)
    per = spec["q4_gate_exps"].nbytes // len(runs)
    per_down = spec["q4_down_exps"].nbytes // len(runs)
    rows.append(f"每个专家的 gate（或 up）是 `q4_gate_exps` 里连续的 {runs[0][3] - runs[0][2]:,} 行（{per:,} 字节），"
                f"down 是 `q4_down_exps` 里连续的 {cfg.hidden_size:,} 行（{per_down:,} 字节）；"
                f"第 k 个 MoE 层的专家 e 从第 (k·{cfg.num_experts} + e)·m 行开始"
                "（`kestrel_lab.vqf.layout.expert_runs`）。")
    rows.append("")
    dense = dataclasses.replace(cfg, mlp_only_layers=[0])
    rows += ["同一个模型若第 0 层是稠密层（`mlp_only_layers = [0]`），FFN 部分的条目变成：", "",
             "| name | qtype | rows × cols | 来源 |", "|---|---|---|---|"]
    for s in plan(dense):
        ffn = s.name in ("moe_router", "q4_gate_exps", "q4_up_exps", "q4_down_exps")
        if ffn or s.name.startswith(("q4_gate.", "q4_up.", "q4_down.")):
            src = s.sources[0] if len(s.sources) == 1 else (
                re.sub(r"experts\.0\.", "experts.{e}.", s.sources[0]) + f" … {s.sources[-1]}（× {len(s.sources):,}）")
            rows.append(f"| `{s.name}` | {s.qtype_name} | {s.rows:,} × {s.cols:,} | `{src}` |")
    return "\n".join(rows)


def _qwen2() -> str:
    """Qwen2.5-0.5B-Instruct's map: q/k/v biases instead of q/k norms (``config.ATTENTION_TRAITS``)."""
    from kestrel_lab.vqf.planner import plan_file

    return _entries_table(plan_file(configs_dir() / "qwen2.5-0.5b-instruct.config.json"), sources=True)


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
    from kestrel_lab.config_fields import spec_table as config_table

    out["config"] = config_table()
    out["map2b"] = _map_2b()
    out["sources"] = _sources()
    out["moe"] = _moe()
    out["qwen2"] = _qwen2()
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
