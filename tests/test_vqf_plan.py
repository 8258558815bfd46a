"""The planner against article 16-3's map of the Qwen3-VL-2B file, the header layout, od, the spec page."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess

import pytest

from kestrel_lab.config import ModelConfig
from kestrel_lab.paths import REPO_ROOT, configs_dir, tiny_poem_dir
from kestrel_lab.quant import QTYPES
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf import inspect as I
from kestrel_lab.vqf.layout import QUANTS, plan, source_rows
from kestrel_lab.vqf.planner import plan_file

CFG_2B = configs_dir() / "qwen3-vl-2b-instruct.config.json"

# Article 16-3 §3.2: the 41 entries, in order, with their qtypes and the group totals.
ARTICLE_NAMES = (
    "token_embed final_norm attn_norm ffn_norm q_norm k_norm "
    "q4_q q4_k q4_v q4_o q4_gate q4_up q4_down q4_lm v_q8_qkv v_q8_proj v_q8_fc1 v_q8_fc2").split()
GROUPS = [  # (first, last, qtype, total bytes)
    (0, 0, 5, 622_329_856), (6, 13, 3, 967_753_728), (14, 17, 2, 320_864_256),
    (18, 28, 1, 17_010_688), (29, 34, 1, 100_696_064), (35, 40, 1, 302_161_920),
]

# Article 16-3 §3.1: `od -A x -t x1 -j 448 -N 136 model.vqf`, the lines it prints.
ARTICLE_OD = """\
0001c0 74 6f 6b 65 6e 5f 65 6d 62 65 64 00 00 00 00 00
0001d0 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0001e0 05 00 00 00 80 51 02 00 00 08 00 00 00 00 00 00
0001f0 00 10 00 00 00 00 00 00 00 00 18 25 00 00 00 00
000200 66 69 6e 61 6c 5f 6e 6f 72 6d 00 00 00 00 00 00"""


@pytest.fixture(scope="module")
def fp2b():
    return plan_file(CFG_2B)


def test_article_map(fp2b):
    j = fp2b.to_json()
    t = j["tensors"]
    assert len(t) == 41
    assert [x["name"] for x in t[:18]] == ARTICLE_NAMES
    assert all(x["name"].startswith("v_") and len(x["name"].encode()) <= 31 for x in t[18:])
    assert t[0] == {"name": "token_embed", "qtype": 5, "rows": 151936, "cols": 2048, "offset": 4096,
                    "bytes": 622_329_856}
    assert (t[1]["qtype"], t[1]["bytes"]) == (1, 8192)
    assert [x["bytes"] for x in t[2:6]] == [229_376, 229_376, 28 * 128 * 4, 28 * 128 * 4]
    assert (t[6]["rows"], t[6]["cols"]) == (28 * 2048, 2048)
    assert t[13]["bytes"] == 175_030_272 and t[13]["name"] == "q4_lm"
    assert (t[14]["rows"], t[14]["cols"], t[14]["bytes"]) == (24 * 3072, 1024, 80_216_064)
    for first, last, qt, total in GROUPS:
        assert {x["qtype"] for x in t[first:last + 1]} == {qt}
        assert sum(x["bytes"] for x in t[first:last + 1]) == total, (first, last)
    assert (t[18]["name"], t[18]["rows"], t[18]["cols"]) == ("v_patch", 1024, 1536)
    assert (t[20]["name"], t[20]["rows"], t[20]["cols"]) == ("v_pos", 2304, 1024)
    assert j["data_offset"] == 4096
    assert sum(x["bytes"] for x in t) == 2_331_312_128 == fp2b.dir_bytes_sum
    assert j["file_len"] == 2_331_316_224 and j["file_size"] == 2_331_316_232
    # offsets chain (64-byte rounding) from data_offset
    off = 4096
    for x in t:
        assert x["offset"] == off
        off = (x["offset"] + x["bytes"] + 63) & ~63


def test_cli_plan_json(capsys):
    from kestrel_lab.cli import main

    assert main(["vqf", "plan", str(CFG_2B), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["data_offset", "file_len", "file_size", "tensors"]
    assert list(out["tensors"][0]) == ["name", "qtype", "rows", "cols", "offset", "bytes"]
    assert out == plan_file(CFG_2B).to_json()


def test_od_of_entry0_matches_article(tmp_path, capsys):
    from kestrel_lab.cli import main

    out = tmp_path / "h.vqf"
    assert main(["vqf", "plan", str(CFG_2B), "--write-header", str(out)]) == 0
    capsys.readouterr()
    dump = I.od_file(out, 448, 136)
    assert dump.startswith(ARTICLE_OD + "\n")
    data = out.read_bytes()
    assert len(data) == 4096
    name, qt, rows, cols, off, nb = struct.unpack_from("<32sIII4xQQ", data, 448)
    assert (name.rstrip(b"\0"), qt, rows, cols, off, nb) == (b"token_embed", 5, 151936, 2048, 4096, 622_329_856)
    # the inspector passes the five assertions on the header-only file
    checks = I.assertions(I.parse(out))
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    # a reader refuses it: file_len says 2.3 GB
    from kestrel_lab.vqf.reader import open_vqf
    with pytest.raises(F.VQFFormatError, match=r"file_len at offset 192.*truncated"):
        open_vqf(out)


@pytest.mark.skipif(shutil.which("od") is None, reason="no od on this system")
def test_od_matches_coreutils(tmp_path):
    out = plan_file(CFG_2B).write_header(tmp_path / "h.vqf")
    for skip, count in ((448, 136), (0, 448), (400, 333), (3000, 1096), (4000, 200)):
        ref = subprocess.run(["od", "-A", "x", "-t", "x1", "-j", str(skip), "-N", str(count), str(out)],
                             capture_output=True, text=True, check=True).stdout.rstrip("\n")
        ours = I.od_file(out, skip, count)
        assert ours == ref, (skip, count)


def test_header_roundtrip_and_offsets(fp2b):
    head = fp2b.header_bytes(source={"model": "Qwen/Qwen3-VL-2B-Instruct", "sha256": "ab" * 32, "bytes": 123,
                                     "dtype": "bf16", "n_files": 2}, created=1_757_203_200)
    assert len(head) == 4096
    assert head[:4] == b"VQF\0"
    assert struct.unpack_from("<IIII", head, 0) == (F.MAGIC_U32, 2, fp2b.flags, 41)
    assert struct.unpack_from("<QQ", head, 184) == (4096, 2_331_316_224)
    assert head[432:448] == b"\0" * 16
    h = F.unpack_header_raw(head)
    cfg = F.config_from_header(h)
    assert cfg == ModelConfig.from_hf(CFG_2B)
    src = F.source_from_header(h)
    assert src["model"] == "Qwen/Qwen3-VL-2B-Instruct" and src["sha256"] == "ab" * 32
    assert src["created"].startswith("2025-09-07") and src["quant"] == "q4_0" and src["dtype"] == "bf16"
    assert fp2b.flags == F.FLAG["FNV_TRAILER"] | F.FLAG["VISION"]


@pytest.mark.parametrize("path", [configs_dir() / "qwen3-0.6b.config.json", tiny_poem_dir()])
def test_dense_is_text_subset(path, fp2b):
    cfg = ModelConfig.from_hf(path)
    specs = plan(cfg)
    assert [s.name for s in specs] == ARTICLE_NAMES[:14]
    assert specs[13].sources == ("model.embed_tokens.weight",)  # tied: the quantized copy of the embedding
    assert specs[6].sources[1] == "model.layers.1.self_attn.q_proj.weight"
    assert F.FLAG["VISION"] & plan_file(cfg).flags == 0


@pytest.mark.parametrize("quant", QUANTS)
def test_quant_choice_sets_text_qtypes(quant):
    cfg = ModelConfig.from_hf(CFG_2B)
    specs = {s.name: s for s in plan(cfg, quant)}
    want = {"f32": 1, "f16": 5, "q8_0": 2, "q4_0": 3, "q4_8x8l": 4}[quant]
    assert {specs[n].qtype for n in ARTICLE_NAMES[6:14]} == {want}
    assert specs["token_embed"].qtype == (1 if quant == "f32" else 5)
    assert specs["v_q8_qkv"].qtype == (want if quant in ("f32", "f16") else 2)
    assert [s for s in specs] == [s.name for s in plan(cfg)]  # names and order never change
    fp = plan_file(cfg, quant)
    assert bool(fp.flags & F.FLAG["REPACKED_8X8"]) == (quant == "q4_8x8l")


def test_bad_quant_and_untied_lm_head():
    cfg = ModelConfig.from_hf(CFG_2B)
    with pytest.raises(ValueError, match="quant 'q5_0'"):
        plan(cfg, "q5_0")
    cfg.tie_word_embeddings = False
    assert plan(cfg)[13].sources == ("lm_head.weight",)


def test_sources_follow_the_build_rule():
    """Every spec's sources, at the shapes transformers gives them, reshape to (-1, cols) and stack
    to exactly rows (the shapes of a Qwen3-VL state dict, written out from the config)."""
    from kestrel_lab.vqf.synth import small_vl_config

    cfg = small_vl_config()
    v = cfg.vision
    h, L, I_ = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    shapes = {"model.language_model.embed_tokens.weight": (cfg.vocab_size, h),
              "model.language_model.norm.weight": (h,),
              "model.visual.patch_embed.proj.weight": (v.hidden_size, 3, 2, 16, 16),
              "model.visual.patch_embed.proj.bias": (v.hidden_size,),
              "model.visual.pos_embed.weight": (v.num_position_embeddings, v.hidden_size)}
    per_layer = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
                 "self_attn.q_norm.weight": (cfg.head_dim,), "self_attn.k_norm.weight": (cfg.head_dim,),
                 "self_attn.q_proj.weight": (cfg.q_dim, h), "self_attn.k_proj.weight": (cfg.kv_dim, h),
                 "self_attn.v_proj.weight": (cfg.kv_dim, h), "self_attn.o_proj.weight": (h, cfg.q_dim),
                 "mlp.gate_proj.weight": (I_, h), "mlp.up_proj.weight": (I_, h), "mlp.down_proj.weight": (h, I_)}
    for i in range(L):
        shapes |= {f"model.language_model.layers.{i}.{k}": s for k, s in per_layer.items()}
    vh, vi = v.hidden_size, v.intermediate_size
    blk = {"attn.qkv.weight": (3 * vh, vh), "attn.qkv.bias": (3 * vh,), "attn.proj.weight": (vh, vh),
           "attn.proj.bias": (vh,), "mlp.linear_fc1.weight": (vi, vh), "mlp.linear_fc1.bias": (vi,),
           "mlp.linear_fc2.weight": (vh, vi), "mlp.linear_fc2.bias": (vh,), "norm1.weight": (vh,),
           "norm1.bias": (vh,), "norm2.weight": (vh,), "norm2.bias": (vh,)}
    for i in range(v.depth):
        shapes |= {f"model.visual.blocks.{i}.{k}": s for k, s in blk.items()}
    md, out = v.merged_dim, v.out_hidden_size
    for prefix, norm in [("model.visual.merger.", vh)] + [
            (f"model.visual.deepstack_merger_list.{k}.", md) for k in range(len(v.deepstack_visual_indexes))]:
        shapes |= {prefix + "norm.weight": (norm,), prefix + "norm.bias": (norm,),
                   prefix + "linear_fc1.weight": (md, md), prefix + "linear_fc1.bias": (md,),
                   prefix + "linear_fc2.weight": (out, md), prefix + "linear_fc2.bias": (out,)}
    used = set()
    for s in plan(cfg):
        assert sum(source_rows(s, shapes)) == s.rows
        used |= set(s.sources)
    assert used == set(shapes)  # every checkpoint tensor lands in exactly the planned entries


def test_spec_page_is_generated_from_the_code():
    from kestrel_lab.vqf.spec import regions, render, splice

    page = (REPO_ROOT / "book" / "formats" / "vqf.md").read_text(encoding="utf-8")
    blocks = render()
    assert set(regions(page)) == set(blocks), "every generated table appears on the page"
    assert splice(page, blocks) == page, "book/formats/vqf.md is stale: run `kestrel-lab vqf spec`"
    for q in QTYPES.values():
        assert f"| {q.id} | {q.name} |" in page
    for f in F.HEADER_FIELDS:
        assert f"| {f.offset} | {f.size} |" in page and f"`{f.name}`" in page


def test_moe_layout_and_header_roundtrip():
    cfg = ModelConfig.from_hf(configs_dir() / "qwen3-30b-a3b.config.json")
    specs = plan(cfg)
    names = [s.name for s in specs]
    assert names[:10] == ARTICLE_NAMES[:10] and names[10:] == ["moe_router", "q4_gate_exps", "q4_up_exps",
                                                               "q4_down_exps", "q4_lm"]
    L, E = cfg.num_hidden_layers, cfg.num_experts
    gate = specs[11]
    assert gate.rows == L * E * cfg.moe_intermediate_size and len(gate.sources) == L * E
    assert gate.sources[1] == "model.layers.0.mlp.experts.1.gate_proj.weight"
    assert specs[-1].sources == (("model.embed_tokens.weight",) if cfg.tie_word_embeddings else ("lm_head.weight",))
    fp = plan_file(cfg)
    h = F.unpack_header_raw(fp.header_bytes())
    assert F.config_from_header(h) == cfg
