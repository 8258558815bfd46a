"""The machine's fingerprint: what a measured figure was measured on.

Used by ``measure`` (every recorded figure carries it) and by ``kestrel-lab runner-info`` (what a board
operator pastes into a report). Reads /proc and /sys where they exist, so that the big.LITTLE clusters
of an RK3588 (4×Cortex-A76 + 4×Cortex-A55) show up with each cluster's governor, and picks the CPUs
the engine runs on by default: the fastest core type (``resolve_cpus``; ``--cpus big|little|all|4-7``).
Also records numba's threading layer and whether libgomp (what its ``omp`` layer needs) is loadable,
and whether the machine is emulated (``KESTREL_EMULATED``). The /proc and /sys roots are injectable
(``Roots``, or ``KESTREL_PROC_ROOT``/``KESTREL_SYS_ROOT``): qemu-user shows the host's, so a fake RK3588
tree (tests/fixtures/rk3588/) is how the big.LITTLE code is tested. Taught in day01_3 and day28_1.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# ARM "CPU part" ids seen on the boards this course targets.
_ARM_PARTS = {
    "0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
    "0xd0d": "Cortex-A77", "0xd41": "Cortex-A78", "0xd44": "Cortex-X1", "0xd46": "Cortex-A510",
    "0xd47": "Cortex-A710", "0xd48": "Cortex-X2", "0xd4d": "Cortex-A715", "0xd4e": "Cortex-X3",
}
# The in-order "LITTLE" cores among them: when no cpufreq tells the clocks apart, these rank below the rest.
_LITTLE_PARTS = {"0xd03", "0xd04", "0xd05", "0xd46"}
CLUSTER_NAMES = ("big", "little", "all")


@dataclass(frozen=True)
class Roots:
    """Where /proc and /sys are. The real ones by default; a test (or ``KESTREL_PROC_ROOT`` and
    ``KESTREL_SYS_ROOT``) points them at a fake tree such as ``tests/fixtures/rk3588/`` — the only way
    to check the big.LITTLE code off a board, since qemu-user shows the host's /proc and /sys."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")

    @classmethod
    def from_env(cls) -> "Roots":
        return cls(Path(os.environ.get("KESTREL_PROC_ROOT", "/proc")), Path(os.environ.get("KESTREL_SYS_ROOT", "/sys")))

    @property
    def real(self) -> bool:
        return self.proc == Path("/proc") and self.sys == Path("/sys")

    def cpufreq(self, cpu: int, name: str) -> str | None:
        return _read(self.sys / f"devices/system/cpu/cpu{cpu}/cpufreq/{name}")


def _roots(roots: Roots | None) -> Roots:
    return roots or Roots.from_env()


def _read(path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cpuinfo_blocks(roots: Roots | None = None) -> list[dict[str, str]]:
    text = _read(_roots(roots).proc / "cpuinfo") or ""
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


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,6"`` -> [0, 1, 2, 3, 6] (the kernel's CPU-list syntax, as in ``Cpus_allowed_list``).

    Raises ValueError naming the bad part. Taught in day28_1.
    """
    cpus: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or int(m.group(2) or m.group(1)) < int(m.group(1)):
            raise ValueError(f"{part.strip()!r} is not a CPU number or a range like 4-7")
        cpus.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return sorted(cpus)


def affinity(roots: Roots | None = None) -> list[int]:
    """The CPUs this process may run on: ``sched_getaffinity``, or a fake tree's
    ``proc/self/status`` (``Cpus_allowed_list``) when the roots are injected. Taught in day28_1."""
    r = _roots(roots)
    if r.real and hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    for line in (_read(r.proc / "self/status") or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    cpus = [int(b["processor"]) for b in _cpuinfo_blocks(r) if b["processor"].isdigit()]
    return sorted(cpus) or list(range(os.cpu_count() or 1))


def cpu_clusters(roots: Roots | None = None) -> list[dict]:
    """Group logical CPUs by (model, max frequency): one entry per cluster, with each CPU's governor.

    ``model`` comes from ``model name`` (x86) or the ARM ``CPU part``; ``max_mhz`` from cpufreq's
    ``cpuinfo_max_freq``; ``governor`` is the cluster's governor when all its CPUs share one, else
    ``"mixed"``; ``governors`` maps each governor to its CPUs. Taught in day28_1.
    """
    r = _roots(roots)
    clusters: dict[tuple, list[int]] = {}
    parts: dict[tuple, str | None] = {}
    for block in _cpuinfo_blocks(r):
        try:
            cpu = int(block["processor"])
        except ValueError:
            continue
        model = block.get("model name")
        part = block.get("CPU part", "").lower() or None
        if not model and part:
            model = _ARM_PARTS.get(part, f"ARM part {part}")
        max_khz = r.cpufreq(cpu, "cpuinfo_max_freq")
        key = (model or platform.processor() or "unknown",
               int(max_khz) // 1000 if max_khz and max_khz.isdigit() else None)
        clusters.setdefault(key, []).append(cpu)
        parts[key] = part
    if not clusters:
        cpus = affinity(r) if not r.real else list(range(os.cpu_count() or 1))
        clusters[(platform.processor() or "unknown", None)] = cpus
        parts[(platform.processor() or "unknown", None)] = None
    out = []
    for (m, f), cpus in sorted(clusters.items(), key=lambda kv: kv[1][0]):
        govs: dict[str, list[int]] = {}
        for cpu in cpus:
            g = r.cpufreq(cpu, "scaling_governor")
            if g:
                govs.setdefault(g, []).append(cpu)
        gov = None if not govs else next(iter(govs)) if len(govs) == 1 else "mixed"
        out.append({"model": m, "max_mhz": f, "cpus": cpus, "governor": gov, "governors": govs,
                    "part": parts[(m, f)]})
    return out


def core_types(clusters: list[dict]) -> list[dict]:
    """The clusters merged by CPU model, slowest first: an RK3588's A76 pairs (2256 and 2304 MHz) are
    one "big" type, its A55s the "little" one. Ranked by the highest clock of each type, then by
    whether the ARM part is a LITTLE design (when no cpufreq says). Taught in day28_1."""
    types: dict[str, dict] = {}
    for c in clusters:
        t = types.setdefault(c["model"], {"model": c["model"], "cpus": [], "max_mhz": None,
                                          "little_part": (c.get("part") or "") in _LITTLE_PARTS})
        t["cpus"] = sorted(t["cpus"] + list(c["cpus"]))
        if c["max_mhz"] and (t["max_mhz"] or 0) < c["max_mhz"]:
            t["max_mhz"] = c["max_mhz"]
    return sorted(types.values(), key=lambda t: (t["max_mhz"] or 0, not t["little_part"], t["cpus"][-1]))


@dataclass(frozen=True)
class CpuChoice:
    """The CPUs a run uses and why: ``name`` is ``big``, ``little``, ``all`` or ``list``."""

    cpus: tuple[int, ...]
    name: str
    model: str | None
    default: bool = False
    multi: bool = False      # the machine has more than one core type (big.LITTLE)

    def note(self) -> str:
        """``cpus 4-7 (4 × Cortex-A76, the fastest cluster; default, --cpus to change)``. Taught in day28_1."""
        what = {"big": "the fastest cluster" if self.multi else "all cores",
                "little": "the slowest cluster" if self.multi else "all cores",
                "all": "every core", "list": "as asked"}[self.name]
        model = f"{len(self.cpus)} × {self.model}, " if self.model else ""
        how = "; default, --cpus to change" if self.default else ""
        return f"cpus {ranges(list(self.cpus))} ({model}{what}{how})"


def resolve_cpus(spec: str | None = None, *, roots: Roots | None = None,
                 clusters: list[dict] | None = None, allowed: list[int] | None = None) -> CpuChoice:
    """Turn ``--cpus`` into a CPU set: ``None`` (the default) or ``big`` is the fastest core type,
    ``little`` the slowest, ``all`` every CPU, or a list such as ``4-7`` / ``0,2``. Only CPUs this
    process may use count (``allowed``, default the affinity): by default the fastest among them, so
    an outer ``taskset`` or ``rerun --cpus`` wins; an explicit name or list outside them raises
    ValueError naming ``--cpus``. Taught in day28_1.
    """
    clusters = clusters if clusters is not None else cpu_clusters(roots)
    allowed_set = set(allowed if allowed is not None else affinity(roots))
    types = core_types(clusters)
    multi = len(types) > 1
    label = "--cpus " + (spec if spec is not None else "(default)")

    def model_of(cpus: set[int]) -> str | None:
        names = [t["model"] for t in types if cpus & set(t["cpus"])]
        return names[0] if len(names) == 1 else None

    if spec is None:
        for t in reversed(types):
            mine = set(t["cpus"]) & allowed_set
            if mine:
                return CpuChoice(tuple(sorted(mine)), "big", t["model"], default=True, multi=multi)
        return CpuChoice(tuple(sorted(allowed_set)), "all", None, default=True, multi=multi)
    key = spec.strip().lower()
    if key in ("big", "little"):
        t = types[-1] if key == "big" else types[0]
        mine = set(t["cpus"]) & allowed_set
        if not mine:
            raise ValueError(f"{label}: the {key} cluster (cpus {ranges(t['cpus'])}, {t['model']}) is outside "
                             f"the CPUs this process may use ({ranges(sorted(allowed_set))})")
        return CpuChoice(tuple(sorted(mine)), key, t["model"], multi=multi)
    if key == "all":
        return CpuChoice(tuple(sorted(allowed_set)), "all", model_of(allowed_set), multi=multi)
    try:
        cpus = set(parse_cpu_list(spec))
    except ValueError as e:
        raise ValueError(f"{label}: {e}; give a CPU list or big, little or all") from None
    missing = sorted(cpus - allowed_set)
    if missing:
        raise ValueError(f"{label}: CPU(s) {ranges(missing)} are not available to this process "
                         f"(usable: {ranges(sorted(allowed_set))}; see `kestrel-lab runner-info`)")
    return CpuChoice(tuple(sorted(cpus)), "list", model_of(cpus), multi=multi)


def _governor(cpu: int, roots: Roots | None = None) -> str | None:
    """The cpufreq governor of one CPU (a cluster shares one policy): 'performance' is what a
    benchmark wants; 'schedutil' or 'ondemand' let the clock ramp while a measurement runs."""
    return _roots(roots).cpufreq(cpu, "scaling_governor")


def memory_bytes(roots: Roots | None = None) -> int | None:
    for line in (_read(_roots(roots).proc / "meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for mod in ("numpy", "numba", "llvmlite"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # an absent library is a fact to record, not an error
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


GOMP_LIBRARY = "libgomp.so.1"


def libgomp_loadable() -> bool:
    """True when GNU OpenMP (``libgomp.so.1``, Debian's ``libgomp1``) can be loaded. numba's ``omp``
    threading layer links it; without it numba falls back to ``workqueue`` silently and the engine's
    ``GOMP_SPINCOUNT`` tuning does nothing. Taught in day28_1."""
    import ctypes

    try:
        ctypes.CDLL(GOMP_LIBRARY)
    except OSError:
        return False
    return True


def numba_threading(probe: bool = False) -> dict:
    """numba's thread count, the layer asked for (``NUMBA_THREADING_LAYER``), the layer in use, and
    whether libgomp (what the ``omp`` layer needs) is loadable.

    The layer in use (tbb, omp or workqueue) is only known once a parallel kernel has run; with
    ``probe=True`` a one-line ``prange`` kernel (cached) is run to find out — ``runner-info`` and every
    measurement's provenance do. Taught in day28_1.
    """
    try:
        import numba
    except Exception:  # an absent library is a fact to record, not an error
        return {}
    out = {"threads": numba.config.NUMBA_NUM_THREADS, "layer": numba.config.THREADING_LAYER,
           "layer_in_use": None, "libgomp": libgomp_loadable()}
    try:
        out["layer_in_use"] = numba.threading_layer()
    except ValueError:  # not initialised yet
        if probe:
            try:
                _probe_parallel()
                out["layer_in_use"] = numba.threading_layer()
            except Exception as e:  # report, do not fail the fingerprint
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


EMULATED_ENV = "KESTREL_EMULATED"


def emulated(roots: Roots | None = None) -> str | None:
    """What emulates this machine, or None on real hardware. ``KESTREL_EMULATED`` (``make board-smoke``
    sets ``qemu-aarch64-cortex-a76``) says so; an aarch64 process whose /proc/cpuinfo describes x86
    cores (qemu-user passes the host's through) is detected too. Emulated timings are no board's
    timings: the dashboard keeps them out of speed comparisons. Taught in day28_1."""
    env = os.environ.get(EMULATED_ENV, "").strip()
    if env:
        return env
    if platform.machine() in ("aarch64", "arm64"):
        blocks = _cpuinfo_blocks(roots)
        if blocks and any(" sse2" in f" {b.get('flags', '')} " for b in blocks):
            return "qemu-user (detected: an aarch64 process sees x86 cores in /proc/cpuinfo)"
    return None


_ENV_KEYS = ("NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "NUMBA_CPU_NAME", "GOMP_SPINCOUNT",
             "OMP_NUM_THREADS", "QEMU_CPU", EMULATED_ENV)


def fingerprint(probe_threading: bool = False, *, roots: Roots | None = None,
                cpus: list[int] | None = None) -> dict:
    """Everything a figure's provenance says about the machine and the software.

    ``cpus``: the CPUs the measurement runs on (default: this process's affinity), whose governors
    ``warnings`` checks. Taught in day01_3 and day28_1.
    """
    r = _roots(roots)
    clusters = cpu_clusters(r)
    allowed = affinity(r)
    default = resolve_cpus(None, clusters=clusters, allowed=allowed)
    fp = {
        "arch": platform.machine(),
        "clusters": clusters,
        "cores": len(_cpuinfo_blocks(r)) if not r.real else os.cpu_count(),
        "affinity": allowed,
        "default_cpus": list(default.cpus),
        "default_cpus_note": default.note(),
        "memory_bytes": memory_bytes(r),
        "os": f"{platform.system()} {platform.release()}",
        "kernel": f"{platform.release()} {platform.version()}",
        "distro": _distro(),
        "hostname": platform.node(),
        "emulated": emulated(r),
        "versions": _versions(),
        "numba": numba_threading(probe_threading),
        "numba_env": {k: os.environ[k] for k in _ENV_KEYS if k in os.environ},
        "git_commit": git_commit(),
        "executable": sys.executable,
    }
    fp["measured_cpus"] = sorted(cpus) if cpus is not None else allowed
    fp["warnings"] = warnings_for(fp)
    return fp


def warnings_for(fp: dict) -> list[str]:
    """What would make the figures measured on this machine misleading, one sentence each: numba not
    on the ``omp`` layer (libgomp missing), and a measured CPU whose governor is not ``performance``.
    Printed by ``runner-info``, ``bench``, ``generate`` and ``chat``, kept in every provenance.
    Taught in day28_1."""
    out = []
    nb = fp.get("numba") or {}
    layer = nb.get("layer_in_use")
    if layer and layer != "omp":
        out.append(layer_warning(layer, nb.get("libgomp")))
    elif nb and nb.get("libgomp") is False:
        out.append(f"{GOMP_LIBRARY} is not loadable, so numba cannot use its 'omp' threading layer "
                   f"(install it: sudo apt-get install libgomp1)")
    measured = set(fp.get("measured_cpus") or [])
    for c in fp.get("clusters") or []:
        for gov, cpus in (c.get("governors") or {}).items():
            mine = sorted(measured & set(cpus))
            if mine and gov != "performance":
                out.append(f"cpus {ranges(mine)} ({c['model']}) run the {gov!r} cpufreq governor, not "
                           f"'performance': the clock ramps while a measurement runs (see book/rerun.md §4)")
    return out


def layer_warning(layer: str, libgomp: bool | None) -> str:
    """The sentence for numba running on another threading layer than ``omp``. Taught in day28_1."""
    why = f" ({GOMP_LIBRARY} is not loadable: sudo apt-get install libgomp1)" if libgomp is False else ""
    return (f"numba runs on the {layer!r} threading layer, not 'omp'{why}: the engine's GOMP tuning does "
            f"nothing and decode is slower (see book/rerun.md §2)")


def _distro() -> str | None:
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return None


def _governors_text(c: dict) -> str:
    govs = c.get("governors") or {}
    if not govs:
        return ""
    if len(govs) == 1:
        return f", governor {next(iter(govs))}"
    return ", governors " + ", ".join(f"{g} on {ranges(cpus)}" for g, cpus in govs.items())


def describe(fp: dict | None = None) -> str:
    """One line per fact, for ``kestrel-lab runner-info``; the warnings last, each on a ``warning:`` line."""
    fp = fp or fingerprint()
    lines = [f"arch        {fp['arch']}"]
    if fp.get("emulated"):
        lines.append(f"emulated    {fp['emulated']} (not a board's timings)")
    for c in fp["clusters"]:
        freq = f" @ {c['max_mhz']} MHz" if c["max_mhz"] else ""
        lines.append(f"cluster     {len(c['cpus'])} × {c['model']}{freq}  (cpus {ranges(c['cpus'])}"
                     f"{_governors_text(c)})")
    mem = fp["memory_bytes"]
    lines += [
        f"cores       {fp['cores']} (this process may use {ranges(fp['affinity'] or [])})",
    ]
    if fp.get("default_cpus_note"):
        lines.append(f"engine      {fp['default_cpus_note']}")
    if fp.get("measured_cpus") is not None:
        lines.append(f"checked     governors of cpus {ranges(fp['measured_cpus'])}")
    lines += [
        f"memory      {mem / 2**30:.1f} GiB" if mem else "memory      unknown",
        f"os          {fp['os']} ({fp['distro'] or 'unknown distribution'})",
    ]
    if fp.get("kernel"):
        lines.append(f"kernel      {fp['kernel']}")
    lines += [f"{k:<11} {v}" for k, v in fp["versions"].items()]
    nb = fp.get("numba") or {}
    if nb:
        in_use = nb.get("layer_in_use")
        gomp = {True: "loadable", False: "NOT loadable", None: "not checked"}[nb.get("libgomp")]
        lines.append(f"numba layer {in_use or 'not known yet (no parallel kernel ran)'} (asked: {nb.get('layer')}; "
                     f"{nb.get('threads')} threads; {GOMP_LIBRARY} {gomp})")
    for k, v in (fp.get("numba_env") or {}).items():
        lines.append(f"{'env':<11} {k}={v}")
    lines.append(f"git commit  {fp['git_commit'] or 'not a git checkout'}")
    lines += [f"warning: {w}" for w in fp.get("warnings") or []]
    return "\n".join(lines)


def ranges(cpus: list[int]) -> str:
    """[0,1,2,3,6] -> '0-3,6'. Taught in day28_1."""
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


_ranges = ranges
