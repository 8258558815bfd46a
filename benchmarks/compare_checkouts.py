#!/usr/bin/env python3
"""Decode and prefill tok/s of two checkouts of kestrel_lab on the same VQF file, in one run.

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/compare_checkouts.py /tmp/before . [--vqf FILE] [--rounds 5] [--threads 1 2]

Each measurement is a fresh process whose ``PYTHONPATH`` selects the checkout (so each side imports
its own package and its own numba kernels); the two sides alternate round by round, so a machine
that gets busier or quieter affects both alike. Prints, per side and thread count, the median and the
spread (min–max) of prefill and decode tok/s, and whether the second side's median lies within the
first side's spread. The default file is the bench's random Qwen3-0.6B at Q4_0, made once with the
first checkout. A refactor passes when the after-median is within the before-spread.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

MEASURE = r"""
import json, sys, time
import numpy as np
from kestrel_lab.engine import Qwen3Engine
path, threads, prompt, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
eng = Qwen3Engine.from_vqf(path, max_context=prompt + steps + 8, threads=threads)
ids = [int(i) for i in np.random.default_rng(0).integers(0, eng.config.vocab_size, prompt)]
eng.prefill(ids[:8]); eng.decode(1); eng.reset()                      # compile / warm the page cache
t0 = time.perf_counter(); logits = eng.prefill(ids); pre = time.perf_counter() - t0
times = []
for _ in range(steps):
    t0 = time.perf_counter(); logits = eng.decode(int(np.argmax(logits))); times.append(time.perf_counter() - t0)
print(json.dumps({"prefill_tok_s": prompt / pre, "decode_tok_s": steps / sum(times)}))
"""


def run(checkout: Path, vqf: Path, threads: int, prompt: int, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    out = subprocess.run([sys.executable, "-c", MEASURE, str(vqf), str(threads), str(prompt), str(steps)],
                         env=env, capture_output=True, text=True, cwd=checkout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def default_vqf(checkout: Path) -> Path:
    code = ("try:\n    from kestrel_lab.models import default_bench_vqf\n    print(default_bench_vqf(False))\n"
            "except ImportError:  # a checkout from before kestrel_lab.models\n"
            "    from kestrel_lab.engine.bench import bench_vqf\n    print(bench_vqf(None, 'q4_0'))")
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--vqf", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    a = ap.parse_args(argv)
    vqf = a.vqf or default_vqf(a.before)
    sides = {"before": a.before, "after": a.after}
    res = {(s, t): [] for s in sides for t in a.threads}
    for r in range(a.rounds):
        for t in a.threads:
            for s in (sides if r % 2 == 0 else reversed(list(sides))):
                res[(s, t)].append(run(sides[s], vqf, t, a.prompt, a.steps))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    print(f"{vqf.name}: prompt {a.prompt}, {a.steps} decode steps, {a.rounds} interleaved rounds")
    print(f"{'threads':>7} {'figure':>13} {'before median (min–max)':>28} {'after median (min–max)':>28}  within")
    for t in a.threads:
        for fig in ("prefill_tok_s", "decode_tok_s"):
            b = [x[fig] for x in res[("before", t)]]
            f = [x[fig] for x in res[("after", t)]]
            mb, mf = statistics.median(b), statistics.median(f)
            ok = min(b) <= mf <= max(b) or mf >= mb
            print(f"{t:>7} {fig:>13} {mb:10.1f} ({min(b):6.1f}–{max(b):6.1f})       "
                  f"{mf:10.1f} ({min(f):6.1f}–{max(f):6.1f})       {'yes' if ok else 'NO'}  ×{mf / mb:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
