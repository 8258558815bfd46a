"""kestrel_lab.threads: the CPUs and thread count the engine uses by default, ``--cpus`` on the engine
commands, and pinning that moves every thread of the process (numba's pool included). Pinning changes
the process, so those checks run in a child Python."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kestrel_lab import cli, models, threads
from kestrel_lab.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")


def child(code: str, **env) -> str:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), **env))
    assert p.returncode == 0, p.stderr
    assert "Warning" not in p.stderr, p.stderr
    return p.stdout.strip()


def test_use_cpus_moves_threads_started_before_it():
    out = child("""
        import os, threading, time, numpy as np
        from kestrel_lab import threads
        from kestrel_lab.roofline import memory_bandwidth
        memory_bandwidth(threads=None, size_mb=1, repeat=1)   # numba's pool exists now
        ev = threading.Event(); tid = []
        t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), ev.wait())); t.start()
        while not tid: time.sleep(0.01)
        choice = threads.use_cpus("0")
        tasks = [int(x) for x in os.listdir("/proc/self/task")]
        print(sorted(choice.cpus), os.sched_getaffinity(tid[0]) == {0},
              all(os.sched_getaffinity(x) == {0} for x in tasks), threads.resolve_threads(None), len(tasks) > 2)
        ev.set()
    """)
    assert out == "[0] True True 1 True"


def test_default_count_is_the_default_cluster_and_the_env_overrides():
    n = len(os.sched_getaffinity(0))
    assert threads.default_cpus().cpus == tuple(sorted(os.sched_getaffinity(0)))   # one core type here
    assert threads.resolve_threads(None) == min(n, threads.numba.config.NUMBA_NUM_THREADS)
    assert child("from kestrel_lab import threads; print(threads.resolve_threads(None), "
                 "threads.default_cpus().note())", KESTREL_CPUS="0") == "1 cpus 0 (1 × " + \
        threads.machine.cpu_clusters()[0]["model"] + ", as asked)"


def test_a_big_little_machine_is_pinned_to_the_fast_cluster_on_first_use():
    """On a machine with two core types the first default use pins the process (here cpu 0 stands in
    for the A76 cluster: resolve_cpus is replaced, pinning is real)."""
    out = child("""
        import os
        from kestrel_lab import machine, threads
        big = machine.CpuChoice((0,), "big", "Cortex-A76", default=True, multi=True)
        machine.resolve_cpus = lambda spec=None, **kw: big
        print(threads.resolve_threads(None), sorted(os.sched_getaffinity(0)))
    """)
    assert out == "1 [0]"


def test_resolve_threads_checks_the_range():
    with pytest.raises(ValueError, match="threads=0"):
        threads.resolve_threads(0)
    with pytest.raises(TypeError):
        threads.resolve_threads(True)


@pytest.fixture(scope="module")
def vqf():
    return models.vqf("qwen3-tiny-poem", quant="q8_0")


def test_generate_says_where_it_ran(vqf, capsys, monkeypatch):
    monkeypatch.setattr(threads, "_CHOICE", None)
    rc = cli.main(["generate", str(vqf), "--prompt", r"《夜思》\n作者：李白\n", "--max-new", "4", "--cpus", "0"])
    err = capsys.readouterr().err
    monkeypatch.setattr(threads, "_CHOICE", None)
    os.sched_setaffinity(0, set(range(os.cpu_count())))
    assert rc == 0
    assert "[cpus 0 (1 × " in err and "as asked) | 1 threads | numba layer omp]" in err
    assert "warning" not in err.lower()


def test_bad_cpus_on_the_engine_commands(vqf, capsys):
    assert cli.main(["generate", str(vqf), "--prompt", "x", "--cpus", "fast"]) != 0
    assert "--cpus fast: 'fast' is not a CPU number" in capsys.readouterr().err
    assert cli.main(["bench", "--cpus", "999"]) != 0
    assert "--cpus 999: CPU(s) 999 are not available" in capsys.readouterr().err
