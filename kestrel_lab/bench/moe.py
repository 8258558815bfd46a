"""``kestrel-lab bench --config <Qwen3-MoE>``: what a token of a Qwen3-MoE model costs, and a file larger than memory.

- ``moe_run``: decode tok/s against the read bandwidth and the ceiling for the bytes a token reads, the
  weight bytes per token counted by the engine (router rows and expert runs it touched) beside the
  computed figure, a cold vs a warm first token with what the OS paged in, the distinct experts per layer
  a 256-token prompt chooses, the resident set after the decode;
- ``memory_limit_run``: the same file decoded in a fresh child inside a memory cgroup (unlimited, the
  OS's read-ahead, exact expert paging), ``python -m kestrel_lab.bench.moe paging-child`` being the child;
- ``dense_twin``: a dense model with the same layers decoded beside it.

Taught in day22_2 and day22_3.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from kestrel_lab import models
from kestrel_lab.bench.speed import DECODE_TOKENS, engine_speed, prompt_ids
from kestrel_lab.paths import child_env
from kestrel_lab.procfs import io_read_bytes, load_average, rss_parts, status_bytes

MOE_PROMPT_TOKENS = 256   # the prompt whose distinct experts per layer are counted

def decode_steps(eng, logits, n: int):
    """``n`` greedy decode steps from ``logits``: (the last logits, the seconds of each step)."""
    steps = []
    for _ in range(n):
        t1 = time.perf_counter()
        logits = eng.decode(int(np.argmax(logits)))
        steps.append(time.perf_counter() - t1)
    return logits, steps

def moe_counted_bytes(eng, bytes_touched: int, tokens: int) -> float:
    """Weight bytes per token by the engine's own count: every non-expert matrix whole (its
    ``weight_bytes_per_token`` less the routers and k experts it assumes) plus the router and expert runs
    the MoE layers report having touched over ``tokens`` tokens."""
    dense = eng.weight_bytes_per_token - sum(ml.router.nbytes + ml.top_k * ml.experts.expert_bytes
                                             for ml in eng.moe_layers.values())
    return dense + bytes_touched / tokens

def load_avg_line(res: dict) -> list[str]:
    """The report's last line: the machine's load average at the end of the run (none where unknown)."""
    if not res.get("load_avg"):
        return []
    return ["machine load average (1/5/15 min) at the end: " + " / ".join(f"{v:.2f}" for v in res["load_avg"])]

def moe_first_tokens(path, threads: int, prompt_len: int = 8, cold: bool = True, expert_paging: str = "os") -> dict:
    """Load the engine and produce the first token after a ``prompt_len`` prompt, then one decode step;
    ``cold``: drop the file from the page cache first (``models.evict``). Counts what the OS paged in:
    page-cache bytes of the file before/after (``models.resident_bytes``, mincore) and this process's
    ``/proc/self/io`` read_bytes. Taught in day22_3."""
    from kestrel_lab.engine import Qwen3Engine

    evicted = models.evict(path) if cold else False
    res0, io0 = models.resident_bytes(path), io_read_bytes()
    t0 = time.perf_counter()
    eng = Qwen3Engine.from_vqf(path, max_context=prompt_len + 8, threads=threads, expert_paging=expert_paging)
    t1 = time.perf_counter()
    logits = eng.prefill(prompt_ids(eng.config.vocab_size, prompt_len))
    t2 = time.perf_counter()
    eng.decode(int(np.argmax(logits)))
    t3 = time.perf_counter()
    res1, io1 = models.resident_bytes(path), io_read_bytes()
    return {"cold": cold, "evicted": evicted, "expert_paging": expert_paging, "load_s": t1 - t0,
            "first_token_s": t2 - t0, "first_decode_s": t3 - t2,
            "paged_in_bytes": None if res0 is None or res1 is None else res1 - res0,
            "io_read_bytes": None if io0 is None or io1 is None else io1 - io0,
            "resident_after_bytes": res1, "file_bytes": os.path.getsize(path),
            "engine_bytes_touched": eng.moe_report()["bytes_touched"]}

def moe_run(config_path, layers: int | None = None, quant: str = "q4_0", threads: list[int] | None = None,
            decode_tokens: int = DECODE_TOKENS, log=print, memory_limit=None, dense_twin_config=None,
            rounds: int = 1) -> dict:
    """The MoE bench on random weights with ``config_path``'s shapes, cut to ``layers`` layers.

    Free disk is checked against the planned file size first. Figures: decode tok/s per thread count
    against the read bandwidth and the ceiling for the bytes a token reads; weight bytes per token
    counted by the engine (the router rows and expert runs it touched, plus the dense matrices) beside
    the computed figure; cold (page cache dropped) vs warm first token, with what the OS paged in;
    distinct experts per layer chosen by a 256-token prompt; the resident set after the decode.
    With ``layers`` the per-layer figures are what scales to the whole model (``per_layer``).
    ``memory_limit`` (bytes or "1G"): first, before this process maps the file, the same file under a
    memory cgroup of that size (``memory_limit_run``, at the smallest thread count, ``rounds`` rounds;
    ``memory_limit``). ``dense_twin_config``: a dense config (e.g. ``DENSE_TWIN_CONFIG``) cut to the
    same layers and decoded beside the MoE (``dense_twin``).
    """
    from kestrel_lab.engine.moe import active_bytes
    from kestrel_lab.threads import resolve_threads
    from kestrel_lab.vqf.layout import resolve_quant

    qt = resolve_quant(quant)
    full, cfg = _moe_configs(config_path, layers)
    path = _moe_file(config_path, layers, full, cfg, qt, log)
    threads = sorted(set(threads or [1, resolve_threads(None)]))
    memory_res = None
    if memory_limit is not None:
        memory_res = memory_limit_run(path, memory_limit, threads=threads[0], decode_tokens=decode_tokens,
                                      rounds=rounds, log=log)
    dense_path = None if dense_twin_config is None else _dense_twin_file(dense_twin_config, cfg, qt, log)
    ab = active_bytes(cfg, qt)
    res = {"vqf": str(path), "config": str(config_path), "quant": qt.name.lower(), "layers": cfg.num_hidden_layers,
           "layers_full": full.num_hidden_layers, "threads": threads, "computed_bytes_per_token": ab["total"],
           "computed_parts": ab, "full_model_computed": active_bytes(full, qt), "engine": {}, "bandwidth": {},
           "ceiling_tok_s": {}}
    log("cold first token (page cache dropped) …")
    res["cold"] = moe_first_tokens(path, threads[-1], cold=True)
    res["cold_exact"] = moe_first_tokens(path, threads[-1], cold=True, expert_paging="exact")
    res["warm"] = moe_first_tokens(path, threads[-1], cold=False)
    for t in threads:
        log(f"engine, {t} thread(s) …")
        res["engine"][t], res["bandwidth"][t], res["ceiling_tok_s"][t] = _engine_decode(path, cfg, t, decode_tokens)
    e = res["engine"][threads[-1]]
    L, Lf = cfg.num_hidden_layers, full.num_hidden_layers
    per_layer = {k: ab[k] / L for k in ("attention", "router", "experts")}
    res["per_layer"] = per_layer
    res["full_model_estimate_bytes_per_token"] = (sum(per_layer.values()) * Lf + ab["lm_head"] + ab["embedding_row"]
                                                  + ab["norms"] / L * Lf)
    res["experts_in_place_bytes"] = e["memory"].get("experts_in_place_bytes")
    if memory_res is not None:
        res["memory_limit"] = memory_res
    if dense_path is not None:
        res["dense_twin"] = dense_twin(path, dense_path, threads, decode_tokens=decode_tokens, rounds=rounds, log=log)
    res["load_avg"] = load_average()
    return res

def _moe_configs(config_path, layers: int | None):
    """(the whole model's config, the config cut to ``layers`` layers) of a Qwen3-MoE ``config_path``."""
    from kestrel_lab.config import ModelConfig

    full = ModelConfig.from_hf(config_path)
    if full.arch != "qwen3_moe":
        raise ValueError(f"{config_path}: model_type is {full.arch!r}; the MoE bench needs a qwen3_moe config")
    cfg = full if layers is None else dataclasses.replace(full, num_hidden_layers=layers)
    if layers is not None and not 1 <= layers <= full.num_hidden_layers:
        raise ValueError(f"--layers {layers}: the config has {full.num_hidden_layers} layers")
    return full, cfg

def _moe_file(config_path, layers: int | None, full, cfg, qt, log) -> Path:
    """The random-weight VQF file of ``cfg`` (built into the cache unless there), once the free disk is
    known to hold it."""
    import shutil

    from kestrel_lab.vqf.planner import plan_file

    size = plan_file(cfg, qt).file_size
    cache = models._cache()
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    log(f"planned file {size / 1e9:.2f} GB ({cfg.num_hidden_layers} of {full.num_hidden_layers} layers); "
        f"free disk at {cache}: {free / 1e9:.1f} GB")
    if size > 0.9 * free:
        raise OSError(f"{cache}: {free / 1e9:.1f} GB free, the file needs {size / 1e9:.1f} GB: "
                      "pass a smaller --layers")
    t0 = time.perf_counter()
    path = models.vqf(config=Path(config_path), layers=layers, quant=qt)
    log(f"model: {path} ({path.stat().st_size / 1e9:.2f} GB, ready in {time.perf_counter() - t0:.1f} s)")
    return path

def _dense_twin_file(dense_twin_config, cfg, qt, log) -> Path:
    """The dense twin's VQF file: ``dense_twin_config`` (a qwen3 config) cut to ``cfg``'s layers."""
    import shutil

    from kestrel_lab.config import ModelConfig
    from kestrel_lab.vqf.planner import plan_file

    dfull = ModelConfig.from_hf(dense_twin_config)
    if dfull.arch != "qwen3":
        raise ValueError(f"{dense_twin_config}: model_type is {dfull.arch!r}; the dense twin needs a qwen3 config")
    if cfg.num_hidden_layers > dfull.num_hidden_layers:
        raise ValueError(f"--dense-twin: {dense_twin_config} has {dfull.num_hidden_layers} layers, fewer than "
                         f"the {cfg.num_hidden_layers} asked for")
    dl = None if cfg.num_hidden_layers == dfull.num_hidden_layers else cfg.num_hidden_layers
    dsize = plan_file(dataclasses.replace(dfull, num_hidden_layers=cfg.num_hidden_layers), qt).file_size
    cache = models._cache()
    if dsize > 0.9 * shutil.disk_usage(cache).free:
        raise OSError(f"{cache}: the dense twin needs {dsize / 1e9:.1f} GB: pass a smaller --layers")
    t0 = time.perf_counter()
    dense_path = models.vqf(config=Path(dense_twin_config), layers=dl, quant=qt)
    log(f"dense twin: {dense_path} ({dense_path.stat().st_size / 1e9:.2f} GB, "
        f"ready in {time.perf_counter() - t0:.1f} s)")
    return dense_path

def _engine_decode(path, cfg, threads: int, decode_tokens: int) -> tuple[dict, float, float]:
    """One engine at ``threads`` threads: a 256-token prefill, then ``decode_tokens`` decode steps.
    Returns its figures, the read bandwidth at that thread count, and the decode ceiling for the weight
    bytes per token the engine counted."""
    from kestrel_lab.engine import Qwen3Engine
    from kestrel_lab.roofline import decode_ceiling, memory_bandwidth

    eng = Qwen3Engine.from_vqf(path, max_context=MOE_PROMPT_TOKENS + decode_tokens + 8, threads=threads)
    ids = prompt_ids(cfg.vocab_size, MOE_PROMPT_TOKENS)
    eng.reset_moe_counters()
    t1 = time.perf_counter()
    logits = eng.prefill(ids)
    prefill_s = time.perf_counter() - t1
    rep = eng.moe_report()
    eng.reset_moe_counters()
    logits, steps = decode_steps(eng, logits, decode_tokens)
    counted = moe_counted_bytes(eng, eng.moe_report()["bytes_touched"], decode_tokens)
    bw = memory_bandwidth(threads=threads)["read_gbs"]
    figures = {"decode_tok_s": decode_tokens / sum(steps), "decode_ms_median": 1e3 * float(np.median(steps)),
               "prefill_tok_s": MOE_PROMPT_TOKENS / prefill_s,
               "counted_bytes_per_token": counted,
               "distinct_experts_prompt": rep["distinct_experts"],
               "rss_after": rss_parts(),
               "memory": {k: v for k, v in eng.memory_report().items() if k.endswith("bytes")},
               "kernels": eng.kernel_paths()}
    return figures, bw, decode_ceiling(int(counted), bw)

def paging_decode(path, threads: int = 1, expert_paging: str = "os", decode_tokens: int = DECODE_TOKENS,
                  warmup: int = 4, prompt_len: int = 8, evict: bool = True) -> dict:
    """One process's decode on a Qwen3-MoE file from a cold page cache: drop the file's pages
    (``models.evict``), load, prefill ``prompt_len`` tokens and decode ``warmup`` steps, then time
    ``decode_tokens`` steps. Per decoded token: what this process made the kernel read from storage
    (``/proc/self/io`` read_bytes), and the weight bytes the engine touched (its own count: the dense
    matrices plus the router and expert runs it read). Also the resident set and its peak (VmHWM).
    What ``memory_limit_run`` runs in a child inside a memory cgroup."""
    from kestrel_lab.engine import Qwen3Engine

    evicted = models.evict(path) if evict else False
    resident0 = models.resident_bytes(path)
    io0 = io_read_bytes()
    t0 = time.perf_counter()
    eng = Qwen3Engine.from_vqf(path, max_context=prompt_len + warmup + decode_tokens + 8, threads=threads,
                               expert_paging=expert_paging)
    logits = eng.prefill(prompt_ids(eng.config.vocab_size, prompt_len))
    for _ in range(warmup):
        logits = eng.decode(int(np.argmax(logits)))
    warm_s = time.perf_counter() - t0
    io1 = io_read_bytes()
    eng.reset_moe_counters()
    logits, steps = decode_steps(eng, logits, decode_tokens)
    io2 = io_read_bytes()
    counted = moe_counted_bytes(eng, eng.moe_report()["bytes_touched"], decode_tokens)
    st = status_bytes("VmRSS", "VmHWM", "RssAnon", "RssFile")
    return {"expert_paging": expert_paging, "threads": threads, "evicted": evicted,
            "resident_at_start_bytes": resident0, "resident_at_end_bytes": models.resident_bytes(path),
            "file_bytes": os.path.getsize(path),
            "load_and_warmup_s": warm_s, "decode_tok_s": decode_tokens / sum(steps),
            "decode_ms_median": 1e3 * float(np.median(steps)),
            "read_bytes_load_and_warmup": None if io0 is None or io1 is None else io1 - io0,
            "read_bytes_per_token": None if io1 is None or io2 is None else (io2 - io1) / decode_tokens,
            "engine_bytes_per_token": counted,
            "rss_bytes": st.get("VmRSS"), "rss_peak_bytes": st.get("VmHWM"), "rss_anon_bytes": st.get("RssAnon"),
            "rss_file_bytes": st.get("RssFile")}

def memory_limit_run(path, limit=None, threads: int = 1, decode_tokens: int = DECODE_TOKENS, warmup: int = 4,
                     rounds: int = 1, timeout: float = 900, log=print, hierarchy=None,
                     file_fraction: float | None = None) -> dict:
    """Decode on ``path`` three ways, each in a fresh child process from a cold page cache:
    ``unlimited`` (a cgroup without a limit: the same accounting), ``limited_os`` (a memory cgroup of
    ``limit`` bytes, the OS's default read-ahead) and ``limited_exact`` (the same limit,
    ``expert_paging="exact"``), ``rounds`` times in turn. The cgroup charges the page cache too, so a
    file larger than the limit must be paged in and out as on a board with too little memory.
    Without a cgroup here (``cgroup.unavailable_reason``) the result says why and measures only the
    unlimited run in a plain child. ``file_fraction`` instead of ``limit``: the limit is what the first
    unlimited child needed besides the file (its cgroup peak minus the file's pages resident at its
    end) plus that fraction of the file — a small file made "larger than memory" (day22_3's quick run).
    Taught in day22_3."""
    from kestrel_lab import cgroup

    if (limit is None) == (file_fraction is None):
        raise ValueError("memory_limit_run: give either limit or file_fraction")
    lim = None if limit is None else cgroup.parse_size(limit)
    why = cgroup.unavailable_reason() if hierarchy is None else None
    size = os.path.getsize(path)
    res = {"vqf": str(path), "file_bytes": size, "limit_bytes": lim, "threads": threads, "decode_tokens": decode_tokens,
           "rounds": rounds, "unavailable": why, "runs": {"unlimited": [], "limited_os": [], "limited_exact": []}}
    if lim is not None and size <= lim:
        log(f"warning: the file ({size / 2**30:.2f} GiB) is not larger than the limit ({lim / 2**30:.2f} GiB)")
    res["limit_rule"] = (f"the unlimited run's needs besides the file + {file_fraction:.0%} of the file"
                         if file_fraction is not None else "given")
    cases = (("unlimited", False, "os"), ("limited_os", True, "os"), ("limited_exact", True, "exact"))
    for r in range(rounds):
        for name, limited, mode in cases:
            if why and limited:
                continue
            if limited and res["limit_bytes"] is None:
                u = res["runs"]["unlimited"][0]
                own = (u["cgroup_peak_bytes"] or u["rss_peak_bytes"]) - (u["resident_at_end_bytes"] or 0)
                res["limit_bytes"] = int(own + file_fraction * size)
                res["own_needs_bytes"] = own
            case_limit = res["limit_bytes"] if limited else None
            args = json.dumps({"path": str(path), "threads": threads, "expert_paging": mode,
                               "decode_tokens": decode_tokens, "warmup": warmup})
            cmd = [sys.executable, "-m", "kestrel_lab.bench.moe", "paging-child", args]
            shown = "none" if case_limit is None else f"{case_limit / 2**30:.2f} GiB"
            log(f"round {r + 1}/{rounds}: {name} (limit {shown}, expert paging {mode}) …")
            if why:
                t0 = time.perf_counter()
                p = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout)
                out = cgroup.Result(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0, False, None, None,
                                    None, 0, "")
            else:
                out = cgroup.run(cmd, case_limit, timeout=timeout, env=child_env(), hierarchy=hierarchy)
            if out.timed_out or out.returncode != 0:
                how = f"ran past {timeout} s" if out.timed_out else "failed"
                raise RuntimeError(f"{name}: the child {how} "
                                   f"(exit {out.returncode}, OOM kills {out.oom_kills}):\n{out.stderr[-2000:]}")
            d = json.loads(out.stdout.strip().splitlines()[-1])
            d.update({"cgroup_peak_bytes": out.peak_bytes, "oom_kills": out.oom_kills, "cgroup_version": out.version,
                      "child_s": out.seconds})
            res["runs"][name].append(d)
    res["summary"] = summarize_memory_limit(res)
    res["load_avg"] = load_average()
    return res

def _median_or_none(runs: list[dict], key: str) -> float | None:
    """The median of ``key`` over the runs, or None when any run lacks it."""
    return float(np.median([r[key] for r in runs])) if all(r.get(key) is not None for r in runs) else None

def summarize_memory_limit(res: dict) -> dict:
    """Medians over the rounds of each case, and each limited case's speed as a ratio of the unlimited
    one measured in the same rounds. Taught in day22_3."""
    out = {}
    for name, runs in res["runs"].items():
        if not runs:
            continue
        out[name] = {k: _median_or_none(runs, k) for k in ("decode_tok_s", "read_bytes_per_token",
                                                           "engine_bytes_per_token", "rss_peak_bytes",
                                                           "cgroup_peak_bytes")}
        out[name]["decode_tok_s_all"] = [r["decode_tok_s"] for r in runs]
    base = res["runs"]["unlimited"]
    for name in ("limited_os", "limited_exact"):
        runs = res["runs"][name]
        if runs and base:
            ratios = [a["decode_tok_s"] / b["decode_tok_s"] for a, b in zip(runs, base)]
            out[name]["speed_vs_unlimited"] = float(np.median(ratios))
            out[name]["speed_vs_unlimited_all"] = ratios
    return out

def _scaled(x: float | None, d: float = 1e6, fmt: str = "{:.1f}") -> str:
    """``x / d`` formatted, or "n/a" for a figure not measured."""
    return "n/a" if x is None else fmt.format(x / d)

def format_memory_limit(res: dict, load: bool = True) -> str:
    """The printed report of ``memory_limit_run`` (``load``: end with the load-average line). Taught in day22_3."""
    s = res["summary"]
    lim = "none (not measured)" if res["limit_bytes"] is None else f"{res['limit_bytes'] / 2**30:.3f} GiB"
    lines = [f"file larger than memory: {Path(res['vqf']).name} {res['file_bytes'] / 2**30:.3f} GiB, limit "
             f"{lim} ({res['limit_rule']}), {res['threads']} thread(s), {res['decode_tokens']} decode steps, "
             f"{res['rounds']} round(s), medians"]
    if res["unavailable"]:
        lines.append(f"no memory cgroup here: {res['unavailable']} — only the unlimited run was measured")
    lines.append(f"{'':16s}{'tok/s':>9s}{'× unlimited':>13s}{'read MB/token':>15s}{'engine MB/token':>17s}"
                 f"{'peak (cgroup)':>15s}{'peak RSS':>11s}")
    for name, label in (("unlimited", "unlimited"), ("limited_os", "limit, OS"), ("limited_exact", "limit, exact")):
        if name not in s:
            continue
        v = s[name]
        ratio = v.get("speed_vs_unlimited")
        lines.append(f"{label:16s}{v['decode_tok_s']:9.2f}{'' if ratio is None else f'{ratio:.2f}':>13s}"
                     f"{_scaled(v['read_bytes_per_token']):>15s}{_scaled(v['engine_bytes_per_token']):>17s}"
                     f"{_scaled(v['cgroup_peak_bytes'], 2**30, '{:.2f} GiB'):>15s}"
                     f"{_scaled(v['rss_peak_bytes'], 2**30, '{:.2f} GiB'):>11s}")
    per_round = [f"{label} {', '.join(f'{x:.2f}' for x in s[name]['speed_vs_unlimited_all'])}"
                 for name, label in (("limited_os", "OS read-ahead"), ("limited_exact", "exact paging"))
                 if s.get(name, {}).get("speed_vs_unlimited_all")]
    if per_round and res["rounds"] > 1:
        lines.append("limited / unlimited speed, round by round: " + "; ".join(per_round))
    lines += load_avg_line(res) if load else []
    return "\n".join(lines)

DENSE_TWIN_CONFIG = models.DENSE_TWIN_CONFIG

def dense_twin(moe_path, dense_path, threads: list[int], decode_tokens: int = DECODE_TOKENS, rounds: int = 1,
               prompt_len: int = 16, log=print) -> dict:
    """Decode tok/s of a Qwen3-MoE file and of a dense file with about as many active parameters (e.g.
    30B-A3B beside Qwen3-4B at the same layer subset), interleaved round by round in one process, with
    the weight bytes per token each engine counts; ``predicted_ratio`` is what bandwidth alone
    predicts for MoE/dense tok/s (dense bytes / MoE bytes), ``measured_ratio`` the median of the
    per-round ratios. Taught in day22_2."""
    from kestrel_lab.engine.moe import active_bytes, active_params
    from kestrel_lab.vqf.reader import open_vqf

    out = {"moe": {"vqf": str(moe_path)}, "dense": {"vqf": str(dense_path)}, "threads": threads, "rounds": rounds,
           "decode_tokens": decode_tokens, "by_threads": {}}
    for key, p in (("moe", moe_path), ("dense", dense_path)):
        with open_vqf(p) as f:
            c = f.config
        out[key].update({"layers": c.num_hidden_layers, "active_params": active_params(c),
                         "computed_bytes_per_token": active_bytes(c)["total"]})
    for t in threads:
        speeds = {"moe": [], "dense": []}
        bpt = {}
        for r in range(rounds):
            for key, p in (("moe", moe_path), ("dense", dense_path)):
                log(f"dense twin: round {r + 1}/{rounds}, {key}, {t} thread(s) …")
                e = engine_speed(p, t, prompt_len=prompt_len, decode_tokens=decode_tokens)
                speeds[key].append(e["decode_tok_s"])
                bpt[key] = e["weight_bytes_per_token"]
        ratios = [a / b for a, b in zip(speeds["moe"], speeds["dense"])]
        out["by_threads"][t] = {"moe_tok_s": speeds["moe"], "dense_tok_s": speeds["dense"],
                                "moe_bytes_per_token": bpt["moe"], "dense_bytes_per_token": bpt["dense"],
                                "predicted_ratio": bpt["dense"] / bpt["moe"],
                                "measured_ratio": float(np.median(ratios)), "measured_ratios": ratios}
    out["load_avg"] = load_average()
    return out

def agreement(measured: float, predicted: float, tolerance: float = 0.25) -> str:
    """"agrees", "lower" or "higher": whether a measured ratio is within ``tolerance`` (relative) of the
    ratio the bytes predict. Taught in day22_2."""
    if abs(measured / predicted - 1) <= tolerance:
        return "agrees"
    return "lower" if measured < predicted else "higher"

def format_dense_twin(res: dict, load: bool = True) -> str:
    """The printed report of ``dense_twin`` (``load``: end with the load-average line). Taught in day22_2."""
    m, d = res["moe"], res["dense"]
    lines = [f"MoE vs dense twin ({m['layers']} layers each): active parameters "
             f"{m['active_params']['total'] / 1e9:.3f} B vs {d['active_params']['total'] / 1e9:.3f} B; "
             f"weight bytes per token (computed) {m['computed_bytes_per_token'] / 1e6:.1f} MB "
             f"vs {d['computed_bytes_per_token'] / 1e6:.1f} MB"]
    for t, v in res["by_threads"].items():
        verdict = agreement(v["measured_ratio"], v["predicted_ratio"])
        said = {"agrees": "agrees (within 25 %)",
                "lower": "DISAGREES: the MoE is slower than the bytes predict",
                "higher": "DISAGREES: the MoE is faster than the bytes predict"}[verdict]
        lines.append(f"{t} thread(s): MoE {np.median(v['moe_tok_s']):.1f} tok/s, "
                     f"dense {np.median(v['dense_tok_s']):.1f} tok/s "
                     f"(medians of {len(v['moe_tok_s'])}); MoE/dense measured {v['measured_ratio']:.2f}× "
                     f"(rounds: {', '.join(f'{x:.2f}' for x in v['measured_ratios'])}), bytes predict "
                     f"{v['predicted_ratio']:.2f}× — " + said)
    lines += load_avg_line(res) if load else []
    return "\n".join(lines)

def format_moe_table(res: dict) -> str:
    """The MoE bench's printed report."""
    ts = res["threads"]
    cut = res["layers"] != res["layers_full"]
    lines = [f"kestrel-lab bench (MoE) — {Path(res['vqf']).name} ({res['quant']}), {res['layers']} of "
             f"{res['layers_full']} layers"
             + (" (per-layer figures are what scales to the whole model)" if cut else "")]
    lines.append(f"{'':46s}" + "".join(f"{f'{t} thread' + ('s' if t > 1 else ''):>14s}" for t in ts))

    def row(label, vals, fmt):
        lines.append(f"{label:46s}" + "".join(f"{fmt.format(v):>14s}" for v in vals))

    row("decode tok/s", [res["engine"][t]["decode_tok_s"] for t in ts], "{:.1f}")
    row("prefill tok/s (256-token prompt)", [res["engine"][t]["prefill_tok_s"] for t in ts], "{:.1f}")
    row("weight MB per token, counted by the engine",
        [res["engine"][t]["counted_bytes_per_token"] / 1e6 for t in ts], "{:.1f}")
    row("memory read GB/s", [res["bandwidth"][t] for t in ts], "{:.1f}")
    row("bandwidth ceiling tok/s (counted bytes)", [res["ceiling_tok_s"][t] for t in ts], "{:.1f}")
    row("decode % of ceiling",
        [100 * res["engine"][t]["decode_tok_s"] / res["ceiling_tok_s"][t] for t in ts], "{:.0f} %")
    p = res["computed_parts"]
    lines.append(f"computed bytes per token (this file): {res['computed_bytes_per_token'] / 1e6:.1f} MB = attention "
                 f"{p['attention'] / 1e6:.1f} + experts {p['experts'] / 1e6:.1f} + routers {p['router'] / 1e6:.1f} + "
                 f"LM head {p['lm_head'] / 1e6:.1f} + norms/embedding row "
                 f"{(p['norms'] + p['embedding_row']) / 1e6:.2f}")
    pl = res["per_layer"]
    lines.append(f"per layer: attention {pl['attention'] / 1e6:.2f} MB, router {pl['router'] / 1e6:.2f} MB, "
                 f"active experts {pl['experts'] / 1e6:.2f} MB; whole model ({res['layers_full']} layers) computed "
                 f"{res['full_model_computed']['total'] / 1e9:.3f} GB/token, "
                 f"file {res['full_model_computed']['file'] / 1e9:.2f} GB")
    e = res["engine"][ts[-1]]
    lines.append("distinct experts chosen by a 256-token prompt, per layer: "
                 + ", ".join(map(str, e["distinct_experts_prompt"])))
    for key in ("cold", "cold_exact", "warm"):
        c = res[key]
        pin = "n/a" if c["paged_in_bytes"] is None else f"{c['paged_in_bytes'] / 1e6:.1f} MB"
        io = "n/a" if c["io_read_bytes"] is None else f"{c['io_read_bytes'] / 1e6:.1f} MB"
        lines.append(f"{key} start ({'page cache dropped' if c['evicted'] else 'file cached'}, expert paging "
                     f"{c['expert_paging']}): load {c['load_s']:.2f} s, "
                     f"first token {c['first_token_s']:.2f} s, next step {c['first_decode_s'] * 1e3:.0f} ms; paged in "
                     f"(mincore) {pin}, /proc/self/io read_bytes {io}, of a {c['file_bytes'] / 1e9:.2f} GB file")
    r = e["rss_after"]
    mem = e["memory"]
    lines.append(f"after {MOE_PROMPT_TOKENS} + decode tokens: RSS {r['rss'] / 1e6:.0f} MB "
                 f"(anonymous {r['anon'] / 1e6:.0f}, file-backed {r['file'] / 1e6:.0f}); "
                 f"weights copied at load {mem['copied_at_load_bytes'] / 1e6:.1f} MB, "
                 f"used in place {mem['in_place_bytes'] / 1e6:.1f} MB "
                 f"(experts {mem.get('experts_in_place_bytes', 0) / 1e6:.1f})")
    if res.get("memory_limit"):
        lines.append(format_memory_limit(res["memory_limit"], load=False))
    if res.get("dense_twin"):
        lines.append(format_dense_twin(res["dense_twin"], load=False))
    lines += load_avg_line(res)
    return "\n".join(lines)


def _paging_child(argv: list[str]) -> None:
    """``python -m kestrel_lab.bench.moe paging-child JSON``: ``paging_decode(**JSON)`` in this process,
    its result printed as one JSON line (what ``memory_limit_run`` starts inside a memory cgroup)."""
    if len(argv) != 2 or argv[0] != "paging-child":
        raise SystemExit("usage: python -m kestrel_lab.bench.moe paging-child JSON")
    print(json.dumps(paging_decode(**json.loads(argv[1]))))


if __name__ == "__main__":
    _paging_child(sys.argv[1:])
