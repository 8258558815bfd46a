"""What Linux's /proc says: this process's resident memory, its peak, storage reads, the umask; the load.

One reader per file, so every caller parses ``/proc/self/status`` the same way. Each function degrades
where /proc is missing (macOS, a restricted container): ``getrusage`` for the resident size, ``None`` for
a field that cannot be read. ``memory_snapshot`` is the exception: it raises, naming the file, because
a lesson that shows the kernel's accounting must not silently show nothing. Taught in day17_1, day23_3 and day24_1.
"""
from __future__ import annotations

import os
import resource
import sys
from pathlib import Path


def status_fields(pid: "int | str" = "self") -> dict[str, str]:
    """The fields of ``/proc/PID/status`` as text (``{"VmRSS": "12345 kB", "Umask": "0022", …}``); empty
    where the file cannot be read."""
    out: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if sep:
                    out[key] = value.strip()
    except OSError:
        pass
    return out


def status_bytes(*keys: str, pid: "int | str" = "self") -> dict[str, int]:
    """The ``kB`` fields ``keys`` of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile`` …)
    in bytes; a field that is absent or not a size is left out."""
    out = {}
    for key, value in status_fields(pid).items():
        parts = value.split()
        if key in keys and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[key] = int(parts[0]) * 1024
    return out


def umask() -> int | None:
    """The process umask as Linux reports it (``Umask:``), None where it does not."""
    value = status_fields().get("Umask")
    try:
        return int(value, 8) if value else None
    except ValueError:
        return None


def load_average() -> tuple[float, float, float] | None:
    """The system's 1-, 5- and 15-minute load averages (``os.getloadavg``, which reads ``/proc/loadavg``
    on Linux), or None where the OS keeps none (Windows) or will not say.

    The one reader of the load average: a figure's provenance, the busy-machine verdict
    (``measure.machine_state``), the benchmarks' reports and ``kestrel-lab rerun --quiet-load`` all ask
    here, so "unknown" means the same thing everywhere. Taught in day23_3.
    """
    getloadavg = getattr(os, "getloadavg", None)
    if getloadavg is None:
        return None
    try:
        one, five, fifteen = getloadavg()
    except OSError:
        return None
    return float(one), float(five), float(fifteen)


def rss_bytes() -> int:
    """This process's resident set size now (``/proc/self/statm``; elsewhere the peak from getrusage).

    Taught in day17_1."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _ru_maxrss()


def _ru_maxrss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class PeakRSS:
    """The true peak resident set size inside a ``with`` block (Linux).

    On entry the kernel's high-water mark of this process (``VmHWM``) is reset to the current RSS by
    writing 5 to ``/proc/self/clear_refs``; on exit ``VmHWM`` is the peak reached inside the block.
    (``getrusage``'s ``ru_maxrss`` cannot be used for this: it is never reset, and a child process
    even inherits its parent's peak across ``exec``.) ``exact`` is False where the reset is not
    available; ``peak`` is then the high-water mark since the process started. Taught in day17_1.
    """

    def __enter__(self) -> "PeakRSS":
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            self.exact = True
        except OSError:
            self.exact = False
        self.start = rss_bytes()
        self.peak = self.start
        return self

    def __exit__(self, *exc) -> None:
        self.peak = max(self.start, status_bytes("VmHWM").get("VmHWM") or _ru_maxrss())

    @property
    def growth(self) -> int:
        """Bytes the peak rose above the resident size at entry."""
        return max(0, self.peak - self.start)


def process_usage() -> dict:
    """This process so far: its peak resident set (``VmHWM``, or the larger peak of a waited-for child),
    bytes, and the seconds since it started (None where /proc cannot say). A notebook's ``Recorder``
    saves it, so a book build can report each kernel's peak and time."""
    own = status_bytes("VmHWM").get("VmHWM") or _ru_maxrss()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    seconds = None
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            seconds = round(float(fh.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        pass
    return {"peak_rss_bytes": max(own, kids), "seconds": seconds}


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (``/proc/PID/task/*/children``; empty where unreadable)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                out += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            pass
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children …), not ``pid`` itself."""
    out, todo = [], children(pid)
    while todo:
        c = todo.pop()
        out.append(c)
        todo += children(c)
    return out


class TreePeak:
    """The peak resident memory of the processes below ``root`` (default: this process) while a ``with``
    block runs — a Jupyter kernel and whatever it starts, as the book build runs a notebook.

    A thread samples every ``interval`` s: each process's ``VmHWM`` (its own exact peak, kept by the
    kernel) and the sum of their ``VmRSS`` now. ``peak`` is the larger of the biggest single ``VmHWM``
    and the biggest sum seen, so a lone kernel's peak is exact, and several processes at once are
    counted together (to within the sampling).
    """

    def __init__(self, root: int | None = None, interval: float = 0.1, include_root: bool = False):
        self.root, self.interval, self.include_root = root or os.getpid(), interval, include_root
        self.hwm: dict[int, int] = {}
        self.sum_peak = 0

    def sample(self) -> None:
        pids = descendants(self.root) + ([self.root] if self.include_root else [])
        total = 0
        for pid in pids:
            st = status_bytes("VmHWM", "VmRSS", pid=pid)
            total += st.get("VmRSS", 0)
            self.hwm[pid] = max(self.hwm.get(pid, 0), st.get("VmHWM", 0))
        self.sum_peak = max(self.sum_peak, total)

    @property
    def peak(self) -> int:
        return max([self.sum_peak, *self.hwm.values()])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "TreePeak":
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="TreePeak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def io_read_bytes() -> int | None:
    """``read_bytes`` of /proc/self/io: bytes this process made the kernel fetch from storage (None where
    the file does not exist). Taught in day22_3."""
    try:
        with open("/proc/self/io", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_parts() -> dict:
    """This process's resident set now: total, anonymous (copies, activations, KV cache) and file-backed
    (mapped weight pages), bytes (None where unknown). Taught in day22_3."""
    st = status_bytes("VmRSS", "RssAnon", "RssFile")
    return {"rss": st.get("VmRSS"), "anon": st.get("RssAnon"), "file": st.get("RssFile")}


def memory_snapshot(pid: "int | str" = "self") -> dict:
    """A process's memory as the kernel counts it, in bytes: the fields of ``/proc/PID/smaps_rollup``
    plus ``RssAnon`` / ``RssFile`` / ``RssShmem`` of ``/proc/PID/status``.

    ``Rss`` counts resident pages; ``Pss`` divides each page among the processes mapping it (a file
    mapped by two processes counts half in each); ``Shared_*`` / ``Private_*`` say whether another
    process maps the page too; ``*_Clean`` pages can be dropped and re-read from their file,
    ``*_Dirty`` ones cannot; ``Anonymous`` is memory backed by no file (heap, copies made at load, the
    KV cache), ``AnonHugePages`` the part of it in 2 MiB transparent huge pages. Linux only: raises
    ``OSError`` naming the file when it cannot be read. Taught in day24_1.
    """
    out: dict[str, int] = {}
    for name, wanted in (("smaps_rollup", None), ("status", ("RssAnon", "RssFile", "RssShmem"))):
        path = Path("/proc") / str(pid) / name
        try:
            text = path.read_text(encoding="ascii", errors="replace")
        except OSError as e:
            raise OSError(f"{path}: cannot read it ({e.strerror}); memory_snapshot needs Linux ≥ 4.14") from e
        for lineno, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if len(parts) < 3 or parts[-1] != "kB" or (wanted and parts[0].rstrip(":") not in wanted):
                continue
            try:
                out[parts[0].rstrip(":")] = int(parts[-2]) * 1024
            except ValueError:
                raise ValueError(f"{path}:{lineno}: expected '<field>: <number> kB', got {line!r}") from None
    if "Rss" not in out:
        raise ValueError(f"/proc/{pid}/smaps_rollup: no 'Rss:' field")
    return out
