"""``kestrel-lab bench``: how fast the engine decodes and prefills, against the machine's ceiling and PyTorch.

Everything is measured in one run on the same machine, because every figure only means something
next to the others:

- the engine's decode tok/s (after a 64-token prompt) and prefill tok/s, at 1 thread and at all
  threads, on a model with real shapes (default ``data/configs/qwen3-0.6b.config.json``) and
  deterministic random weights (``kestrel_lab.models.vqf``: written straight into a VQF with the
  writer once, cached by content under ``kestrel_lab.paths.cache_dir()``; never committed);
- the memory read bandwidth (``roofline.memory_bandwidth``), the weight bytes one decode step reads
  and hence the bandwidth ceiling in tok/s (``roofline.decode_ceiling``), and the engine's % of it;
- one decode step by parts (``bench.profile``): each part's time, bytes and GB/s against the bandwidth;
- the matvec kernels' GB/s of weights on one FFN-shaped matrix: the naive block-by-block Q4_0 loop,
  the lane-accumulator Q4_0 and Q8_0 kernels, the Q4_8X8L kernel and every row-grouped Q4_0 variant
  of ``kernels.variants`` this host can run — the layout story in numbers;
- PyTorch (``transformers``, fp32 and bf16) decode tok/s on the same weights (dequantized from the
  file) when torch is installed; without it (a board) the bench skips them and says why;
- numba's first compile (a fresh process with an empty ``NUMBA_CACHE_DIR``) and the cached cold
  start (a fresh process, cache warm, file in the page cache: from process start to the first token,
  ``python -m kestrel_lab.bench.coldstart``).

``--json`` prints the result as JSON. The figures of day29_1 are recorded by that notebook alone
(``bench --record RUNNER`` runs it through ``kestrel-lab rerun``); ``bench.peer`` adds llama.cpp.
Taught in day07_3, day23_1, day24_2 and day29_1.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from kestrel_lab import models, procfs
from kestrel_lab import quant as Q
from kestrel_lab.paths import child_env, configs_dir

DEFAULT_CONFIG = models.BENCH_CONFIG
PROMPT_TOKENS = 64
DECODE_TOKENS = 32


# ------------------------------------------------------------------------------ measurements
def prompt_ids(vocab: int, n: int = PROMPT_TOKENS, seed: int = 1) -> list[int]:
    """A deterministic prompt of ``n`` random ids. Taught in day29_1."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, min(vocab, 150_000), n)]

def engine_speed(path, threads: int, prompt_len: int = PROMPT_TOKENS, decode_tokens: int = DECODE_TOKENS,
                 repack: bool = False, interleave: bool = True, key_file=None) -> dict:
    """Prefill tok/s of a ``prompt_len`` prompt and decode tok/s over ``decode_tokens`` greedy steps.

    A short warm-up first (it also pages the mapped weights in). ``repack``: run plain Q4_0 weights
    from a Q4_8X8L copy; ``interleave=False``: run them in the file's layout (see ``Qwen3Engine``).
    Taught in day23_2.
    """
    from kestrel_lab.engine import Qwen3Engine

    t0 = time.perf_counter()
    eng = Qwen3Engine.from_vqf(path, max_context=prompt_len + decode_tokens + 16, threads=threads, repack=repack,
                               interleave=interleave, key_file=key_file)
    load_s = time.perf_counter() - t0
    ids = prompt_ids(eng.config.vocab_size, prompt_len)
    logits = eng.prefill(ids[:8])
    for _ in range(2):
        logits = eng.decode(int(np.argmax(logits)))
    eng.reset()
    t0 = time.perf_counter()
    logits = eng.prefill(ids)
    prefill_s = time.perf_counter() - t0
    steps = []
    for _ in range(decode_tokens):
        t0 = time.perf_counter()
        logits = eng.decode(int(np.argmax(logits)))
        steps.append(time.perf_counter() - t0)
    return {"threads": threads, "prefill_tok_s": prompt_len / prefill_s, "decode_tok_s": decode_tokens / sum(steps),
            "decode_ms_median": 1e3 * float(np.median(steps)), "load_s": load_s,
            "repack_s": eng.repack_seconds, "weight_bytes_per_token": eng.weight_bytes_per_token,
            "weight_qtypes": sorted(set(eng.weight_qtypes.values())), "kernels": eng.kernel_paths()}

def _random_blocks(rng, rows: int, nb: int, block_bytes: int) -> np.ndarray:
    """Random block bytes with a sane fp16 scale (0.01) first: speed does not depend on the values."""
    b = rng.integers(0, 256, size=(rows, nb, block_bytes), dtype=np.uint8)
    b[..., :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return b.reshape(rows, nb * block_bytes)

def kernel_speeds(threads: int, rows: int = 98_304, cols: int = 1024, repeat: int = 5) -> dict:
    """GB/s of weights of each matvec kernel on one rows × cols matrix: the plain layouts' kernels, and
    every row-grouped variant of ``kernels.variants`` this host can run (labelled by the variant's name).

    The default (98,304 × 1,024: 57 MB at Q4_0, 107 MB at Q8_0) is larger than the last-level cache,
    so the figures are DRAM figures, comparable with the read bandwidth. Taught in day07_3.
    """
    from kestrel_lab.kernels import ops as K
    from kestrel_lab.kernels import variants
    from kestrel_lab.kernels.host import host_features
    from kestrel_lab.threads import numba_threads

    rng = np.random.default_rng(0)
    nb = cols // K.QK
    x = rng.standard_normal((1, cols), dtype=np.float32)
    xq = np.empty((1, cols), np.int8)
    xd = np.empty((1, nb), np.float32)
    K.quantize_act(x, xq, xd)
    xe = np.empty((1, nb, 5, 64), np.int16)
    K.expand_act_8x8(xq, xe)
    xc = np.empty((1, nb), np.int16)
    K.act_block_sums(xq, xc)
    q4 = _random_blocks(rng, rows, nb, 18)
    q8 = _random_blocks(rng, rows, nb, 34)
    q48 = np.empty(q4.size, np.uint8)
    K.repack_q4_0_to_8x8l(q4, q48, K.n_chunks(rows // 8))
    planes = {}
    for v in variants.supported(host_features()):
        if v.planes and v.layout not in planes:       # one copy per layout; its variants share it
            G = v.rows_per_group
            nib, sc = np.empty((rows // G, nb * 16 * G), np.uint8), np.empty((rows // G, nb * G), np.uint16)
            v.repack(q4, nib, sc, K.n_chunks(rows // G))
            planes[v.layout] = (nib, sc)
    for a in (q4, q8, q48, *(a for p in planes.values() for a in p)):
        a.setflags(write=False)
    out = np.empty(rows, np.float32)
    lut = K.F16_TO_F32
    res = {}
    with numba_threads(threads):
        nch = K.n_chunks(rows)
        cases = {
            "q4_0 naive (block by block)": (q4.nbytes, lambda: K.matvec_q4_0_naive(q4, xq, xd, lut, out, nch)),
            "q4_0 lanes": (q4.nbytes, lambda: K.matvec_q4_0(q4, xq, xd, lut, out, nch)),
            "q8_0 lanes": (q8.nbytes, lambda: K.matvec_q8_0(q8, q8.view(np.int8), xq, xd, lut, out, nch)),
            "q4_8x8l": (q48.nbytes, lambda: K.matvec_q4_8x8l(q48, xe, xd, lut, out, K.n_chunks(rows // 8))),
        }
        for v in variants.supported(host_features()):   # every row-grouped variant this host runs
            if v.planes:
                nib, sc = planes[v.layout]
                cases[f"q4_0 {v.name} ({v.rows_per_group} rows, {v.instruction})"] = (
                    nib.nbytes + sc.nbytes,
                    lambda v=v, nib=nib, sc=sc: v.matvec(nib, sc, xq, xc, xd, out,
                                                         K.n_chunks(rows // v.rows_per_group)))
        for name, (nbytes, fn) in cases.items():
            fn()
            best = min(_timed(fn) for _ in range(repeat))
            res[name] = nbytes / best / 1e9
    return res


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0

def torch_speed(path, dtype: str, threads: int, prompt_len: int = PROMPT_TOKENS, decode_tokens: int = 16) -> dict:
    """transformers' Qwen3ForCausalLM decode tok/s on the file's weights (dequantized), fp32 or bf16.

    Taught in day29_1.
    """
    import torch
    import transformers

    from kestrel_lab.vqf.reader import open_vqf

    torch.set_num_threads(threads)
    f = open_vqf(path)
    c = f.config
    if not c.attention.qk_norm or c.attention.qkv_bias:
        raise ValueError(f"{path}: the PyTorch comparison rebuilds a Qwen3ForCausalLM; this file is {c.arch} "
                         f"(config.ATTENTION_TRAITS differ)")
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    hf = transformers.Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings)
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(hf)
    L = c.num_hidden_layers
    per = {"q4_q": ("self_attn.q_proj", c.q_dim), "q4_k": ("self_attn.k_proj", c.kv_dim),
           "q4_v": ("self_attn.v_proj", c.kv_dim), "q4_o": ("self_attn.o_proj", c.hidden_size),
           "q4_gate": ("mlp.gate_proj", c.intermediate_size), "q4_up": ("mlp.up_proj", c.intermediate_size),
           "q4_down": ("mlp.down_proj", c.hidden_size)}
    sd = {}

    def t(a):
        return torch.from_numpy(np.array(a, dtype=np.float32)).to(tdt)

    emb = f.tensors["token_embed"]
    sd["model.embed_tokens.weight"] = t(emb.dequantize())
    sd["model.norm.weight"] = t(f.tensors["final_norm"].array()[0])
    for name, (hfname, rows) in per.items():
        ten = f.tensors[name]
        bpr = ten.nbytes // ten.rows
        for layer in range(L):
            raw = ten.data[layer * rows * bpr:(layer + 1) * rows * bpr]
            sd[f"model.layers.{layer}.{hfname}.weight"] = t(Q.dequantize(raw, ten.qtype, rows, ten.cols))
    for vqf_name, hfname in (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"),
                             ("q_norm", "self_attn.q_norm"), ("k_norm", "self_attn.k_norm")):
        arr = f.tensors[vqf_name].array()
        for layer in range(L):
            sd[f"model.layers.{layer}.{hfname}.weight"] = t(arr[layer])
    if not c.tie_word_embeddings:
        sd["lm_head.weight"] = t(f.tensors["q4_lm"].dequantize())
    model.load_state_dict(sd, strict=False, assign=True)
    if c.tie_word_embeddings:
        model.tie_weights()
    # Buffers made on the meta device (RoPE's inv_freq) are not in the state dict: rebuild that module.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=hf)
    model.eval()
    del sd
    ids = torch.tensor([prompt_ids(c.vocab_size, prompt_len)])
    def step(inp, cache):
        out = model(inp, cache=cache, use_cache=True) if cache is not None else model(inp, use_cache=True)
        return out["cache"], out["logits"][:, -1:].argmax(-1)

    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cache, tok = step(ids, None)
        for _ in range(2):     # warm-up steps
            cache, tok = step(tok, cache)
        t0 = time.perf_counter()
        for _ in range(decode_tokens):
            cache, tok = step(tok, cache)
        dt = time.perf_counter() - t0
    f.close()
    return {"dtype": dtype, "threads": threads, "decode_tok_s": decode_tokens / dt}


def cold_start(path, numba_cache: str | None = None) -> dict:
    """A fresh Python process: start → import → load → first token (8-token prefill) → one decode step.

    Times are wall-clock (``time.time``) so the parent can include the interpreter's own start-up.
    ``numba_cache``: a folder for ``NUMBA_CACHE_DIR`` (an empty one measures the first compile).
    Taught in day24_2.
    """
    env = child_env()
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = numba_cache
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "kestrel_lab.bench.coldstart", str(path)], env=env,
                       capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"cold-start child failed:\n{p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"to_first_token_s": r["t_first"] - t0, "interpreter_s": r["t_start"] - t0,
            "import_s": r["t_import"] - r["t_start"], "load_s": r["t_load"] - r["t_import"],
            "prefill_s": r["t_first"] - r["t_load"], "first_decode_s": r["t_decode"] - r["t_first"],
            "to_first_decode_s": r["t_decode"] - t0}


# ------------------------------------------------------------------------------ the whole run
def run(config_path=None, quant: str = "q4_0", threads: list[int] | None = None, with_torch: bool = True,
        decode_tokens: int = DECODE_TOKENS, log=print, key_file=None) -> dict:
    """All the figures of one bench run, as a dict (what ``--json`` prints). ``key_file``: also run the
    engine on an SM4-encrypted copy of the model (``vqf.encrypt``; load time includes the tag check
    and the decryption). Taught in day29_1."""
    from kestrel_lab.roofline import decode_ceiling, memory_bandwidth
    from kestrel_lab.threads import resolve_threads

    from kestrel_lab.vqf.layout import resolve_quant

    qt = resolve_quant(quant)               # the quant name is read here, once
    all_t = resolve_threads(None)
    threads = sorted(set(threads or [1, all_t]))
    t0 = time.perf_counter()
    path = models.vqf(config=Path(config_path) if config_path else configs_dir() / DEFAULT_CONFIG, quant=qt)
    log(f"model: {path} ({path.stat().st_size / 1e6:.1f} MB, ready in {time.perf_counter() - t0:.1f} s)")
    res = {"vqf": str(path), "quant": qt.name.lower(), "threads": threads, "engine": {}, "bandwidth": {},
           "ceiling_tok_s": {}, "pct_of_ceiling": {}, "kernels_gbs": {}, "torch": {}}
    from kestrel_lab.kernels import choice

    res["kernel_choice"] = choice.current().report()     # which Q4_0 variant this host decodes with, and why
    log("compile: fresh process, empty numba cache …")
    with tempfile.TemporaryDirectory(prefix="kestrel-numba-") as tmp:
        res["first_compile"] = cold_start(path, numba_cache=tmp)
    res["cold_start"] = cold_start(path)
    for t in threads:
        log(f"engine, {t} thread(s) …")
        e = engine_speed(path, t, decode_tokens=decode_tokens)
        res["engine"][t] = e
        bw = memory_bandwidth(threads=t)
        res["bandwidth"][t] = bw["read_gbs"]
        ceil = decode_ceiling(e["weight_bytes_per_token"], bw["read_gbs"])
        res["ceiling_tok_s"][t] = ceil
        res["pct_of_ceiling"][t] = 100.0 * e["decode_tok_s"] / ceil
        res["kernels_gbs"][t] = kernel_speeds(t)
        if qt is Q.Q4_0:
            from kestrel_lab.bench.profile import profile_file

            log(f"decode step by parts, {t} thread(s) …")
            res.setdefault("parts", {})[t] = profile_file(path, t)
        if qt is Q.Q4_0:
            log(f"engine on the file's plain Q4_0 layout, {t} thread(s) …")
            res.setdefault("engine_plain", {})[t] = engine_speed(path, t, decode_tokens=decode_tokens, interleave=False)
            log(f"engine on a Q4_8X8L copy, {t} thread(s) …")
            res.setdefault("engine_repacked", {})[t] = engine_speed(path, t, decode_tokens=decode_tokens, repack=True)
    res["weight_bytes_per_token"] = res["engine"][threads[-1]]["weight_bytes_per_token"]
    if key_file:
        from kestrel_lab.vqf.encrypt import encrypt_file

        enc = path.with_name(path.stem + ".enc.vqf")
        log(f"encrypting the model with {key_file} → {enc} …")
        res["encrypt"] = encrypt_file(path, enc, key_file)
        log(f"engine on the encrypted file, {threads[-1]} thread(s) …")
        res["engine_encrypted"] = engine_speed(enc, threads[-1], decode_tokens=decode_tokens, key_file=key_file)
    if not with_torch:
        res["torch"] = {"skipped": "--no-torch"}
    else:
        try:
            import torch  # noqa: F401  (imported only to see whether it is installed)
            import transformers  # noqa: F401  (imported only to see whether it is installed)
        except ImportError as e:
            res["torch"] = {"skipped": f"{e.name or 'torch'} is not installed (a board needs neither torch nor "
                                       f"transformers; `make ref-env` installs them)"}
            log(f"PyTorch: skipped, {res['torch']['skipped']}")
        else:
            for dt in ("fp32", "bf16"):
                log(f"PyTorch {dt}, {threads[-1]} thread(s) …")
                res["torch"][dt] = torch_speed(path, dt, threads[-1])["decode_tok_s"]
    res["load_avg"] = procfs.load_average()
    return res

def format_table(res: dict) -> str:
    """The printed report: one line per figure, ratios where they say something. Taught in day29_1."""
    lines = [f"kestrel-lab bench — {Path(res['vqf']).name} ({res['quant']}), weights read per token "
             f"{res['weight_bytes_per_token'] / 1e6:.1f} MB"]
    hdr = f"{'':42s}" + "".join(f"{f'{t} thread' + ('s' if t > 1 else ''):>14s}" for t in res["threads"])
    lines.append(hdr)

    def row(label, vals, fmt):
        lines.append(f"{label:42s}" + "".join(f"{fmt.format(v):>14s}" for v in vals))

    ts = res["threads"]
    row("decode tok/s", [res["engine"][t]["decode_tok_s"] for t in ts], "{:.1f}")
    row("prefill tok/s (64-token prompt)", [res["engine"][t]["prefill_tok_s"] for t in ts], "{:.1f}")
    if res.get("engine_plain"):
        pl = res["engine_plain"]
        row("decode tok/s, file layout (16-lane kernel)", [pl[t]["decode_tok_s"] for t in ts], "{:.1f}")
        row("prefill tok/s, file layout", [pl[t]["prefill_tok_s"] for t in ts], "{:.1f}")
    if res.get("engine_repacked"):
        rp = res["engine_repacked"]
        row("decode tok/s, Q4_8X8L copy", [rp[t]["decode_tok_s"] for t in ts], "{:.1f}")
        row("prefill tok/s, Q4_8X8L copy", [rp[t]["prefill_tok_s"] for t in ts], "{:.1f}")
    row("memory read GB/s", [res["bandwidth"][t] for t in ts], "{:.1f}")
    row("bandwidth ceiling tok/s", [res["ceiling_tok_s"][t] for t in ts], "{:.1f}")
    row("decode % of ceiling", [res["pct_of_ceiling"][t] for t in ts], "{:.0f} %")
    for k in res["kernels_gbs"][ts[0]]:
        row(f"matvec GB/s: {k}", [res["kernels_gbs"][t][k] for t in ts], "{:.2f}")
    if res.get("parts"):
        from kestrel_lab.bench.profile import format_parts

        for t in ts:
            lines.append(format_parts(res["parts"][t], res["bandwidth"][t]))
    e = res["engine"][ts[-1]]
    rp = (res.get("engine_repacked") or {}).get(ts[-1])
    lines.append(f"load {e['load_s']:.2f} s; weights {', '.join(e['weight_qtypes'])}"
                 + (f" (split into {e['kernels'].get('q4_layout') or 'planes'} at load: {e['repack_s']:.2f} s)"
                    if e["repack_s"] else "")
                 + (f"; the Q4_8X8L copy costs {rp['repack_s']:.2f} s at load" if rp else ""))
    ee = res.get("engine_encrypted")
    if ee:
        en = res["encrypt"]
        lines.append(f"encrypted copy ({en['data_bytes'] / en['seconds'] / 1e6:.0f} MB/s to encrypt): load "
                     f"{ee['load_s']:.2f} s vs {e['load_s']:.2f} s plain ({ee['load_s'] / e['load_s']:.1f}×), "
                     f"decode {ee['decode_tok_s']:.1f} tok/s vs {e['decode_tok_s']:.1f}")
    tr = res.get("torch") or {}
    if "skipped" in tr:
        lines.append(f"PyTorch: skipped, {tr['skipped']}")
    for dt in ("fp32", "bf16"):
        if dt in tr:
            lines.append(f"PyTorch {dt} decode ({ts[-1]} threads): {tr[dt]:.2f} tok/s → engine is "
                         f"{e['decode_tok_s'] / tr[dt]:.1f}× faster")
    fc, cs = res["first_compile"], res["cold_start"]
    lines.append(f"first compile (empty numba cache): start → first token {fc['to_first_token_s']:.1f} s, "
                 f"→ first decode step {fc['to_first_decode_s']:.1f} s")
    lines.append(f"cached cold start: start → first token {cs['to_first_token_s']:.2f} s (interpreter "
                 f"{cs['interpreter_s']:.2f}, import {cs['import_s']:.2f}, load {cs['load_s']:.2f}, "
                 f"8-token prefill {cs['prefill_s']:.2f})")
    if res.get("load_avg"):
        lines.append("machine load average (1/5/15 min) at the end: " + " / ".join(f"{v:.2f}" for v in res["load_avg"]))
    if res.get("kernel_choice"):
        lines.append(res["kernel_choice"])
    return "\n".join(lines)
