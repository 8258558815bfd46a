"""Writer → reader round trips, the writer's state machine, atomicity, and the checksum."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from kestrel_lab import quant as Q
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf import synth
from kestrel_lab.vqf.checksum import FNV_OFFSET, fnv1a64, fnv1a64_py
from kestrel_lab.vqf.inspect import assertions, parse
from kestrel_lab.vqf.layout import plan
from kestrel_lab.vqf.planner import plan_file
from kestrel_lab.vqf.reader import open_vqf, verify_file
from kestrel_lab.vqf.writer import VQFWriteError, VQFWriter


@pytest.fixture(scope="module")
def cfg():
    return synth.small_vl_config()


@pytest.fixture(scope="module")
def vl_file(tmp_path_factory, cfg):
    return synth.write_random(tmp_path_factory.mktemp("vqf") / "small.vqf", cfg, "q4_0", seed=7)


# ------------------------------------------------------------------------------------ checksum
def test_fnv_known_vectors():
    # FNV-1a 64 test vectors (Fowler/Noll/Vo reference): "", "a", "foobar"
    assert fnv1a64(b"") == FNV_OFFSET == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8
    assert fnv1a64_py(b"foobar") == 0x85944171F73967E8


def test_fnv_numba_equals_python_and_streams():
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    ref = fnv1a64_py(data.tobytes())
    assert fnv1a64(data) == ref
    assert fnv1a64(data[50_000:], fnv1a64(data[:50_000])) == ref  # continuing a stream


# ------------------------------------------------------------------------------------ round trip
@pytest.mark.parametrize("quant", ["q4_0", "q8_0", "f16", "q4_8x8l"])
def test_roundtrip_every_tensor(tmp_path, cfg, quant):
    path = synth.write_random(tmp_path / f"m-{quant}.vqf", cfg, quant, seed=3)
    specs = plan(cfg, quant)
    with open_vqf(path, verify=True) as vf:
        assert vf.verified and vf.config == cfg
        assert list(vf.tensors) == [s.name for s in specs] and not vf.unknown and not vf.missing
        assert vf.source["quant"] == quant and vf.source["model"] == "random seed=3"
        for s in specs:
            t = vf[s.name]
            assert (t.qtype, t.rows, t.cols, t.nbytes) == (s.qtype, s.rows, s.cols, s.nbytes)
            raw = np.concatenate(list(synth.parts(s, 3)))
            np.testing.assert_array_equal(t.data, raw)  # the bytes written are the bytes read
            x = synth.random_rows(s, 3, 0, s.rows)
            np.testing.assert_array_equal(t.dequantize(), Q.dequantize(raw, s.qtype, s.rows, s.cols))
            if s.qtype == Q.F32.id:
                np.testing.assert_array_equal(t.array(), x)
            assert t.array().base is not None and not t.data.flags.writeable  # a view, read-only
    assert all(c.ok for c in assertions(parse(path)))
    computed, stored, seconds = verify_file(path)
    assert computed == stored and seconds >= 0


def test_array_views(vl_file):
    with open_vqf(vl_file) as vf:
        assert vf["token_embed"].array().dtype == np.float16
        assert vf["token_embed"].array().shape == (320, 64)
        assert vf["q4_q"].array().shape == (2 * 64, 64 // 32 * 18)
        assert vf["v_patch"].array().shape == (32, 1536)
        # zero copy: the view's memory lies inside the file mapping
        a, b = vf["q4_q"].data, vf["q4_k"].data
        assert b.__array_interface__["data"][0] - a.__array_interface__["data"][0] == \
            vf["q4_k"].offset - vf["q4_q"].offset


def test_q4_8x8l_array_is_group_layout(tmp_path, cfg):
    path = synth.write_random(tmp_path / "r.vqf", cfg, "q4_8x8l")
    with open_vqf(path) as vf:
        assert vf.flags & F.FLAG["REPACKED_8X8"]
        t = vf["q4_q"]
        assert t.array().shape == (t.rows // 8, t.cols // 32, 144)


def test_verify_env_variable(vl_file, tmp_path, monkeypatch):
    bad = tmp_path / "flip.vqf"
    data = bytearray(vl_file.read_bytes())
    data[5000] ^= 1  # inside the data area: only the checksum can notice
    bad.write_bytes(data)
    monkeypatch.delenv("KESTREL_VQF_CHECK", raising=False)
    with open_vqf(bad) as vf:
        assert not vf.verified
    monkeypatch.setenv("KESTREL_VQF_CHECK", "1")
    with pytest.raises(F.VQFFormatError, match=r"trailer \(FNV-1a 64\) at offset \d+: stored"):
        open_vqf(bad)
    with pytest.raises(F.VQFFormatError, match="trailer"):
        open_vqf(bad, verify=True)
    open_vqf(vl_file).close()  # the good file passes with the check on


def test_checksum_covers_directory_and_data_only(vl_file, tmp_path):
    data = bytearray(vl_file.read_bytes())
    n, d0, fl = struct.unpack_from("<I", data, 12)[0], *struct.unpack_from("<QQ", data, 184)
    expect = fnv1a64_py(bytes(data[448:448 + 64 * n]) + bytes(data[d0:fl]))
    assert struct.unpack_from("<Q", data, fl)[0] == expect
    # the header is not covered: changing the source name keeps the checksum valid
    data[240] = ord("X")
    p = tmp_path / "renamed.vqf"
    p.write_bytes(data)
    with open_vqf(p, verify=True) as vf:
        assert vf.source["model"].startswith("X")


# ------------------------------------------------------------------------------------ the writer
def _specs_and_bytes(cfg):
    specs = plan(cfg)
    return specs, {s.name: np.concatenate(list(synth.parts(s, 0))) for s in specs}


def test_writer_refuses_out_of_order_duplicates_unknown_and_sizes(tmp_path, cfg):
    specs, data = _specs_and_bytes(cfg)
    target = tmp_path / "w.vqf"
    with pytest.raises(VQFWriteError, match=r"'final_norm' is entry 1, out of order; expected 'token_embed' "
                                            r"\(entry 0 of 41\)"):
        with VQFWriter(target, plan_file(cfg, None, specs)) as w:
            w.write_tensor("final_norm", data["final_norm"])
    assert not target.exists() and not [p for p in tmp_path.iterdir()]  # temp file removed
    with VQFWriter(target, plan_file(cfg, None, specs)) as w:
        w.write_tensor("token_embed", data["token_embed"])
        with pytest.raises(VQFWriteError, match="'token_embed' was already written"):
            w.write_tensor("token_embed", data["token_embed"])
        with pytest.raises(VQFWriteError, match="'nope' is not in the plan; expected 'final_norm'"):
            w.write_tensor("nope", data["final_norm"])
        with pytest.raises(VQFWriteError, match="final_norm: got 1,020 bytes, the plan says 256"):
            w.write_tensor("final_norm", np.zeros(1020, np.uint8))
        with pytest.raises(VQFWriteError, match="expected the tensor's bytes as uint8, got float32"):
            w.write_tensor("final_norm", np.zeros(64, np.float32))
        assert w.expected == "final_norm"  # refused calls left the state unchanged
        for s in specs[1:]:
            w.write_tensor(s.name, data[s.name])
        with pytest.raises(VQFWriteError, match="all 41 planned tensors are already written"):
            w.write_tensor("q4_q", data["q4_q"])
    with open_vqf(target, verify=True) as vf:
        assert len(vf.tensors) == 41


def test_writer_incomplete_or_failing_leaves_nothing(tmp_path, cfg):
    specs, data = _specs_and_bytes(cfg)
    target = tmp_path / "x.vqf"
    target.write_bytes(b"previous version")
    with pytest.raises(VQFWriteError, match=r"closed after 2 of 41 tensors; missing attn_norm"):
        with VQFWriter(target, plan_file(cfg, None, specs)) as w:
            w.write_tensor("token_embed", data["token_embed"])
            w.write_tensor("final_norm", data["final_norm"])
    with pytest.raises(RuntimeError, match="boom"):
        with VQFWriter(target, plan_file(cfg, None, specs)) as w:
            w.write_tensor("token_embed", data["token_embed"])
            raise RuntimeError("boom")
    assert target.read_bytes() == b"previous version"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.vqf"]


def test_writer_parts_and_one_shot_agree(tmp_path, cfg):
    specs, data = _specs_and_bytes(cfg)
    a, b = tmp_path / "a.vqf", tmp_path / "b.vqf"
    seen = []
    with VQFWriter(a, plan_file(cfg, None, specs), created=0, progress=lambda n, d, t: seen.append((n, d, t))) as w:
        for s in specs:
            w.write_tensor(s.name, data[s.name])
    with VQFWriter(b, plan_file(cfg, None, specs), created=0) as w:
        for s in specs:
            w.write_tensor_parts(s.name, np.array_split(data[s.name], 3))
    assert a.read_bytes() == b.read_bytes()
    assert seen[-1][1] == seen[-1][2] == open_vqf(a).file_len and len(seen) == 42
    with pytest.raises(VQFWriteError, match="parts exceed"):
        with VQFWriter(b, plan_file(cfg, None, specs)) as w:
            w.write_tensor_parts("token_embed", [data["token_embed"], data["token_embed"]])
    assert a.read_bytes() == b.read_bytes()


def test_header_fields_that_do_not_fit(tmp_path, cfg):
    specs = plan(cfg)
    with pytest.raises(F.VQFFormatError, match="source_model"):
        VQFWriter(tmp_path / "n.vqf", plan_file(cfg, None, specs), source={"model": "x" * 80}).open()
    with pytest.raises(F.VQFFormatError, match="unknown keys"):
        VQFWriter(tmp_path / "n.vqf", plan_file(cfg, None, specs), source={"modle": "x"}).open()
    assert not list(tmp_path.iterdir())


def test_unknown_names_are_ignored_and_listed(tmp_path, cfg):
    specs = plan(cfg)
    extra = specs + [type(specs[0])("future_tensor", Q.F32.id, 2, 64)]
    path = synth.write_random(tmp_path / "f.vqf", cfg, specs=extra)
    with open_vqf(path, verify=True) as vf:
        assert vf.unknown == ["future_tensor"] and "future_tensor" not in vf
        assert len(vf.tensors) == 41
    # a text-only file of the same model: loads, lists what is missing
    text = [s for s in specs if not s.name.startswith("v_")]
    path = synth.write_random(tmp_path / "t.vqf", cfg, specs=text)
    with open_vqf(path) as vf:
        assert len(vf.missing) == 27 and vf.missing[0] == "v_q8_qkv"


def test_close_while_views_alive(vl_file):
    vf = open_vqf(vl_file)
    arr = vf["final_norm"].array()
    before = arr.copy()
    vf.close()  # does not invalidate the view we still hold
    np.testing.assert_array_equal(arr, before)
    del arr
    assert os.path.getsize(vl_file) > 0


# ------------------------------------------------------------------------------------ the CLI
def test_cli_inspect_verify_dump(vl_file, tmp_path, capsys):
    from kestrel_lab.cli import main

    assert main(["vqf", "inspect", str(vl_file), "--fields"]) == 0
    out = capsys.readouterr().out
    assert "v2 n=41 flags=0x005" in out and "[ 0] token_embed" in out and "FAIL" not in out
    assert " 184  u64       data_offset" in out
    assert main(["vqf", "verify", str(vl_file)]) == 0
    out = capsys.readouterr().out
    assert "match=YES" in out and "computed=" in out and "stored  =" in out
    assert main(["vqf", "dump", str(vl_file), "--entry", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0001c0 74 6f 6b 65 6e 5f 65 6d 62 65 64 00") and "5 = F16" in out
    # a corrupted data byte: verify fails (exit 1), inspect still passes (it does not hash)
    bad = tmp_path / "bad.vqf"
    data = bytearray(vl_file.read_bytes())
    data[-9] ^= 0xFF
    bad.write_bytes(data)
    assert main(["vqf", "verify", str(bad)]) == 1
    assert "match=NO" in capsys.readouterr().out
    # a broken chain: inspect reports FAIL and exits 1
    struct.pack_into("<Q", data, 448 + 64 * 3 + 48, struct.unpack_from("<Q", data, 448 + 64 * 3 + 48)[0] + 64)
    bad.write_bytes(data)
    assert main(["vqf", "inspect", str(bad)]) == 1
    assert "FAIL (2)" in capsys.readouterr().out
    # the reader names the problem for verify
    assert main(["vqf", "verify", str(tmp_path / "missing.vqf")]) == 1
    assert "missing.vqf" in capsys.readouterr().err


def test_cli_spec_check(capsys):
    from kestrel_lab.cli import main

    assert main(["vqf", "spec", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_write_vqf_progress_line_and_raw_view(tmp_path, cfg, capsys):
    from kestrel_lab.vqf.writer import write_vqf

    specs, data = _specs_and_bytes(cfg)
    path = write_vqf(tmp_path / "p.vqf", cfg, data, specs, progress=True)
    err = capsys.readouterr().err
    assert "MB/s" in err and err.endswith("\n") and "v_ds_fc2_b" in err
    with open_vqf(path) as vf:
        raw = vf.raw
        assert raw.size == path.stat().st_size and bytes(raw[:4]) == b"VQF\0"
        t = vf["q4_up"]
        np.testing.assert_array_equal(raw[t.offset:t.offset + t.nbytes], t.data)
    with pytest.raises(ValueError, match="closed"):
        vf.raw


def test_written_files_honour_the_umask(tmp_path):
    """Outputs get the permissions ordinary tools give (umask), not mkstemp's private 0600."""
    import os
    import stat

    from kestrel_lab.atomic import write_json

    old = os.umask(0o022)
    try:
        p = write_json(tmp_path / "m.json", {"a": 1})
        out = tmp_path / "t.vqf"
        from kestrel_lab.vqf.synth import small_vl_config, write_random

        write_random(out, small_vl_config(), "q8_0", seed=1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_verify_says_what_it_covers_and_checks_the_header_against_a_config(tmp_path, capsys):
    """The FNV-1a covers directory + data, not the header: a flipped ``norm_topk_prob`` bit still matches.
    verify says so, checks the header against the directory, and with --config against config.json."""
    from kestrel_lab import models
    from kestrel_lab.cli import main
    from kestrel_lab.convert import convert

    d = models.hf_checkpoint(arch="qwen3_moe", overrides={"vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2})
    good = tmp_path / "moe.vqf"
    convert(d, good, quant="q8_0", hash_source=False)
    assert main(["vqf", "verify", str(good)]) == 0
    out = capsys.readouterr().out
    assert "covers: the directory and the data area (FNV-1a 64); not the header" in out
    assert "header vs directory: every entry the configuration implies is present" in out
    assert "norm_topk_prob" in out and "--config" in out
    assert main(["vqf", "verify", str(good), "--config", str(d)]) == 0
    assert "every field matches" in capsys.readouterr().out
    data = bytearray(good.read_bytes())
    struct.pack_into("<I", data, 76, struct.unpack_from("<I", data, 76)[0] ^ 4)     # model_bits bit 2
    flipped = tmp_path / "flipped.vqf"
    flipped.write_bytes(data)
    assert main(["vqf", "verify", str(flipped)]) == 0          # the checksum cannot see it …
    assert "match=YES" in capsys.readouterr().out
    assert main(["vqf", "verify", str(flipped), "--config", str(d)]) == 1    # … the config can
    out = capsys.readouterr().out
    assert "model_bits bit 2 (norm_topk_prob) at offset 76: header False, config.json True" in out
