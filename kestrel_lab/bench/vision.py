"""``kestrel-lab bench --vision``: how long the vision tower takes to see one photo, against PyTorch.

One run, on one machine, every figure beside the others:

- the engine's vision encode seconds for a 640×480 image (grid 1×30×40: 1,200 patches, 300 LLM
  tokens), each thread count in a fresh process whose BLAS and numba both get that many threads
  (the block matrices run the numba int8 GEMM, the patch embedding and mergers BLAS sgemms;
  ``OPENBLAS_NUM_THREADS`` is read at start-up), at the Qwen3-VL-2B
  vision shapes (``data/configs/qwen3-vl-2b-instruct.config.json``: 24 blocks of width 1024, 3 DeepStack mergers)
  with deterministic random weights (``models.vqf``: the block matrices Q8_0 as the article's file stores them,
  the rest F32; the text tower cut to one layer and a small vocabulary, since it is not timed), at 1 thread and at
  all threads;
- the FLOPs of that encode (``VisionTower.flops``: linear layers and attention) and so the GFLOP/s;
- numpy's f32 matmul GFLOP/s on the same machine (``roofline.matmul_gflops``), the compute roof;
- transformers' ``Qwen3VLVisionModel`` in fp32 and bf16 on the same weights (dequantized from the
  file), timed the same way, and how far its output is from the engine's (the engine quantizes the
  activations of its Q8_0 matmuls to int8: ~1e-2 of the output's scale);
- time to first token for one 640×480 picture and a question (``time_to_first_token``): preprocess
  (resize, patches, template, tokenizer), tower, prefill of the expanded prompt (image pads included),
  for the trained tiny VL model and for random weights with all the 2B shapes, each thread count fresh.

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


# --------------------------------------------------------------------------- time to first token
TTFT_MODELS = ("qwen3-tiny-vl", "2B shapes")
TTFT_PROMPT = "Describe this picture."


def photo(height: int = 480, width: int = 640, seed: int = 0) -> np.ndarray:
    """A deterministic (H, W, 3) uint8 picture: smooth colour gradients plus noise (no file needed)."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([xx / width, yy / height, (xx + yy) / (width + height)], axis=-1) * 200
    rgb += np.random.default_rng(seed).uniform(0, 55, rgb.shape)
    return rgb.astype(np.uint8)


def ttft_vqf(model: str, progress=None) -> Path:
    """The cached VQF of a TTFT row: the trained tiny VL model (Q4_0), or random weights with every shape
    of Qwen3-VL-2B (text tower too: the prefill is timed)."""
    if model == "qwen3-tiny-vl":
        return models.vqf("qwen3-tiny-vl", quant="q4_0", progress=progress)
    return models.vqf(config=configs_dir() / VL_CONFIG, quant="q4_0", name="qwen3-vl-2b-ttft", progress=progress)


def time_to_first_token(path, threads: int) -> dict:
    """Seconds from a 640×480 picture and a question to the first token's logits, in three parts:
    ``preprocess`` (resize, patches, chat template, tokenizer), ``tower`` (the vision encode) and
    ``prefill`` (the whole expanded prompt, the image pads included, through the language model).
    A small picture goes through the same steps first (kernels compiled or loaded)."""
    from kestrel_lab.engine.vl import open_engine
    from kestrel_lab.vision import preprocess as PP
    from kestrel_lab.vision import prompt as VP
    from kestrel_lab.vocab import Tokenizer

    eng = open_engine(path, threads=threads, max_context=2048)
    tok = Tokenizer.default()
    merge = eng.config.vision.spatial_merge_size
    res = {}
    for size in ((64, 64), (480, 640)):          # warm-up, then the timed run
        eng.features_cache.clear()
        eng.truncate(0)
        t0 = time.perf_counter()
        img = PP.load_image(photo(*size), vision=eng.config.vision)
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": TTFT_PROMPT}]}]
        ids = VP.encode_vl_chat(tok, msgs, [tuple(img.grid_thw)], merge_size=merge)
        t1 = time.perf_counter()
        eng.encode(img)
        t2 = time.perf_counter()
        logits = eng.prefill_vl(ids, [img])       # the features come from the encode above
        first = int(np.argmax(logits))
        t3 = time.perf_counter()
        res = {"threads": threads, "preprocess": t1 - t0, "tower": t2 - t1, "prefill": t3 - t2, "total": t3 - t0,
               "tokens": len(ids), "image_tokens": img.n_tokens, "grid": list(img.grid_thw), "first_token": first}
    return res


def ttft_fresh(path, threads: int) -> dict:
    """``time_to_first_token`` in a fresh process with ``threads`` BLAS and numba threads."""
    env = child_env(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                    MKL_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, "-m", "kestrel_lab.bench.vision", "--ttft", str(path), str(threads)], env=env,
                       capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"TTFT child ({path}, {threads} threads) failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


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


def run(config_path=None, threads: list[int] | None = None, with_torch: bool = True, with_ttft: bool | None = None,
        log=print) -> dict:
    """All the figures of one ``bench --vision`` run, as a dict; the TTFT table (``with_ttft``, by default
    only for the 2B vision shapes, i.e. without ``config_path``) adds the tiny VL model and a random 2B file
    (built once, ~2 GB in the cache). Taught in day20_2."""
    with_ttft = config_path is None if with_ttft is None else with_ttft
    from kestrel_lab.roofline import matmul_gflops
    from kestrel_lab.threads import resolve_threads

    threads = sorted(set(threads or [1, resolve_threads(None)]))
    t0 = time.perf_counter()
    path = bench_vqf(config_path)
    log(f"model: {path} ({path.stat().st_size / 1e6:.0f} MB, ready in {time.perf_counter() - t0:.1f} s)")
    res = {"vqf": str(path), "grid": list(GRID), "threads": threads, "engine": {}, "torch": {}, "ttft": {}}
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
    if with_ttft:
        for model in TTFT_MODELS:
            vqf = ttft_vqf(model)
            for t in threads:
                log(f"time to first token, {model}, {t} thread(s), fresh process …")
                res["ttft"].setdefault(model, {})[t] = ttft_fresh(vqf, t)
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
    for model, rows in (res.get("ttft") or {}).items():
        for t, r in sorted(rows.items()):
            g = r["grid"]
            lines.append(f"TTFT {model}, {t} thread{'s' if t > 1 else ''}: preprocess {r['preprocess']:.3f} s + tower "
                         f"{r['tower']:.3f} s (grid {g[0]}×{g[1]}×{g[2]}) + prefill {r['prefill']:.3f} s "
                         f"({r['tokens']} tokens, {r['image_tokens']} image pads) = {r['total']:.3f} s")
    if res.get("load_avg"):
        lines.append("machine load average (1/5/15 min) at the end: "
                     + " / ".join(f"{v:.2f}" for v in res["load_avg"]))
    return "\n".join(lines)


__all__ = ["bench_vqf", "engine_encode", "engine_encode_fresh", "torch_tower", "torch_encode", "run", "format_table",
           "GRID", "photo", "ttft_vqf", "time_to_first_token", "ttft_fresh"]


def _child(argv: list[str]) -> None:
    """``python -m kestrel_lab.bench.vision VQF THREADS EMBEDS.npy``: one ``engine_encode`` in this fresh
    process (``engine_encode_fresh`` sets the thread variables first); the embeddings go to the .npy
    file, the figures to one JSON line. ``--ttft VQF THREADS``: one ``time_to_first_token``."""
    if argv[0] == "--ttft":
        print(json.dumps(time_to_first_token(argv[1], int(argv[2]))))
        return
    path, threads, out = argv
    r = engine_encode(path, int(threads))
    np.save(out, r.pop("embeds"))
    print(json.dumps(r))


if __name__ == "__main__":
    _child(sys.argv[1:])
