"""Which CPU features this host has, as the kernel registry needs them: ``avx512_vnni``, ``avx2``, the A76's
``dotprod`` (``sdot``) and the machine name.

Read from /proc/cpuinfo's line for this ISA and, on aarch64, the kernel's AT_HWCAP word (which qemu
emulates for the chosen CPU, so an emulated board reports the board's features, not the x86 host's).
Taught in day06_1.
"""
from __future__ import annotations

import platform
from functools import lru_cache

HWCAP_ASIMDDP = 1 << 20     # AT_HWCAP bit of the A76's dot product (Linux arch/arm64 uapi hwcap.h)
HWCAP_BITS = {"asimddp": HWCAP_ASIMDDP}
AT_HWCAP = 16


def _hwcap() -> int | None:
    """The kernel's AT_HWCAP word (``getauxval``), None where libc has no ``getauxval``."""
    import ctypes

    try:
        fn = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return int(fn(AT_HWCAP))


def features_from(cpuinfo: str, machine: str, hwcap: int | None = None) -> frozenset[str]:
    """The features in ``cpuinfo`` (the text of /proc/cpuinfo) that belong to ``machine``'s ISA.

    Only the line of that ISA counts: ``flags`` on x86, ``Features`` on aarch64. Under qemu-user an
    emulated arm64 process reads the **x86 host's** /proc/cpuinfo, whose ``flags`` would claim
    ``avx512_vnni`` and pick x86 kernels that cannot run there; so on aarch64 the ``flags`` line is
    ignored and the kernel's AT_HWCAP word (``hwcap``, which qemu emulates for the chosen CPU) adds
    ``asimddp``. ARM's ``asimddp`` is reported as ``dotprod`` (the A76's ``sdot``)."""
    m = machine.lower()
    arm = m in ("aarch64", "arm64")
    key = "Features" if arm else "flags" if m in ("x86_64", "amd64", "i686", "i386") else None
    feats: set[str] = set()
    for line in cpuinfo.splitlines():
        k, _, value = line.partition(":")
        if key is not None and k.strip() == key:
            feats.update(value.split())
            break
    if arm and hwcap is not None:
        feats.update(name for name, bit in HWCAP_BITS.items() if hwcap & bit)
    if "asimddp" in feats:
        feats.add("dotprod")
    feats.add(m)
    return frozenset(feats)


@lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """The CPU features kernels may require on this host (``features_from`` of /proc/cpuinfo, and
    AT_HWCAP on aarch64). Taught in day06_1."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        text = ""
    machine = platform.machine()
    return features_from(text, machine, _hwcap() if machine.lower() in ("aarch64", "arm64") else None)
