"""Hypothesis strategies that mutate the loaders' seed files, and a worker that runs them under a
memory cap and a per-case watchdog (``python tests/helpers/fuzz_cases.py vqf 2000``).

The worker warms every loader once on its seed, then caps its address space (``RLIMIT_AS``: what it
uses now plus ``--cap-mib``), so a loader that tries a big allocation fails with ``MemoryError`` —
a finding, like any exception that is not the loader's own class. ``faulthandler`` is armed for each
case: a case that runs longer than ``--case-timeout`` seconds (a hang, even inside numba code) dumps
every thread's stack and ends the process. It prints one JSON line: cases, outcomes, cases per
second, and the findings (there must be none).
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import resource
import struct
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

INTERESTING = [0, 1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 255, 256, 4095, 4096, 4097, 65535, 65536,
               2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-300, 1e300, 5e6, float("nan"), float("inf"),
                                    float("-inf")]), st.floats(allow_nan=True, allow_infinity=True))
JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.sampled_from([-1, 0, 1, 2, 3, 31, 32, 33, 64, 1023, 1024, 1025, 2**31, 2**32,
                                                 2**63, 10**30]),
    st.integers(-2**70, 2**70), FLOATS, st.text(max_size=6), st.lists(st.integers(-3, 300), max_size=5),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2))


def byte_ops(hot: int, size: int):
    """Mutations of a binary file: bytes and little-endian ints/floats in the hot region, a copied
    64-byte run (a duplicated directory entry), truncation, growth."""
    pos = st.integers(0, max(0, hot - 1))
    return st.one_of(
        st.tuples(st.just("byte"), pos, st.integers(0, 255)),
        st.tuples(st.just("u32"), pos.map(lambda p: p & ~3), st.one_of(st.sampled_from(INTERESTING[:21]),
                                                                      st.integers(0, 2**32 - 1))),
        st.tuples(st.just("u64"), pos.map(lambda p: p & ~7), st.one_of(st.sampled_from(INTERESTING),
                                                                      st.integers(0, 2**64 - 1))),
        st.tuples(st.just("u16"), pos, st.sampled_from([0, 1, 2, 255, 256, 65535])),
        st.tuples(st.just("f64"), pos.map(lambda p: p & ~7), FLOATS),
        st.tuples(st.just("copy"), pos.map(lambda p: p & ~63), pos.map(lambda p: p & ~63)),
        st.tuples(st.just("cut"), st.integers(0, size), st.just(0)),
        st.tuples(st.just("grow"), st.integers(1, 4096), st.integers(0, 255)),
    )


def apply_bytes(seed: bytes, ops) -> bytes:
    d = bytearray(seed)
    for kind, a, b in ops:
        if kind == "byte" and a < len(d):
            d[a] = b
        elif kind in ("u16", "u32", "u64", "f64"):
            fmt = {"u16": "<H", "u32": "<I", "u64": "<Q", "f64": "<d"}[kind]
            if a + struct.calcsize(fmt) <= len(d):
                struct.pack_into(fmt, d, a, b)
        elif kind == "copy" and max(a, b) + 64 <= len(d):
            d[b:b + 64] = d[a:a + 64]
        elif kind == "cut":
            del d[a:]
        elif kind == "grow":
            d += bytes([b]) * a
    return bytes(d)


def safetensors_json_op(header: dict):
    """Replace or delete one value of the JSON header, then re-serialise (length fixed or kept)."""
    from kestrel_lab.fuzz import json_paths

    paths = json_paths(header)
    return st.tuples(st.sampled_from(paths), JSON_VALUES, st.booleans(), st.booleans())


def apply_safetensors_json(seed: bytes, header: dict, op) -> bytes:
    from kestrel_lab.fuzz import mutate_json_value

    path, value, delete, keep_len = op
    doc = mutate_json_value(header, path, value, delete=delete)
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    n = int.from_bytes(seed[:8], "little")
    return (n if keep_len else len(raw)).to_bytes(8, "little") + raw + seed[8 + n:]


def config_op(doc: dict):
    from kestrel_lab.fuzz import json_paths

    return st.tuples(st.sampled_from(json_paths(doc)), JSON_VALUES, st.booleans())


def strategy(target):
    """The Hypothesis strategy of mutations for one target, drawn as small tuples (``build`` makes the
    bytes): Hypothesis keeps and prints what it draws, and 600 kB inputs would cost it memory and time."""
    if target.name.startswith("config"):
        doc = json.loads(target.seed)
        structural = st.tuples(st.just("json"), st.lists(config_op(doc), min_size=1, max_size=3))
        raw = st.tuples(st.just("bytes"), st.lists(byte_ops(target.hot, len(target.seed)), min_size=1, max_size=2))
        return st.one_of(structural, structural, structural, raw)
    ops = st.tuples(st.just("bytes"), st.lists(byte_ops(target.hot, len(target.seed)), min_size=1, max_size=4))
    if target.name == "safetensors":
        n = int.from_bytes(target.seed[:8], "little")
        header = json.loads(target.seed[8:8 + n])
        js = st.tuples(st.just("header"), safetensors_json_op(header))
        return st.one_of(ops, js, js)
    return ops


def build(target, drawn) -> bytes:
    """The input bytes for what ``strategy`` drew."""
    from kestrel_lab.fuzz import mutate_json_value

    kind, ops = drawn
    if kind == "bytes":
        return apply_bytes(target.seed, ops)
    if kind == "header":
        n = int.from_bytes(target.seed[:8], "little")
        return apply_safetensors_json(target.seed, json.loads(target.seed[8:8 + n]), ops)
    d = json.loads(target.seed)
    for path, value, delete in ops:
        try:
            d = mutate_json_value(d, path, value, delete=delete)
        except (KeyError, IndexError, TypeError):
            pass   # the path went away with an earlier mutation
    return json.dumps(d, indent=2).encode()


def _config_differential(path: Path, ours) -> str | None:
    """For a config.json we load: transformers given the same file must compute the same math — the RoPE
    frequencies and attention factor (its ``ROPE_INIT_FUNCTIONS``) and the fields the engine runs on — or
    refuse it (its strict types: counted, not a mismatch). None when they agree."""
    if ours.status != "loaded":
        return None
    try:
        import torch  # noqa: F401  (transformers needs it; an ImportError skips the comparison)
        import transformers
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    doc = json.loads(path.read_text(encoding="utf-8"))
    try:
        ref = transformers.AutoConfig.for_model(doc.pop("model_type"), **doc)
        rt = ref.rope_parameters.get("rope_type", "default")
        inv, att = (ROPE_INIT_FUNCTIONS[rt](ref) if rt != "default" else (None, 1.0))
    except Exception:  # transformers refuses the file: nothing to compare
        return "reference refused"
    import numpy as np

    from kestrel_lab import rope_scaling as R

    cfg = ours.extra["config"]
    theta = ref.rope_parameters["rope_theta"]
    got = R.inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    want = inv.numpy() if inv is not None else R.base_inv_freq(cfg.head_dim, theta)
    out = []
    if theta != cfg.rope_theta or not np.allclose(got, want, rtol=5e-7, atol=0):
        out.append(f"rope frequencies (θ ours {cfg.rope_theta}, transformers {theta}, type {rt})")
    if np.float32(att) != np.float32(R.attention_factor(cfg.rope_scaling)):
        out.append(f"attention factor ours {R.attention_factor(cfg.rope_scaling)}, transformers {att}")
    names = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings")
    moe = ("num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob") if cfg.arch == "qwen3_moe" else ()
    for n in names + moe:
        if getattr(ref, n) != getattr(cfg, n):
            out.append(f"{n}: ours {getattr(cfg, n)!r}, transformers {getattr(ref, n)!r}")
    return "; ".join(out) or None


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _differential(path: Path, ours) -> str | None:
    """For safetensors: the safetensors package must agree with our reader on accept/refuse."""
    try:
        from safetensors import safe_open
    except ImportError:
        return None
    try:
        with safe_open(str(path), framework="numpy") as f:
            theirs = sorted(f.keys())
    except Exception:  # any refusal of theirs
        theirs = None
    if (ours.status == "loaded") != (theirs is not None):
        return f"ours {ours.status} ({ours.message[:200]}), safetensors {'loaded' if theirs is not None else 'refused'}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("cases", type=int)
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized, the same cases)")
    ap.add_argument("--cap-mib", type=int, default=1024, help="address space allowed above the warmed-up process")
    ap.add_argument("--case-timeout", type=float, default=60.0, help="seconds one case may run (a hang)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep-going", action="store_true", help="count findings instead of stopping at the first")
    a = ap.parse_args(argv)
    from kestrel_lab import fuzz

    work = Path(a.workdir or tempfile.mkdtemp(prefix="kestrel-fuzz-"))
    target = fuzz.targets(work, [a.target])[a.target]
    case_path = work / f"case{target.suffix}"
    warm = fuzz.run(target, target.seed, case_path)       # compile/load every kernel before the cap
    if warm.status != "loaded":
        print(json.dumps({"error": f"the seed does not load: {warm}"}))
        return 2
    differential = {"safetensors": _differential, "config_moe": _config_differential}.get(target.name)
    if differential is not None and differential(case_path, warm):   # and import the reference before the cap
        print(json.dumps({"error": f"the seed disagrees with the reference: {differential(case_path, warm)}"}))
        return 2
    base = _vm_bytes()
    cap = base + (a.cap_mib << 20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    stats = {"cases": 0, "outcomes": {}, "findings": [], "mismatches": [], "errors": {}, "found": {}}

    @settings(max_examples=a.cases, deadline=None, database=None, derandomize=a.seed is None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(strategy(target))
    def prop(drawn):
        data = build(target, drawn)
        faulthandler.dump_traceback_later(a.case_timeout, exit=True)
        try:
            out = fuzz.run(target, data, case_path)
        finally:
            faulthandler.cancel_dump_traceback_later()
        stats["cases"] += 1
        stats["outcomes"][out.status] = stats["outcomes"].get(out.status, 0) + 1
        if out.error:
            stats["errors"][out.error] = stats["errors"].get(out.error, 0) + 1
        m = differential(case_path, out) if differential and out.status in ("loaded", "refused") else None
        if m == "reference refused":         # transformers' strict types refuse what the table accepts
            stats["reference_refused"] = stats.get("reference_refused", 0) + 1
            m = None
        if m:
            if len(stats["mismatches"]) < 20:
                keep = work / f"mismatch-{len(stats['mismatches'])}{target.suffix}"
                keep.write_bytes(data)
                stats["mismatches"].append(f"{m}; input kept as {keep}")
        if out.finding and a.keep_going:
            key = f"{out.status}: {out.error}"
            stats["found"].setdefault(key, [0, out.message[:300]])[0] += 1
            return
        assert not out.finding, f"{out.status}: {out.error}: {out.message}"

    if a.seed is not None:
        prop = hypothesis_seed(a.seed)(prop)
    t0 = time.perf_counter()
    try:
        prop()
    except AssertionError as e:
        stats["findings"].append(str(e)[:2000])
    except MemoryError as e:     # a big allocation under the cap, outside a case's classification
        stats["findings"].append(f"MemoryError: {e}")
    seconds = time.perf_counter() - t0
    stats.update(target=a.target, seconds=round(seconds, 2), cases_per_s=round(stats["cases"] / seconds, 1),
                 vm_growth_mib=round((_vm_bytes() - base) / 2**20, 1),
                 seed_note=target.note, cap_mib=a.cap_mib)
    print(json.dumps(stats))
    return 1 if stats["findings"] or stats["mismatches"] or stats["found"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
