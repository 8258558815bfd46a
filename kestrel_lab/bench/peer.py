"""``kestrel-lab bench --peer llama.cpp``: the engine beside llama.cpp on the same checkpoint, same machine, same run.

What a fair comparison pins, and where this module pins it:

- **the build**: llama.cpp's ``llama-bench`` and ``llama-quantize`` from the vendored source of the pinned
  ``llama-cpp-python`` sdist, Release, its CPU repack on, no BLAS, the strongest build that runs here —
  ``GGML_NATIVE=ON`` when its smoke run works (``smoke``), else explicit ISA flags without AMX (``make peers``
  → ``scripts/build-peers.sh``, whose chosen ``BUILD.json`` records the flags and every try: ``choose``);
- **the weights**: one deterministic random checkpoint with Qwen3-0.6B's shapes, written by
  transformers' own ``save_pretrained`` with the workbook's ``tokenizer.json`` beside it (``checkpoint``),
  converted twice: by ``kestrel-lab convert --quant q4_0`` (``vqf``) and by llama.cpp's own
  ``convert_hf_to_gguf.py --outtype bf16`` (``gguf_bf16``) + ``llama-quantize --pure Q4_0`` (``gguf``); the
  files are cached by content under the kestrel cache folder (key files through ``kestrel_lab.atomic``)
  and never committed;
- **the work**: ``llama-bench -p 64 -n 32 -r 3 -t T -o json`` and the engine doing the same — a 64-token
  prefill that computes the last token's logits only (as llama-bench's prompt phase does), then 32
  decode steps — each round the mean of 3 repetitions, like llama-bench's ``avg_ts``;
- **the threads** (1 and 2 by default), **interleaved rounds** (the order alternates, so a noisy
  neighbour hits both sides), **medians** over rounds with their min–max and ratio bounds;
- **the limits beside them**: the measured read bandwidth (``roofline.memory_bandwidth``) and the decode
  kernel's compute limit on L1 data (``roofline.int8_dot_peak``), each as a tok/s ceiling for the
  weight bytes one token reads, and which of the two binds.

Without the peer built, ``require`` raises ``PeerMissing`` whose message is the one-line hint
(``HINT``). Taught in day29_1 (the comparison) and day29_2 (the binaries' sizes).
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from kestrel_lab import paths, procfs
from kestrel_lab.kernels.registry import host_features

PEER = "llama.cpp"
PEERS = (PEER,)
HINT = ("the llama.cpp peer is not built here: run `make peers` (builds llama-bench and llama-quantize; "
        "minutes on 2 cores)")
PROMPT_TOKENS = 64
DECODE_TOKENS = 32
REPS = 3
SCHEMA = "kestrel-lab/peer/1"
#: The CPU flags that decide which int8 kernels either engine can use.
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "dotprod", "i8mm")

__all__ = ["PEER", "HINT", "PeerMissing", "peers_dir", "find", "require", "parse_llama_bench", "summary",
           "ratio_bounds", "checkpoint", "vqf", "gguf_bf16", "gguf", "llama_bench", "engine_round", "limits", "run",
           "format_table", "cpu_model", "isa_flags"]


class PeerMissing(RuntimeError):
    """The llama.cpp build is not there; the message says how to build it."""


# ------------------------------------------------------------------------------ the build
def peers_dir() -> Path:
    """Where ``make peers`` builds: ``$KESTREL_PEERS_DIR``, else ``<kestrel cache dir>/peers``."""
    env = os.environ.get("KESTREL_PEERS_DIR")
    return Path(env) if env else paths.cache_dir() / "peers"


def find(root: "str | os.PathLike | None" = None) -> dict | None:
    """The peer build's ``BUILD.json`` (with ``llama_bench``/``llama_quantize`` paths added), or None
    when it is missing or its binaries are gone."""
    root = Path(root) if root else peers_dir()
    return _build_info(root / "BUILD.json", root)


def _build_info(build_json: Path, root: Path) -> dict | None:
    """One build's JSON with the tools' paths added, or None when it or its binaries are missing."""
    try:
        info = json.loads(build_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    bin_dir = Path(info.get("bin_dir") or root / "build" / "bin")
    info["llama_bench"] = str(bin_dir / "llama-bench")
    info["llama_quantize"] = str(bin_dir / "llama-quantize")
    info["root"] = str(root)
    if not all(os.access(info[k], os.X_OK) for k in ("llama_bench", "llama_quantize")):
        return None
    return info


def require(root=None) -> dict:
    """``find`` or raise ``PeerMissing(HINT)``."""
    info = find(root)
    if info is None:
        raise PeerMissing(HINT)
    return info


# ------------------------------------------------------------------------------ the maths
def parse_llama_bench(text: str) -> dict:
    """llama-bench's ``-o json`` output → ``{"prefill": …, "decode": …, "settings": …}``.

    Each test is one JSON object; a prompt test has ``n_gen == 0``, a generation test ``n_prompt == 0``.
    For each: ``tok_s`` (llama-bench's ``avg_ts``: the mean over its repetitions), ``samples`` (each
    repetition's tok/s), ``tokens``. ``settings``: what the run used (threads, batch sizes, flash
    attention, KV types, mmap, the model's type and bytes, the build commit, the CPU it saw).
    """
    start = text.find("[")
    if start < 0:
        raise ValueError("llama-bench output: no JSON array (was it run with -o json?)")
    tests = json.loads(text[start:])
    if not isinstance(tests, list) or not tests:
        raise ValueError("llama-bench output: an empty or non-list JSON")
    out: dict = {}
    for t in tests:
        if t.get("n_gen", 0) == 0 and t.get("n_prompt", 0) > 0:
            kind, tokens = "prefill", t["n_prompt"]
        elif t.get("n_prompt", 0) == 0 and t.get("n_gen", 0) > 0:
            kind, tokens = "decode", t["n_gen"]
        else:
            raise ValueError(f"llama-bench output: a test with n_prompt={t.get('n_prompt')} n_gen={t.get('n_gen')} "
                             f"is neither a prompt nor a generation test")
        out[kind] = {"tok_s": float(t["avg_ts"]), "stddev_tok_s": float(t.get("stddev_ts", 0.0)),
                     "samples": [float(v) for v in t.get("samples_ts", [])], "tokens": int(tokens)}
    t0 = tests[0]
    keys = ("build_commit", "build_number", "cpu_info", "backends", "model_type", "model_size", "model_n_params",
            "n_batch", "n_ubatch", "n_threads", "type_k", "type_v", "flash_attn", "use_mmap", "n_depth", "poll",
            "cpu_strict")
    out["settings"] = {k: t0[k] for k in keys if k in t0}
    return out


def summary(values) -> dict:
    """Median, min, max and count of a list of per-round figures."""
    v = [float(x) for x in values]
    if not v:
        raise ValueError("summary of no values")
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v), "values": v}


def ratio_bounds(engine, peer) -> dict:
    """The engine/peer ratio of medians, and the bounds the rounds allow: min(engine)/max(peer) and
    max(engine)/min(peer). A ratio whose bounds straddle 1.0 is parity within the spread."""
    e, p = summary(engine), summary(peer)
    return {"ratio": e["median"] / p["median"], "low": e["min"] / p["max"], "high": e["max"] / p["min"]}


# ------------------------------------------------------------------------------ the machine
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (x86 ``model name``, ARM ``CPU part``), else platform's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def isa_flags() -> dict:
    """Which of ``ISA_FLAGS`` this host has (``registry.host_features``)."""
    from kestrel_lab.kernels.registry import host_features

    feats = host_features()
    return {f: f in feats for f in ISA_FLAGS}


# ------------------------------------------------------------------------------ the files
def _cache() -> Path:
    return paths.cache_dir() / "peer"


def _tokenizer_config() -> dict:
    """A tokenizer_config.json for the workbook's Qwen3 tokenizer.json (what transformers and the
    converter read beside it)."""
    return {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 40960, "add_bos_token": False,
            "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "unk_token": None, "clean_up_tokenization_spaces": False, "split_special_tokens": False}


def checkpoint(config=None, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """The shared checkpoint folder: random weights for ``config`` (default Qwen3-0.6B's) saved by
    transformers' ``save_pretrained`` (``models.hf_checkpoint(saver="transformers")``), hard-linked
    with the workbook's tokenizer.json and a tokenizer_config.json beside them. Cached by content."""
    from kestrel_lab import models
    from kestrel_lab.vocab import default_tokenizer_json

    cfg = Path(config) if config else paths.configs_dir() / models.BENCH_CONFIG
    hf = models.hf_checkpoint(config=cfg, seed=seed, dtype=dtype, saver="transformers")
    tok = default_tokenizer_json()
    hf_key = json.loads(models.cache_key_path(hf).read_text(encoding="utf-8"))
    key = {"schema": SCHEMA, "kind": "checkpoint", "hf": hf.name, "hf_key": hf_key,
           "tokenizer": tok.name, "tokenizer_config": _tokenizer_config()}
    out = _cache() / f"{hf.name}-tok"

    def build(p: Path) -> None:
        from kestrel_lab.atomic import write_json

        tmp = p.with_name(p.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in list(hf.iterdir()) + [tok]:
            if f.name.endswith(".tmp") or f.is_dir():
                continue
            dst = tmp / ("tokenizer.json" if f == tok else f.name)
            try:
                os.link(f, dst)
            except OSError:
                shutil.copy2(f, dst)
        write_json(tmp / "tokenizer_config.json", _tokenizer_config())
        if p.exists():
            shutil.rmtree(p)
        os.replace(tmp, p)
    return models._cached(out, key, build)


def vqf(ckpt: Path, quant: str = "q4_0") -> Path:
    """The checkpoint converted as ``kestrel-lab convert --quant q4_0`` does (``convert.convert``), cached."""
    from kestrel_lab import models

    return models.vqf(model=ckpt, quant=quant, name=f"{Path(ckpt).name}")


def gguf_bf16(ckpt: Path, info: dict, log=print) -> Path:
    """The checkpoint converted by llama.cpp's own ``convert_hf_to_gguf.py --outtype bf16`` (run from the
    vendored tree, with the vendored gguf-py first on PYTHONPATH), cached by content: the checkpoint's
    key and the sdist's hash (the converter is part of the source, not of the build)."""
    from kestrel_lab import models

    ckpt = Path(ckpt)
    key = {"schema": SCHEMA, "kind": "gguf", "checkpoint": ckpt.name,
           "checkpoint_key": json.loads(models.cache_key_path(ckpt).read_text(encoding="utf-8")),
           "sdist_sha256": info.get("sdist_sha256"), "outtype": "bf16"}
    out = _cache() / f"{ckpt.name}.bf16.gguf"

    def build(p: Path) -> None:
        tmp = p.with_name(p.name + ".tmp")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([info["gguf_py"]] + [x for x in [env.get("PYTHONPATH")] if x])
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TQDM_DISABLE", "1")
        log(f"peer: convert_hf_to_gguf.py --outtype bf16 {ckpt.name} …")
        try:
            _run([sys.executable, info["convert_script"], str(ckpt), "--outtype", "bf16", "--outfile", str(tmp)], env)
            os.replace(tmp, p)
        finally:
            if tmp.exists():
                tmp.unlink()
    return models._cached(out, key, build)


def gguf(ckpt: Path, info: dict, log=print) -> Path:
    """The checkpoint as llama.cpp's Q4_0: ``gguf_bf16``, then ``llama-quantize --pure <bf16> <out> Q4_0``
    (``--pure``: every matrix Q4_0, the embedding and head included, as in the VQF); cached by content
    (the bf16 file's key and the build's sdist hash and flags)."""
    from kestrel_lab import models

    bf16 = gguf_bf16(ckpt, info, log=log)
    bf16_key = json.loads(models.cache_key_path(bf16).read_text(encoding="utf-8"))
    key = {"schema": SCHEMA, "kind": "gguf", "from": bf16_key,
           "sdist_sha256": info.get("sdist_sha256"), "cmake_flags": info.get("cmake_flags"),
           "quantize": ["--pure", "Q4_0"]}
    out = _cache() / f"{Path(ckpt).name}.q4_0.gguf"

    def build(p: Path) -> None:
        tmp = p.with_name(p.name + ".tmp")
        log("peer: llama-quantize --pure … Q4_0")
        try:
            _run([info["llama_quantize"], "--pure", str(bf16), str(tmp), "Q4_0"])
            os.replace(tmp, p)
        finally:
            if tmp.exists():
                tmp.unlink()
    return models._cached(out, key, build)


def _run(cmd: list[str], env=None) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode == -signal.SIGILL and "amx_int8" in host_features():
        raise RuntimeError(f"{Path(cmd[0]).name} died of SIGILL (an illegal instruction) on a host whose "
                           "/proc/cpuinfo lists AMX: ggml's AMX backend is compiled in by -march=native and some "
                           "VMs list AMX they do not fully provide. Rebuild: `make peers` smoke-tests the native "
                           "build and falls back to explicit ISA flags without AMX (`make peers PEER_BUILD=isa` "
                           "forces that; BUILD.json then shows -DGGML_NATIVE=OFF and -DGGML_AMX_*=OFF).")
    if p.returncode:
        raise RuntimeError(f"{Path(cmd[0]).name if len(cmd) < 2 or 'python' not in cmd[0] else Path(cmd[1]).name} "
                           f"failed ({p.returncode}):\n{(p.stderr or p.stdout)[-3000:]}")
    return p.stdout


# ------------------------------------------------------------------------------ one round each
def llama_bench_cmd(info: dict, gguf_path, threads: int, prompt: int = PROMPT_TOKENS, gen: int = DECODE_TOKENS,
                    reps: int = REPS) -> list[str]:
    return [info["llama_bench"], "-m", str(gguf_path), "-p", str(prompt), "-n", str(gen), "-r", str(reps),
            "-t", str(threads), "-o", "json"]


def llama_bench(info: dict, gguf_path, threads: int, **kw) -> dict:
    """One llama-bench process (its own warm-up, then ``-r`` repetitions of each test), parsed."""
    return parse_llama_bench(_run(llama_bench_cmd(info, gguf_path, threads, **kw)))


def engine_round(eng, ids, reps: int = REPS, decode_tokens: int = DECODE_TOKENS) -> dict:
    """The engine doing llama-bench's two tests: ``reps`` timed prefills of ``ids`` (last-token logits
    only) and ``reps`` runs of ``decode_tokens`` greedy decode steps after that prefill; each figure is
    the mean of the repetitions' tok/s, as llama-bench's ``avg_ts``."""
    pre, dec = [], []
    for _ in range(reps):
        eng.reset()
        t0 = time.perf_counter()
        logits = eng.prefill(ids)
        pre.append(len(ids) / (time.perf_counter() - t0))
    for _ in range(reps):
        eng.reset()
        logits = eng.prefill(ids)
        t0 = time.perf_counter()
        for _ in range(decode_tokens):
            logits = eng.decode(int(np.argmax(logits)))
        dec.append(decode_tokens / (time.perf_counter() - t0))
    return {"prefill": {"tok_s": float(np.mean(pre)), "samples": pre, "tokens": len(ids)},
            "decode": {"tok_s": float(np.mean(dec)), "samples": dec, "tokens": decode_tokens}}


def limits(threads: int, weight_bytes_per_token: int) -> dict:
    """Read bandwidth and the decode kernel's compute limit at ``threads``, each as a decode tok/s ceiling."""
    from kestrel_lab.roofline import decode_ceiling, int8_dot_peak, memory_bandwidth

    bw = memory_bandwidth(threads=threads)
    peak = int8_dot_peak(threads=threads)
    ceil_bw = decode_ceiling(weight_bytes_per_token, bw["read_gbs"])
    ceil_cpu = decode_ceiling(weight_bytes_per_token, peak["weight_gbs"])
    return {"threads": threads, "read_gbs": bw["read_gbs"], "bandwidth_tok_s": ceil_bw,
            "kernel_gmacs": peak["gmacs"], "kernel_weight_gbs": peak["weight_gbs"], "kernel": peak["kernel"],
            "compute_tok_s": ceil_cpu, "binding": "bandwidth" if ceil_bw <= ceil_cpu else "compute",
            "ceiling_tok_s": min(ceil_bw, ceil_cpu)}


# ------------------------------------------------------------------------------ the whole run
def run(rounds: int = 3, threads=(1, 2), config=None, root=None, log=print) -> dict:
    """Build (or reuse) the two files, then ``rounds`` interleaved rounds at each thread count.

    Returns a JSON-ready dict: ``rows`` (one per test and thread count: both sides' medians, min–max,
    per-round values, the ratio with its bounds, decode's % of the binding limit), ``limits``,
    ``settings`` of both sides, the ``build``, the ``machine`` (CPU model, ISA flags, load average
    before and after) and the files. Raises ``PeerMissing`` without the peer.
    """
    info = require(root)
    if rounds < 1:
        raise ValueError(f"rounds = {rounds} must be ≥ 1")
    threads = sorted({int(t) for t in threads})
    load_before = procfs.load_average()
    t0 = time.perf_counter()
    ckpt = checkpoint(config)
    log(f"checkpoint: {ckpt} ({time.perf_counter() - t0:.0f} s)")
    vqf_path = vqf(ckpt)
    log(f"VQF: {vqf_path.name} ({vqf_path.stat().st_size / 1e6:.1f} MB)")
    gguf_path = gguf(ckpt, info, log=log)
    log(f"GGUF: {gguf_path.name} ({gguf_path.stat().st_size / 1e6:.1f} MB)")

    engines, ids = _warm_engines(vqf_path, threads)
    eng0 = engines[threads[0]]
    wbytes = eng0.weight_bytes_per_token
    lim = {}
    for t in threads:
        log(f"limits, {t} thread(s) …")
        lim[t] = limits(t, wbytes)
    per, peer_settings = _rounds(info, gguf_path, engines, ids, threads, rounds, log)
    return {
        "schema": SCHEMA, "peer": PEER, "rounds": rounds, "threads": threads, "rows": _rows(per, lim, threads),
        "limits": [lim[t] for t in threads], "weight_bytes_per_token": wbytes,
        "files": {"checkpoint": str(ckpt), "vqf": str(vqf_path), "vqf_bytes": vqf_path.stat().st_size,
                  "gguf": str(gguf_path), "gguf_bytes": gguf_path.stat().st_size},
        "settings": _settings(info, gguf_path, peer_settings[threads[0]], eng0),
        "build": {k: info.get(k) for k in ("sdist", "sdist_sha256", "cmake_flags", "compiler", "seconds", "built_at")},
        "machine": {"cpu": cpu_model(), "isa": isa_flags(), "cores": os.cpu_count(),
                    "load_before": load_before, "load_after": procfs.load_average()},
        "seconds": time.perf_counter() - t0,
    }


def _warm_engines(vqf_path: Path, threads: list[int]) -> tuple[dict, np.ndarray]:
    """One engine per thread count, each warmed up (kernels compiled or loaded, weights paged in), and
    the prompt's ids."""
    from kestrel_lab.bench.speed import prompt_ids
    from kestrel_lab.engine import Qwen3Engine

    engines = {t: Qwen3Engine.from_vqf(vqf_path, max_context=PROMPT_TOKENS + DECODE_TOKENS + 16, threads=t)
               for t in threads}
    ids = prompt_ids(engines[threads[0]].config.vocab_size, PROMPT_TOKENS)
    for eng in engines.values():          # warm-up: compile/load the kernels, page the weights in
        logits = eng.prefill(ids[:8])
        for _ in range(2):
            logits = eng.decode(int(np.argmax(logits)))
        eng.reset()
    return engines, ids


def _rounds(info: dict, gguf_path: Path, engines: dict, ids, threads: list[int], rounds: int,
            log) -> tuple[dict, dict]:
    """``rounds`` rounds at each thread count, the two sides in turn (which goes first alternates):
    every round's results by (side, threads), and llama-bench's settings by thread count."""
    per = {(side, t): [] for side in ("peer", "engine") for t in threads}
    peer_settings = {}
    for r in range(rounds):
        for i, t in enumerate(threads):
            order = ("peer", "engine") if (r + i) % 2 == 0 else ("engine", "peer")
            for side in order:
                if side == "peer":
                    res = llama_bench(info, gguf_path, t)
                    peer_settings[t] = res.pop("settings")
                else:
                    res = engine_round(engines[t], ids)
                per[(side, t)].append(res)
            pe, en = per[("peer", t)][-1], per[("engine", t)][-1]
            log(f"round {r + 1}/{rounds}, {t} thread(s): decode {pe['decode']['tok_s']:.1f} (llama.cpp) vs "
                f"{en['decode']['tok_s']:.1f} (engine); prefill {pe['prefill']['tok_s']:.1f} vs "
                f"{en['prefill']['tok_s']:.1f}")
    return per, peer_settings


def _rows(per: dict, lim: dict, threads: list[int]) -> list[dict]:
    """One row per test and thread count: both sides' summaries, the ratio with its bounds, and for
    decode each side's % of the binding limit."""
    rows = []
    for kind in ("decode", "prefill"):
        for t in threads:
            p = [x[kind]["tok_s"] for x in per[("peer", t)]]
            e = [x[kind]["tok_s"] for x in per[("engine", t)]]
            row = {"test": kind, "threads": t, "peer": summary(p), "engine": summary(e), **ratio_bounds(e, p)}
            if kind == "decode":
                c = lim[t]["ceiling_tok_s"]
                row["peer_pct_of_limit"] = 100 * row["peer"]["median"] / c
                row["engine_pct_of_limit"] = 100 * row["engine"]["median"] / c
            rows.append(row)
    return rows


def _settings(info: dict, gguf_path: Path, ps: dict, eng0) -> dict:
    """What each side ran: llama-bench's command line and settings (``ps``), the engine's calls,
    qtypes and kernels."""
    return {
        "peer": {"command": " ".join(Path(a).name if i == 0 else a for i, a in
                                     enumerate(llama_bench_cmd(info, gguf_path.name, "T"))),
                 **{k: v for k, v in ps.items() if k not in ("n_threads",)}},
        "engine": {"command": f"Qwen3Engine.from_vqf(…, threads=T); prefill {PROMPT_TOKENS} ids (last-token "
                              f"logits) ×{REPS}; {DECODE_TOKENS} greedy decode steps after it ×{REPS}",
                   "weight_qtypes": sorted(set(eng0.weight_qtypes.values())),
                   "kernels": eng0.kernel_paths(), "decode_context": f"positions {PROMPT_TOKENS}…"
                                                                      f"{PROMPT_TOKENS + DECODE_TOKENS - 1}",
                   "note": "llama-bench's -n test decodes from an empty context (positions 0…31); "
                           "the engine's from after the 64-token prompt"},
    }


def format_table(res: dict) -> str:
    """The printed comparison: one line per test and thread count, the limits, both sides' settings."""
    L = [f"kestrel-lab bench --peer {res['peer']}: {res['rounds']} interleaved rounds, medians (min–max); "
         f"same checkpoint, {res['weight_bytes_per_token'] / 1e6:.1f} MB of weights read per token",
         f"{'':22s}{'llama.cpp tok/s':>22s}{'Kestrel Lab tok/s':>22s}{'ratio (bounds)':>22s}{'% of limit':>16s}"]
    for r in res["rows"]:
        p, e = r["peer"], r["engine"]
        pct = (f"{r['peer_pct_of_limit']:.0f} / {r['engine_pct_of_limit']:.0f} %" if "peer_pct_of_limit" in r else "")
        label = (f"{r['test']} {'64' if r['test'] == 'prefill' else '32'}, "
                 f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}")
        L.append(f"{label:22s}{p['median']:>9.1f} ({p['min']:.1f}–{p['max']:.1f})".ljust(44)
                 + f"{e['median']:>9.1f} ({e['min']:.1f}–{e['max']:.1f})".ljust(22)
                 + f"{r['ratio']:>8.2f}× ({r['low']:.2f}–{r['high']:.2f})".ljust(22) + f"{pct:>14s}")
    L.append("decode limits (tok/s ceilings for the bytes one token reads):")
    for lim in res["limits"]:
        L.append(f"  {lim['threads']} thread(s): read {lim['read_gbs']:.1f} GB/s → {lim['bandwidth_tok_s']:.1f} tok/s; "
                 f"kernel {lim['kernel_gmacs']:.0f} GMAC/s on L1 data ({lim['kernel_weight_gbs']:.0f} GB/s of Q4_0) → "
                 f"{lim['compute_tok_s']:.1f} tok/s; {lim['binding']} binds")
    m = res["machine"]
    L.append(f"CPU: {m['cpu']} ({m['cores']} CPUs); "
             + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in m["isa"].items()))
    ps, es, b = res["settings"]["peer"], res["settings"]["engine"], res["build"]
    L.append(f"llama.cpp: {ps['command']}; model {ps.get('model_type')} {ps.get('model_size', 0) / 1e6:.1f} MB; "
             f"n_batch {ps.get('n_batch')}, n_ubatch {ps.get('n_ubatch')}, flash_attn {ps.get('flash_attn')}, "
             f"KV {ps.get('type_k')}/{ps.get('type_v')}, mmap {ps.get('use_mmap')}; build {ps.get('build_commit')}")
    L.append(f"  built from {b['sdist']} (sha256 {str(b['sdist_sha256'])[:12]}…) "
             f"with {' '.join(b['cmake_flags'] or [])}; {b['compiler']}; {b['seconds']} s")
    kp = es["kernels"]
    mats = "; ".join(f"{lay}: matvec {k['one']}, matmul {k['many']}" for lay, k in (kp.get("matrices") or {}).items())
    L.append(f"Kestrel Lab: {es['command']}; weights {', '.join(es['weight_qtypes'])} "
             f"(split into {kp.get('q4_layout')} at load); {mats}; decode step {kp.get('decode_step')}")
    L.append(f"  note: {es['note']}")
    f = res["files"]
    L.append(f"files: GGUF {f['gguf_bytes'] / 1e6:.1f} MB, VQF {f['vqf_bytes'] / 1e6:.1f} MB "
             f"(checkpoint {Path(f['checkpoint']).name})")
    L.append("load average (1/5/15 min) before: " + _loads(m["load_before"]) + "; after: " + _loads(m["load_after"]))
    return "\n".join(L)


def _loads(load: "list[float] | tuple[float, ...] | None") -> str:
    """A 1/5/15-minute load average as printed, or "unknown" where the OS keeps none."""
    return " / ".join(f"{v:.2f}" for v in load) if load else "unknown"


# ------------------------------------------------------------------------------ make peers: smoke and choose
def smoke(build_json: "str | os.PathLike", log=print) -> str:
    """Run a candidate build's llama-bench once on the bench's own Q4_0 model (8-token prompt, 4 decode steps,
    1 thread): "ran: …" when it works; raises ``RuntimeError`` naming the signal when the process dies."""
    build_json = Path(build_json)
    info = _build_info(build_json, build_json.parent)
    if info is None:
        raise RuntimeError(f"{build_json}: no build there (BUILD file or binaries missing)")
    g = gguf(checkpoint(), info, log=log)
    p = subprocess.run(llama_bench_cmd(info, g, 1, prompt=8, gen=4, reps=1), capture_output=True, text=True)
    if p.returncode < 0:
        raise RuntimeError(f"llama-bench died of {signal.Signals(-p.returncode).name}")
    if p.returncode:
        raise RuntimeError(f"llama-bench failed ({p.returncode}): {(p.stderr or p.stdout)[-300:]}")
    r = parse_llama_bench(p.stdout)
    return f"ran: decode {r['decode']['tok_s']:.1f} tok/s, prefill {r['prefill']['tok_s']:.1f} tok/s (1 thread, smoke)"


def choose(build_json: "str | os.PathLike", out: "str | os.PathLike", tried: list[str]) -> None:
    """Make the candidate ``build_json`` the peer (``out``, the BUILD.json ``find`` reads), recording every build
    tried and what its smoke run said."""
    from kestrel_lab.atomic import write_json

    info = json.loads(Path(build_json).read_text(encoding="utf-8"))
    info["chosen"] = {"build_kind": info.get("build_kind"), "tried": list(tried),
                      "rule": "the native build when it runs, else explicit ISA flags from the host without AMX"}
    write_json(Path(out), info)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["smoke"] and len(argv) == 2:
        try:
            print(smoke(argv[1], log=lambda m: print(m, file=sys.stderr)))
        except RuntimeError as e:
            print(str(e))
            return 3
        return 0
    if argv[:1] == ["choose"] and len(argv) >= 3:
        choose(argv[1], argv[2], argv[3:])
        return 0
    print("usage: python -m kestrel_lab.bench.peer smoke BUILD.json | choose BUILD.json OUT.json [TRIED …]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
