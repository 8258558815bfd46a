"""The machine's fingerprint: what a measured figure was measured on.

Used by ``measure`` (every recorded figure carries it) and by ``kestrel-lab runner-info`` (what a board
operator pastes into a report). Reads /proc and /sys where they exist, so that the big.LITTLE clusters
of an RK3588 (4×Cortex-A76 + 4×Cortex-A55) show up as two clusters. Taught in day01_3 and day28_1.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

# ARM "CPU part" ids seen on the boards this course targets.
_ARM_PARTS = {
    "0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
    "0xd0d": "Cortex-A77", "0xd41": "Cortex-A78", "0xd44": "Cortex-X1", "0xd46": "Cortex-A510",
    "0xd47": "Cortex-A710", "0xd48": "Cortex-X2", "0xd4d": "Cortex-A715", "0xd4e": "Cortex-X3",
}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cpuinfo_blocks() -> list[dict[str, str]]:
    text = _read("/proc/cpuinfo") or ""
    blocks, cur = [], {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        key, _, value = line.partition(":")
        cur[key.strip()] = value.strip()
    if cur:
        blocks.append(cur)
    return [b for b in blocks if "processor" in b]


def cpu_clusters() -> list[dict]:
    """Group logical CPUs by (model, max frequency): one entry per cluster."""
    clusters: dict[tuple, list[int]] = {}
    for block in _cpuinfo_blocks():
        try:
            cpu = int(block["processor"])
        except ValueError:
            continue
        model = block.get("model name")
        if not model and "CPU part" in block:
            model = _ARM_PARTS.get(block["CPU part"].lower(), f"ARM part {block['CPU part']}")
        max_khz = _read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq")
        key = (model or platform.processor() or "unknown", int(max_khz) // 1000 if max_khz else None)
        clusters.setdefault(key, []).append(cpu)
    if not clusters:
        return [{"model": platform.processor() or "unknown", "max_mhz": None,
                 "cpus": list(range(os.cpu_count() or 1)), "governor": _governor(0)}]
    return [{"model": m, "max_mhz": f, "cpus": cpus, "governor": _governor(cpus[0])}
            for (m, f), cpus in sorted(clusters.items(), key=lambda kv: kv[1][0])]


def _governor(cpu: int) -> str | None:
    """The cpufreq governor of one CPU (a cluster shares one policy): 'performance' is what a
    benchmark wants; 'schedutil' or 'ondemand' let the clock ramp while a measurement runs."""
    return _read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")


def memory_bytes() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for mod in ("numpy", "numba", "llvmlite"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - an absent library is a fact to record, not an error
            out[mod] = None
    from kestrel_lab import __version__

    out["kestrel_lab"] = __version__
    return out


# What a re-run itself writes into the checkout: never a reason to call the tree dirty.
DIRTY_IGNORED = ("data/measurements/", "runs/")


def dirty_files(repo: Path | None = None) -> list[str] | None:
    """The files of the checkout that differ from its commit (``git status``): modified, added or
    deleted tracked files, and untracked files under ``kestrel_lab/`` or ``notebooks/`` (code a
    notebook would run but no commit holds). What a re-run writes (``DIRTY_IGNORED``) does not count.
    None when ``repo`` is not a git checkout (nothing can be told). Taught in day28_2."""
    from kestrel_lab.paths import REPO_ROOT

    repo = Path(repo or REPO_ROOT)
    try:
        res = subprocess.run(["git", "-C", str(repo), "status", "--porcelain=v1", "--untracked-files=all"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    out = []
    for line in res.stdout.splitlines():
        code, path = line[:2], line[3:].strip().strip('"')
        path = path.split(" -> ")[-1]
        if path.startswith(DIRTY_IGNORED):
            continue
        if code == "??" and not path.startswith(("kestrel_lab/", "notebooks/")):
            continue
        out.append(path)
    return sorted(out)


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The checkout's commit, with ``+dirty`` when the code differs from it (``dirty_files``: what a
    re-run writes itself, such as the figures it publishes, does not count)."""
    from kestrel_lab.paths import REPO_ROOT

    try:
        sha = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty_files(REPO_ROOT) else "")


def numba_threading(probe: bool = False) -> dict:
    """numba's thread count, the layer asked for (``NUMBA_THREADING_LAYER``) and the layer in use.

    The layer in use (tbb, omp or workqueue) is only known once a parallel kernel has run; with
    ``probe=True`` a one-line ``prange`` kernel is run to find out (``runner-info`` does; a notebook's
    provenance records it only if the notebook already ran a parallel kernel). Taught in day28_1.
    """
    try:
        import numba
    except Exception:  # noqa: BLE001 - an absent library is a fact to record, not an error
        return {}
    out = {"threads": numba.config.NUMBA_NUM_THREADS, "layer": numba.config.THREADING_LAYER,
           "layer_in_use": None}
    try:
        out["layer_in_use"] = numba.threading_layer()
    except ValueError:  # not initialised yet
        if probe:
            try:
                _probe_parallel()
                out["layer_in_use"] = numba.threading_layer()
            except Exception as e:  # noqa: BLE001 - report, do not fail the fingerprint
                out["layer_in_use"] = f"unavailable ({type(e).__name__}: {e})"
    return out


def _probe_parallel() -> None:
    import numpy as np
    from numba import njit, prange

    @njit(parallel=True, cache=True)
    def _sum(a):  # pragma: no cover - compiled
        s = 0.0
        for i in prange(a.size):
            s += a[i]
        return s

    _sum(np.ones(64))


def fingerprint(probe_threading: bool = False) -> dict:
    """Everything a figure's provenance says about the machine and the software.

    Taught in day01_3 and day28_1.
    """
    gov = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {
        "arch": platform.machine(),
        "clusters": cpu_clusters(),
        "cores": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": memory_bytes(),
        "governor": gov,
        "os": f"{platform.system()} {platform.release()}",
        "kernel": f"{platform.release()} {platform.version()}",
        "distro": _distro(),
        "hostname": platform.node(),
        "versions": _versions(),
        "numba": numba_threading(probe_threading),
        "numba_env": {k: os.environ[k] for k in ("NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER")
                      if k in os.environ},
        "git_commit": git_commit(),
        "executable": sys.executable,
    }


def _distro() -> str | None:
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return None


def describe(fp: dict | None = None) -> str:
    """One line per fact, for ``kestrel-lab runner-info``."""
    fp = fp or fingerprint()
    lines = [f"arch        {fp['arch']}"]
    for c in fp["clusters"]:
        freq = f" @ {c['max_mhz']} MHz" if c["max_mhz"] else ""
        gov = f", governor {c['governor']}" if c.get("governor") else ""
        lines.append(f"cluster     {len(c['cpus'])} × {c['model']}{freq}  (cpus {_ranges(c['cpus'])}{gov})")
    mem = fp["memory_bytes"]
    lines += [
        f"cores       {fp['cores']} (this process may use {_ranges(fp['affinity'] or [])})",
        f"memory      {mem / 2**30:.1f} GiB" if mem else "memory      unknown",
        f"governor    {fp['governor'] or 'n/a'}",
        f"os          {fp['os']} ({fp['distro'] or 'unknown distribution'})",
    ]
    if fp.get("kernel"):
        lines.append(f"kernel      {fp['kernel']}")
    lines += [f"{k:<11} {v}" for k, v in fp["versions"].items()]
    if fp["numba"]:
        in_use = fp["numba"].get("layer_in_use")
        lines.append(f"numba thr.  {fp['numba'].get('threads')} threads, layer "
                     f"{fp['numba'].get('layer')}" + (f" (in use: {in_use})" if in_use else ""))
    for k, v in (fp.get("numba_env") or {}).items():
        lines.append(f"{'env':<11} {k}={v}")
    lines.append(f"git commit  {fp['git_commit'] or 'not a git checkout'}")
    return "\n".join(lines)


def _ranges(cpus: list[int]) -> str:
    """[0,1,2,3,6] -> '0-3,6'."""
    out, start, prev = [], None, None
    for c in sorted(cpus):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)
