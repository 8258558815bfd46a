"""``kestrel-lab bench --vision``: how long the vision tower takes to see one photo, against PyTorch.

One run, on one machine, every figure beside the others:

- the engine's vision encode seconds for a 640×480 image (grid 1×30×40: 1,200 patches, 300 LLM
  tokens), each thread count in a fresh process whose BLAS and numba both get that many threads
  (the tower's big products are BLAS sgemms, ``OPENBLAS_NUM_THREADS`` is read at start-up), at the Qwen3-VL-2B
  vision shapes (``data/configs/qwen3-vl-2b-instruct.config.json``: 24 blocks of width 1024, 3 DeepStack mergers)
  with deterministic random weights (``models.vqf``: the block matrices Q8_0 as the article's file stores them,
  the rest F32; the text tower cut to one layer and a small vocabulary, since it is not timed), at 1 thread and at
  all threads;
- the FLOPs of that encode (``VisionTower.flops``: linear layers and attention) and so the GFLOP/s;
- numpy's f32 matmul GFLOP/s on the same machine (``roofline.matmul_gflops``), the compute roof;
- transformers' ``Qwen3VLVisionModel`` in fp32 and bf16 on the same weights (dequantized from the
  file), timed the same way, and how far its output is from the engine's.

Taught in day20_2.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from kestrel_lab import models, procfs
from kestrel_lab import quant as Q
from kestrel_lab.paths import child_env, configs_dir

VL_CONFIG = "qwen3-vl-2b-instruct.config.json"
GRID = (1, 30, 40)   # a 640×480 photo: smart_resize keeps it, 1,200 patches of 16×16
#: the text tower is not timed: one layer and a small vocabulary keep the cached file to the vision part
TEXT_CUT = {"text_config": {"num_hidden_layers": 1, "vocab_size": 4096}}


def bench_vqf(config_path=None, quant: str = "q4_0", progress=None) -> Path:
    """The cached random VQF with the 2B vision shapes (``TEXT_CUT`` applied). Taught in day20_2."""
    cfg = Path(config_path) if config_path else configs_dir() / VL_CONFIG
    return models.vqf(config=cfg, overrides=TEXT_CUT, quant=quant, name="qwen3-vl-2b-vision-bench",
                      progress=progress)


def _pixels(grid, seed: int = 0) -> np.ndarray:
    t, h, w = grid
    return np.random.default_rng(seed).uniform(-1, 1, (t * h * w, 1536)).astype(np.float32)


def engine_encode(path, threads: int, grid=GRID, repeat: int = 1) -> dict:
    """Seconds of the engine's vision encode of one image of ``grid`` (median of ``repeat`` after a
    small warm-up that compiles/loads the kernels and pages the weights in). Taught in day20_2."""
    from kestrel_lab.vision.tower import VisionTower

    tw = VisionTower.from_vqf(path, threads=threads)
    tw.encode(_pixels((1, 4, 4)), [(1, 4, 4)])
    px = _pixels(grid)
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = tw.encode(px, [grid])
        times.append(time.perf_counter() - t0)
    s = float(np.median(times))
    fl = tw.flops([grid])
    return {"threads": threads, "seconds": s, "flops": fl, "gflops": fl / s / 1e9, "tokens": out.tokens[0],
            "weight_qtypes": tw.weight_qtypes, "embeds": out.embeds}


def engine_encode_fresh(path, threads: int, embeds_out: str | None = None) -> dict:
    """``engine_encode`` in a fresh process with ``threads`` BLAS and numba threads (env vars set at
    start-up, the only way to size OpenBLAS's pool without an extra package). Taught in day20_2."""
    import tempfile

    env = child_env(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                    MKL_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    with tempfile.TemporaryDirectory(prefix="kestrel-vbench-") as tmp:
        out = embeds_out or os.path.join(tmp, "embeds.npy")
        p = subprocess.run([sys.executable, "-m", "kestrel_lab.bench.vision", str(path), str(threads), out], env=env,
                           capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"vision encode child ({threads} threads) failed:\n{p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["embeds"] = np.load(out)
    return r


def torch_tower(path, dtype: str):
    """transformers' ``Qwen3VLVisionModel`` with the file's vision weights (dequantized). Taught in day20_2."""
    import torch
    import transformers

    from kestrel_lab.vqf.layout import vision_specs
    from kestrel_lab.vqf.reader import open_vqf

    f = open_vqf(path)
    v = f.config.vision
    hf_cfg = transformers.Qwen3VLVisionConfig(
        depth=v.depth, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_heads=v.num_heads,
        in_channels=v.in_channels, patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
        spatial_merge_size=v.spatial_merge_size, out_hidden_size=v.out_hidden_size,
        num_position_embeddings=v.num_position_embeddings, deepstack_visual_indexes=list(v.deepstack_visual_indexes),
        hidden_act=v.hidden_act)
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    with torch.device("meta"):
        model = transformers.Qwen3VLVisionModel._from_config(hf_cfg)
    shapes = {k: tuple(p.shape) for k, p in model.state_dict().items()}
    sd = {}
    # The inverse of the layout's build rule: each entry's rows split back into its source tensors.
    for spec in vision_specs(f.config):
        t = f.tensors[spec.name]
        full = Q.dequantize(t.data, t.qtype, t.rows, t.cols) if t.qtype != Q.F32.id else t.array()
        r0 = 0
        for src in spec.sources:
            name = src.removeprefix("model.visual.")
            n = int(np.prod(shapes[name])) // spec.cols
            sd[name] = torch.from_numpy(np.array(full[r0:r0 + n]).reshape(shapes[name])).to(tdt)
            r0 += n
    model.load_state_dict(sd, strict=False, assign=True)
    model.rotary_pos_emb = type(model.rotary_pos_emb)(hf_cfg)    # a buffer made on the meta device
    f.close()
    return model.eval()


def torch_encode(path, dtype: str, threads: int, grid=GRID) -> dict:
    """Seconds of transformers' vision tower on one image (fp32 or bf16), after a small warm-up. Taught in day20_2."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = torch_tower(path, dtype)
        tdt = next(model.parameters()).dtype
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(torch.from_numpy(_pixels((1, 4, 4))).to(tdt), grid_thw=torch.tensor([(1, 4, 4)]))
            t0 = time.perf_counter()
            out = model(torch.from_numpy(_pixels(grid)).to(tdt), grid_thw=torch.tensor([grid]))
            s = time.perf_counter() - t0
        return {"dtype": dtype, "threads": threads, "seconds": s, "embeds": out.pooler_output.float().numpy()}
    finally:
        torch.set_num_threads(prev)


def run(config_path=None, threads: list[int] | None = None, with_torch: bool = True, log=print) -> dict:
    """All the figures of one ``bench --vision`` run, as a dict. Taught in day20_2."""
    from kestrel_lab.roofline import matmul_gflops
    from kestrel_lab.threads import resolve_threads

    threads = sorted(set(threads or [1, resolve_threads(None)]))
    t0 = time.perf_counter()
    path = bench_vqf(config_path)
    log(f"model: {path} ({path.stat().st_size / 1e6:.0f} MB, ready in {time.perf_counter() - t0:.1f} s)")
    res = {"vqf": str(path), "grid": list(GRID), "threads": threads, "engine": {}, "torch": {}}
    for t in threads:
        log(f"engine vision encode, {t} thread(s), fresh process …")
        res["engine"][t] = engine_encode_fresh(path, t)
    res["matmul_gflops"] = matmul_gflops(1024)["gflops"]
    ref = res["engine"][threads[-1]].pop("embeds")
    for t in threads[:-1]:
        res["engine"][t].pop("embeds")
    if with_torch:
        try:
            import torch  # noqa: F401  (imported only to see whether it is installed)
            import transformers  # noqa: F401  (imported only to see whether it is installed)
        except ImportError:
            res["torch"] = {"skipped": "torch/transformers not installed"}
        else:
            for dt in ("fp32", "bf16"):
                log(f"PyTorch {dt} vision encode, {threads[-1]} thread(s) …")
                r = torch_encode(path, dt, threads[-1])
                emb = r.pop("embeds")
                r["max_rel_diff_to_engine"] = float(np.abs(emb - ref).max() / max(np.abs(emb).max(), 1e-30))
                res["torch"][dt] = r
    res["load_avg"] = procfs.load_average()
    return res


def format_table(res: dict) -> str:
    """The printed report: seconds, GFLOP/s and ratios side by side."""
    ts = res["threads"]
    e0 = res["engine"][ts[-1]]
    g = res["grid"]
    lines = [f"kestrel-lab bench --vision — {Path(res['vqf']).name}: one 640×480 image, grid {g[0]}×{g[1]}×{g[2]} "
             f"({g[0] * g[1] * g[2]} patches, {e0['tokens']} LLM tokens), {e0['flops'] / 1e12:.3f} TFLOP; "
             f"block matrices {', '.join(sorted(set(e0['weight_qtypes'].values())))}"]
    for t in ts:
        e = res["engine"][t]
        lines.append(f"engine, {t} thread{'s' if t > 1 else ''}: {e['seconds']:.2f} s, {e['gflops']:.1f} GFLOP/s "
                     f"({100 * e['gflops'] / res['matmul_gflops']:.0f} % of numpy's f32 matmul roof)")
    lines.append(f"numpy f32 matmul (1024³, BLAS threads): {res['matmul_gflops']:.1f} GFLOP/s")
    tr = res.get("torch") or {}
    if "skipped" in tr:
        lines.append(f"PyTorch: {tr['skipped']}")
    for dt in ("fp32", "bf16"):
        if dt in tr:
            r = tr[dt]
            lines.append(f"PyTorch {dt}, {r['threads']} threads: {r['seconds']:.2f} s, "
                         f"{e0['flops'] / r['seconds'] / 1e9:.1f} GFLOP/s → engine is "
                         f"{r['seconds'] / e0['seconds']:.2f}× its speed; output differs from the engine's by "
                         f"{r['max_rel_diff_to_engine']:.1e} of its scale")
    if res.get("load_avg"):
        lines.append("machine load average (1/5/15 min) at the end: "
                     + " / ".join(f"{v:.2f}" for v in res["load_avg"]))
    return "\n".join(lines)


__all__ = ["bench_vqf", "engine_encode", "engine_encode_fresh", "torch_tower", "torch_encode", "run", "format_table",
           "GRID"]


def _child(argv: list[str]) -> None:
    """``python -m kestrel_lab.bench.vision VQF THREADS EMBEDS.npy``: one ``engine_encode`` in this fresh
    process (``engine_encode_fresh`` sets the thread variables first); the embeddings go to the .npy
    file, the figures to one JSON line."""
    path, threads, out = argv
    r = engine_encode(path, int(threads))
    np.save(out, r.pop("embeds"))
    print(json.dumps(r))


if __name__ == "__main__":
    _child(sys.argv[1:])
