"""The llama.cpp peer comparison (``kestrel_lab.bench.peer``, ``kestrel-lab bench --peer``).

Reference-free parts run everywhere: llama-bench's JSON (a real output captured on this project's VM,
tests/fixtures/llama_bench_q4_0.json) parsed, the median/ratio maths, the missing-peer message and
exit code, and ``bench --record`` handing over to the notebook that owns the figures. The parts that
need the peer (``make peers``; CI has none) skip with the reason: the GGUF llama.cpp's converter writes,
read back with gguf-py (the vendored copy that wrote it), and one real interleaved round.
"""
import json
from pathlib import Path

import pytest

from kestrel_lab import cli, paths
from kestrel_lab.bench import peer

FIXTURE = Path(__file__).parent / "fixtures" / "llama_bench_q4_0.json"
BUILT = peer.find()
needs_peer = pytest.mark.skipif(BUILT is None, reason=f"no llama.cpp peer build in {peer.peers_dir()} "
                                                      "(`make peers` builds it; CI has none)")


# ------------------------------------------------------------------------------ llama-bench's JSON
def test_parse_captured_llama_bench_output():
    raw = FIXTURE.read_text(encoding="utf-8")
    tests = json.loads(raw)
    got = peer.parse_llama_bench(raw)
    pp = next(t for t in tests if t["n_gen"] == 0)
    tg = next(t for t in tests if t["n_prompt"] == 0)
    assert got["prefill"]["tok_s"] == pytest.approx(pp["avg_ts"])
    assert got["decode"]["tok_s"] == pytest.approx(tg["avg_ts"])
    assert got["prefill"]["tokens"] == 64 and got["decode"]["tokens"] == 32
    assert len(got["decode"]["samples"]) == 3             # -r 3
    assert got["decode"]["tok_s"] == pytest.approx(sum(got["decode"]["samples"]) / 3, rel=1e-3)
    s = got["settings"]
    assert s["n_threads"] == tg["n_threads"] and s["model_type"] == tg["model_type"] and "Q4_0" in s["model_type"]
    assert s["model_size"] > 0 and s["build_commit"]


def test_parse_tolerates_a_log_line_before_the_json_and_refuses_junk():
    raw = FIXTURE.read_text(encoding="utf-8")
    assert peer.parse_llama_bench("main: some log line\n" + raw)["decode"]["tokens"] == 32
    with pytest.raises(ValueError, match="no JSON array"):
        peer.parse_llama_bench("| model | size |\n")
    with pytest.raises(ValueError, match="empty"):
        peer.parse_llama_bench("[]")
    bad = json.loads(raw)
    bad[0]["n_gen"] = bad[0]["n_prompt"] = 7
    with pytest.raises(ValueError, match="neither a prompt nor a generation"):
        peer.parse_llama_bench(json.dumps(bad))


def test_a_sigill_on_an_amx_host_names_the_rebuild_without_amx(monkeypatch):
    """Some VMs list amx_int8 while ggml's AMX backend dies of SIGILL in tilezero (seen on this
    project's Sapphire Rapids VM): the error says so and names `make peers PEER_BUILD=isa`; on a host
    without AMX a SIGILL stays a plain failure with the signal's number."""
    dies = ["sh", "-c", "kill -ILL $$"]                     # a real process that dies of SIGILL
    monkeypatch.setattr(peer, "host_features", lambda: frozenset({"x86_64", "avx512_vnni", "amx_int8"}))
    with pytest.raises(RuntimeError, match=r"SIGILL.*PEER_BUILD=isa"):
        peer._run(dies)
    monkeypatch.setattr(peer, "host_features", lambda: frozenset({"x86_64", "avx2"}))
    with pytest.raises(RuntimeError, match=r"failed \(-4\)") as e:
        peer._run(dies)
    assert "PEER_BUILD" not in str(e.value)


def _fake_build(tmp_path, bench_script: str) -> "Path":
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool, body in (("llama-bench", bench_script), ("llama-quantize", "exit 0")):
        (bin_dir / tool).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / tool).chmod(0o755)
    build = tmp_path / "build-native.json"
    build.write_text(json.dumps({"build_kind": "native", "bin_dir": str(bin_dir), "cmake_flags": ["-DGGML_NATIVE=ON"]}))
    return build


def test_make_peers_smoke_names_the_signal_and_choose_records_what_was_tried(tmp_path, monkeypatch):
    """`make peers` keeps the native build only when its llama-bench runs on the bench model: a build that dies
    is reported by signal (then the script tries explicit ISA flags); the chosen BUILD.json lists the tries."""
    monkeypatch.setattr(peer, "checkpoint", lambda: tmp_path / "ckpt")
    monkeypatch.setattr(peer, "gguf", lambda ckpt, info, log=print: tmp_path / "model.gguf")
    dies = _fake_build(tmp_path / "a", "kill -ILL $$")
    with pytest.raises(RuntimeError, match="died of SIGILL"):
        peer.smoke(dies)
    assert peer._main(["smoke", str(dies)]) == 3
    out = [{"build_commit": "x", "n_prompt": 8, "n_gen": 0, "avg_ts": 100.0, "stddev_ts": 1.0, "samples_ts": [100.0]},
           {"build_commit": "x", "n_prompt": 0, "n_gen": 4, "avg_ts": 20.0, "stddev_ts": 1.0, "samples_ts": [20.0]}]
    runs = _fake_build(tmp_path / "b", "cat <<'EOF'\n" + json.dumps(out) + "\nEOF")
    assert peer.smoke(runs).startswith("ran: decode 20.0 tok/s, prefill 100.0 tok/s")
    peer.choose(runs, tmp_path / "BUILD.json", ["native: llama-bench died of SIGILL", "isa: ran"])
    chosen = json.loads((tmp_path / "BUILD.json").read_text())
    assert chosen["chosen"]["tried"] == ["native: llama-bench died of SIGILL", "isa: ran"]
    assert chosen["cmake_flags"] == ["-DGGML_NATIVE=ON"]


# ------------------------------------------------------------------------------ the maths
def test_summary_and_ratio_bounds():
    s = peer.summary([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    r = peer.ratio_bounds([80.0, 84.0, 79.0], [64.0, 68.0, 63.0])
    assert r["ratio"] == pytest.approx(80.0 / 64.0)
    assert r["low"] == pytest.approx(79.0 / 68.0)
    assert r["high"] == pytest.approx(84.0 / 63.0)
    assert r["low"] <= r["ratio"] <= r["high"]
    with pytest.raises(ValueError):
        peer.summary([])


# ------------------------------------------------------------------------------ without the peer
def test_find_reads_build_json_and_needs_both_binaries(tmp_path):
    assert peer.find(tmp_path) is None
    bin_dir = tmp_path / "build" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "BUILD.json").write_text(json.dumps({"bin_dir": str(bin_dir), "sdist_sha256": "x"}))
    assert peer.find(tmp_path) is None                     # no binaries yet
    for name in ("llama-bench", "llama-quantize"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    info = peer.find(tmp_path)
    assert info["llama_bench"] == str(bin_dir / "llama-bench") and info["sdist_sha256"] == "x"
    with pytest.raises(peer.PeerMissing, match="make peers"):
        peer.require(tmp_path / "nothing")


def test_bench_peer_without_the_build_exits_1_with_the_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KESTREL_PEERS_DIR", str(tmp_path / "no-peers"))
    assert cli.main(["bench", "--peer", "llama.cpp", "--rounds", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bench --peer llama.cpp: ") and "`make peers`" in err[-1]


# ------------------------------------------------------------------------------ --record
@pytest.mark.parametrize("argv, notebook, params", [
    (["--record", "r1"], "day29_1", []),
    (["--record", "r1", "--peer", "llama.cpp"], "day29_1", ["-p", "run_peer", "true", "-p", "rounds", "3"]),
    (["--record", "r1", "--peer", "llama.cpp", "--rounds", "5", "--threads", "1,4"], "day29_1",
     ["-p", "run_peer", "true", "-p", "rounds", "5", "-p", "peer_threads", "1,4"]),
    (["--record", "r1", "--vision"], "day20_2", []),
    (["--record", "r1", "--config", str(paths.configs_dir() / "qwen3-30b-a3b.config.json")], "day22_3", []),
])
def test_record_runs_the_notebook_that_owns_the_figures(argv, notebook, params, monkeypatch):
    seen = []
    real_main = cli.main

    def fake_main(a=None):
        if a and a[0] == "rerun":
            seen.append(a)
            return 0
        return real_main(a)
    monkeypatch.setattr(cli, "main", fake_main)
    assert real_main(["bench", *argv]) == 0
    assert seen == [["rerun", "--runner", "r1", "--notebooks", notebook, *params]]


def test_the_bench_writes_no_figures_itself():
    from kestrel_lab.bench import moe, speed
    from kestrel_lab.bench import vision as vision_bench

    assert not any(hasattr(m, "record") for m in (speed, moe, vision_bench))


# ------------------------------------------------------------------------------ with the peer
@needs_peer
def test_the_gguf_llama_cpp_writes_reads_back_with_gguf_py():
    import importlib.util
    import sys

    ckpt = peer.checkpoint()
    g = peer.gguf(ckpt, BUILT)
    spec = importlib.util.spec_from_file_location("gguf", Path(BUILT["gguf_py"]) / "gguf" / "__init__.py",
                                                  submodule_search_locations=[str(Path(BUILT["gguf_py"]) / "gguf")])
    saved = {k: v for k, v in sys.modules.items() if k == "gguf" or k.startswith("gguf.")}
    try:
        for k in saved:
            del sys.modules[k]
        gguf = importlib.util.module_from_spec(spec)
        sys.modules["gguf"] = gguf
        spec.loader.exec_module(gguf)
        r = gguf.GGUFReader(str(g))
        cfg = json.loads((ckpt / "config.json").read_text())

        def field(k):
            return r.fields[k].contents()

        assert field("general.architecture") == "qwen3"
        assert field("qwen3.block_count") == cfg["num_hidden_layers"]
        assert field("qwen3.embedding_length") == cfg["hidden_size"]
        assert field("qwen3.attention.head_count_kv") == cfg["num_key_value_heads"]
        types = {t.name: t.tensor_type.name for t in r.tensors}
        mats = [n for n in types if n.endswith(("attn_q.weight", "ffn_down.weight", "ffn_up.weight"))]
        assert len(mats) == 3 * cfg["num_hidden_layers"]
        assert all(types[n] == "Q4_0" for n in mats)             # --pure: every matrix Q4_0
        assert types["token_embd.weight"] == "Q4_0"
        assert len(field("tokenizer.ggml.tokens")) == cfg["vocab_size"]
    finally:
        for k in [k for k in sys.modules if k == "gguf" or k.startswith("gguf.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@needs_peer
def test_one_real_round_side_by_side():
    res = peer.run(rounds=1, threads=(1,), log=lambda *a: None)
    json.dumps(res)                                          # what --json prints
    rows = {(r["test"], r["threads"]): r for r in res["rows"]}
    assert set(rows) == {("decode", 1), ("prefill", 1)}
    for r in rows.values():
        assert r["peer"]["median"] > 0 and r["engine"]["median"] > 0
        assert r["low"] <= r["ratio"] <= r["high"]
    lim = res["limits"][0]
    assert lim["binding"] in ("bandwidth", "compute")
    assert lim["ceiling_tok_s"] == min(lim["bandwidth_tok_s"], lim["compute_tok_s"])
    assert res["settings"]["peer"]["model_type"].endswith("Q4_0")
    assert res["build"]["sdist_sha256"] == BUILT["sdist_sha256"]
    assert "ratio" in peer.format_table(res)


def test_the_report_prints_an_unknown_load_average():
    assert peer._loads((1, 2.5, 0.25)) == "1.00 / 2.50 / 0.25"
    assert peer._loads(None) == "unknown"     # procfs.load_average where the OS keeps none
