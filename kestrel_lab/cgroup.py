"""Run a command under a memory limit: a child process inside a fresh memory cgroup, always removed.

How a "file larger than memory" behaves (day22_3) can be measured on any Linux machine where we are
root and the memory controller is mounted, without a small board: the kernel charges a cgroup's
anonymous memory **and its page cache** against its limit, so a 2.7 GB model mapped by a process in a
1 GiB cgroup has to be paged in and out as a 16 GB board pages the real 17.7 GB file.

- **cgroup v2** (one unified tree, ``cgroup.controllers`` at its top): the limit is ``memory.max``,
  ``memory.swap.max`` is set to 0 when the file exists (otherwise the limit would only push pages to
  swap), the peak is ``memory.peak``, OOM kills are counted in ``memory.events``. The memory controller
  must be listed in the parent's ``cgroup.controllers`` and enabled for its children in its
  ``cgroup.subtree_control`` (``+memory`` is written there when missing: the kernel refuses it when the
  parent itself holds processes — the "no internal processes" rule — and we say so).
- **cgroup v1** (one tree per controller, ``/sys/fs/cgroup/memory``): the limit is
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` to the same value when present: no
  swap), the peak ``memory.max_usage_in_bytes``, OOM kills in ``memory.oom_control``.

The new cgroup is created under the cgroup this process is in (``/proc/self/cgroup``), so a limit set
on us by a container still applies. ``run`` starts the command through a tiny launcher that writes its
own pid into ``cgroup.procs`` and then ``exec``s the command — the command is inside the limit from its
first instruction — and removes the cgroup afterwards whatever happened: success, failure, timeout
(the session's processes are killed, then any process still in the cgroup) or an exception in the
parent. ``unavailable_reason`` says in words why no limit can be set here (not root, no memory
controller, not Linux), for the "not measured here" record. Taught in day22_3.
"""
from __future__ import annotations

import errno
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
_counter = itertools.count()

LAUNCHER = Path(__file__).with_name("cgroup_launch.py")   # joins the cgroup, then execs the command


class Unavailable(RuntimeError):
    """No memory cgroup can be made here; ``str(e)`` says why (for a "not measured here" record)."""


@dataclass(frozen=True)
class Hierarchy:
    """Where a memory cgroup can be created: ``version`` 1 or 2, ``parent`` (the cgroup this process is
    in, in the tree that has the memory controller) and ``mount`` (that tree's top)."""
    version: int
    parent: Path
    mount: Path


def _self_paths(proc_self_cgroup: Path) -> dict[str, str]:
    """``/proc/self/cgroup`` as {controller: path}; the v2 line ("0::/path") is under the key ""."""
    out: dict[str, str] = {}
    try:
        text = Path(proc_self_cgroup).read_text(encoding="utf-8")
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        for c in (ctrls.split(",") if ctrls else [""]):
            out[c] = path
    return out


def _under(mount: Path, rel: str) -> Path:
    p = mount / rel.lstrip("/")
    return p if p.is_dir() else mount


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text(encoding="utf-8").split())
    except OSError:
        return set()


def detect(root: os.PathLike = ROOT, proc_self_cgroup: os.PathLike = PROC_SELF_CGROUP) -> Hierarchy:
    """The hierarchy a memory cgroup would be created in: cgroup v2 with the memory controller (the
    unified tree at ``root``, or ``root/unified`` on a hybrid system), else cgroup v1's
    ``root/memory``. Raises ``Unavailable`` naming what is missing. Does not need root. Taught in day22_3."""
    root = Path(root)
    own = _self_paths(Path(proc_self_cgroup))
    for mount in (root, root / "unified"):
        if (mount / "cgroup.controllers").exists():
            if "memory" in _words(mount / "cgroup.controllers"):
                parent = _under(mount, own.get("", "/"))
                if "memory" not in _words(parent / "cgroup.controllers"):
                    raise Unavailable(f"cgroup v2: the memory controller is not available in {parent} "
                                      f"({parent / 'cgroup.controllers'} does not list it)")
                return Hierarchy(2, parent, mount)
    v1 = root / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        return Hierarchy(1, _under(v1, own.get("memory", "/")), v1)
    if (root / "cgroup.controllers").exists() or (root / "unified" / "cgroup.controllers").exists():
        raise Unavailable(f"cgroup v2 is mounted at {root} but without the memory controller, and there is no "
                          f"cgroup v1 memory tree ({v1})")
    raise Unavailable(f"no cgroup memory controller under {root} (neither cgroup v2 nor {v1})")


def unavailable_reason(root: os.PathLike = ROOT, proc_self_cgroup: os.PathLike = PROC_SELF_CGROUP,
                       euid: int | None = None) -> str | None:
    """None when ``run`` can set a memory limit here, else why not, in words. Taught in day22_3."""
    if not sys.platform.startswith("linux"):
        return f"memory cgroups are a Linux feature (this is {sys.platform})"
    euid = os.geteuid() if euid is None else euid
    try:
        h = detect(root, proc_self_cgroup)
    except Unavailable as e:
        return str(e)
    if euid != 0 and not os.access(h.parent, os.W_OK):
        return f"not root (uid {euid}) and {h.parent} is not writable: creating a cgroup needs root"
    return None


def parse_size(text: "str | int") -> int:
    """Bytes from "1G", "1GiB", "512M", "1.5g", "300000000" (K/M/G/T are powers of 1024, as the
    kernel's own cgroup files read them). Taught in day22_3."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]?)(i?b)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"memory size {text!r}: expected a number with an optional K/M/G/T suffix, e.g. 1G")
    n = float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2).lower() or "_")
    if n < 1:
        raise ValueError(f"memory size {text!r}: must be at least one byte")
    return int(n)


def _rmdir(path: Path) -> None:
    """Remove a cgroup directory (its control files go with it). Tests replace this for fake trees."""
    os.rmdir(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class MemoryCgroup:
    """One memory cgroup: ``create()`` (mkdir, limit, no swap), ``procs()``, ``peak()``, ``oom_kills()``,
    ``remove()`` (kill what is left inside, wait, rmdir). ``limit`` None: no limit (the same
    accounting, e.g. the peak of an unlimited run). A context manager: removed on leaving. Taught in day22_3."""
    limit: int | None
    hierarchy: Hierarchy
    name: str = field(default_factory=lambda: f"kestrel-lab-{os.getpid()}-{next(_counter)}")
    path: Path | None = None

    def create(self) -> "MemoryCgroup":
        h = self.hierarchy
        if h.version == 2 and "memory" not in _words(h.parent / "cgroup.subtree_control"):
            try:
                (h.parent / "cgroup.subtree_control").write_text("+memory", encoding="ascii")
            except OSError as e:
                why = (" (cgroup v2 allows it only where the cgroup itself holds no processes)"
                       if e.errno == errno.EBUSY else "")
                raise Unavailable(f"cannot enable the memory controller for the children of {h.parent}: "
                                  f"{e.strerror}{why}") from None
        path = h.parent / self.name
        try:
            path.mkdir()
        except OSError as e:
            raise Unavailable(f"cannot create {path}: {e.strerror}") from None
        self.path = path
        try:
            if self.limit is not None:
                if h.version == 2:
                    (path / "memory.max").write_text(str(self.limit), encoding="ascii")
                    if (path / "memory.swap.max").exists():
                        (path / "memory.swap.max").write_text("0", encoding="ascii")
                else:
                    (path / "memory.limit_in_bytes").write_text(str(self.limit), encoding="ascii")
                    if (path / "memory.memsw.limit_in_bytes").exists():
                        (path / "memory.memsw.limit_in_bytes").write_text(str(self.limit), encoding="ascii")
        except BaseException:
            self.remove()
            raise
        return self

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def procs(self) -> list[int]:
        """The pids in the cgroup now (fewer once they exit)."""
        try:
            return [int(p) for p in self.procs_file.read_text(encoding="ascii").split()]
        except (OSError, ValueError):
            return []

    def _read_int(self, name: str) -> int | None:
        try:
            return int((self.path / name).read_text(encoding="ascii").split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def peak(self) -> int | None:
        """Most memory (anonymous + page cache) charged at once: v2 ``memory.peak``, v1 ``max_usage_in_bytes``."""
        return self._read_int("memory.peak" if self.hierarchy.version == 2 else "memory.max_usage_in_bytes")

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer killed inside the cgroup (None where not counted)."""
        fname = "memory.events" if self.hierarchy.version == 2 else "memory.oom_control"
        try:
            text = (self.path / fname).read_text(encoding="ascii")
        except OSError:
            return None
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return None

    def kill_all(self) -> None:
        """SIGKILL every process still in the cgroup (v2: ``cgroup.kill`` where the kernel has it)."""
        if self.path is None:
            return
        if self.hierarchy.version == 2 and (self.path / "cgroup.kill").exists():
            try:
                (self.path / "cgroup.kill").write_text("1", encoding="ascii")
            except OSError:
                pass
        for pid in self.procs():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def remove(self, wait_s: float = 10.0) -> None:
        """Kill what is left inside, wait for it to go, remove the directory. Safe to call twice."""
        if self.path is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            left = [p for p in self.procs() if _alive(p)]
            if left:
                self.kill_all()
            try:
                if not left:
                    _rmdir(self.path)
                    self.path = None
                    return
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise OSError(errno.EBUSY, f"{self.path}: processes {left} are still inside after {wait_s:.0f} s")
            time.sleep(0.02)

    def __enter__(self) -> "MemoryCgroup":
        return self.create() if self.path is None else self

    def __exit__(self, *exc) -> None:
        self.remove()


@dataclass
class Result:
    """What ``run`` saw: the command's ``returncode`` (None after a timeout), its output, the seconds,
    the cgroup's peak and OOM kills, and where it ran."""
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    limit: int | None
    peak_bytes: int | None
    oom_kills: int | None
    version: int
    cgroup: str


def run(cmd: list[str], limit: "int | str | None", timeout: float | None = None, env: dict | None = None,
        cwd=None, hierarchy: Hierarchy | None = None) -> Result:
    """Run ``cmd`` in a new memory cgroup with ``limit`` bytes (``parse_size`` strings too; None: no
    limit, the same accounting) and remove the cgroup afterwards — on success, on failure, on
    ``timeout`` (then every process of the command is killed and ``timed_out`` is True) and on an
    exception here. Raises ``Unavailable`` (with the reason) when no cgroup can be made. Taught in day22_3."""
    h = hierarchy or detect()
    lim = None if limit is None else parse_size(limit)
    cg = MemoryCgroup(lim, h)
    with cg:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, str(LAUNCHER), str(cg.procs_file), *map(str, cmd)], env=env, cwd=cwd,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        timed_out = False
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            cg.kill_all()
            out, err = p.communicate()
        except BaseException:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            raise
        seconds = time.perf_counter() - t0
        peak, ooms = cg.peak(), cg.oom_kills()
        where = str(cg.path)
    return Result(None if timed_out else p.returncode, out, err, seconds, timed_out, lim, peak, ooms, h.version, where)


__all__ = ["Hierarchy", "MemoryCgroup", "Result", "Unavailable", "detect", "parse_size", "run", "unavailable_reason"]
