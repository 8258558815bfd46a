"""Fuzz every loader (VQF + the engine's constructor, vocab.bin, safetensors, config.json) with
Hypothesis: 2,000 cases each, in four worker processes at once, each under an address-space cap and a
per-case watchdog (``tests/helpers/fuzz_cases.py``). The property: a load, or the loader's own error
class naming the file — no other exception, no big allocation, no hang; safetensors files are also
given to the ``safetensors`` package, which must accept exactly what ours accepts.

``pytest -m fuzz_long`` (or ``KESTREL_FUZZ_LONG=1``) also runs 25,000 cases per loader from a random seed
(``KESTREL_FUZZ_SEED`` repeats a run; a failure prints the seed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "helpers" / "fuzz_cases.py"
LOADERS = ("vqf", "vocab", "safetensors", "config", "config_moe", "keyfile")
CASES = 2000


def _start(name: str, cases: int, tmp: Path, seed: int | None = None) -> subprocess.Popen:
    args = [sys.executable, str(WORKER), name, str(cases), "--workdir", str(tmp / name)]
    if seed is not None:
        args += ["--seed", str(seed)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _result(proc: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"fuzz worker hung past {timeout:.0f} s:\n{err[-3000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, f"worker exited {proc.returncode} without a result:\n{err[-3000:]}"
    res = json.loads(lines[-1])
    res["returncode"], res["stderr"] = proc.returncode, err[-3000:]
    res["report"] = "\n".join(ln for ln in out.splitlines() if not ln.startswith("{"))[-3000:]  # Hypothesis' example
    return res


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    return {name: _start(name, CASES, tmp) for name in LOADERS}


def _check(res: dict, cases: int) -> None:
    assert "error" not in res, res
    assert not res["findings"], "\n".join(res["findings"]) + "\n" + res["report"]
    assert not res["mismatches"], "\n".join(res["mismatches"])
    assert res["cases"] >= cases, res
    assert set(res["outcomes"]) <= {"loaded", "refused"} and res["outcomes"].get("refused"), res
    assert res["returncode"] == 0, res["stderr"]


@pytest.mark.parametrize("name", LOADERS)
def test_fuzz_loader(name, workers):
    res = _result(workers[name], timeout=900)
    _check(res, CASES)
    print(f"{name}: {res['cases']:,} cases, {res['cases_per_s']} cases/s, {res['outcomes']}")


LONG = 25_000


@pytest.fixture(scope="module")
def long_workers(tmp_path_factory):
    """The long run's four workers, started together (only when a fuzz_long test runs)."""
    tmp = tmp_path_factory.mktemp("fuzz_long")
    seed = int(os.environ.get("KESTREL_FUZZ_SEED") or int.from_bytes(os.urandom(4), "little"))
    return seed, {name: _start(name, LONG, tmp, seed=seed) for name in LOADERS}


@pytest.mark.fuzz_long
@pytest.mark.parametrize("name", LOADERS)
def test_fuzz_loader_long(name, long_workers):
    seed, procs = long_workers
    res = _result(procs[name], timeout=4 * 3600)
    try:
        _check(res, LONG)
    except AssertionError as e:
        raise AssertionError(f"KESTREL_FUZZ_SEED={seed} reproduces this run:\n{e}") from None
    print(f"{name}: {res['cases']:,} cases (seed {seed}), {res['cases_per_s']} cases/s, {res['outcomes']}")
