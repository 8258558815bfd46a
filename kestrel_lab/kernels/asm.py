"""What LLVM made of a numba kernel: instruction counts, vector registers, packed multiplies.

``asm_summary`` reads a compiled kernel's assembly on this machine; ``cross_asm`` compiles a kernel for
another CPU (the board's Cortex-A76) from numba's unoptimized IR. Tooling for the lessons and tests that
check a kernel vectorized; the engine never imports it. Taught in day05_1, day06_1 and day07_1.
"""
from __future__ import annotations

import re
import sys

from numba import njit

# What "vectorized" looks like in each ISA's assembly: the vector registers by width, and the packed
# multiply(-add) instructions an int8/int16/fp32 dot product becomes when LLVM vectorizes it.
ASM_ISAS = {
    "x86_64": {"registers": (("zmm", re.compile(r"%?\bzmm\d+")), ("ymm", re.compile(r"%?\bymm\d+")),
                             ("xmm", re.compile(r"%?\bxmm\d+"))),
               "packed": ("vpmullw", "vpmaddwd", "vpmaddubsw", "vpdpbusd", "vpdpwssd", "vpmulld",
                          "vfmadd231ps", "vfmadd213ps", "vmulps")},
    "aarch64": {"registers": (("v", re.compile(r"\bv\d+\.\d*[bhsd]\b|\bq\d+\b")),),
                "packed": ("sdot", "udot", "smmla", "mla", "mul", "smlal", "smlal2", "smull", "smull2",
                           "sadalp", "fmla", "fmul")},
}
ASM_ISAS["arm64"] = ASM_ISAS["aarch64"]
ASM_ISAS["amd64"] = ASM_ISAS["x86_64"]


def host_isa() -> str:
    """The ISA numba compiles for here: ``x86_64`` or ``aarch64``."""
    import platform

    m = platform.machine().lower()
    return "aarch64" if m in ("aarch64", "arm64") else "x86_64" if m in ("x86_64", "amd64") else m


def parse_asm(asm: str, isa: str | None = None) -> dict:
    """Count instructions, vector-register use and packed multiplies in assembly text of ``isa``.

    Returns ``isa``, ``instructions``, ``vector`` (instructions touching a vector register),
    ``registers`` (count per register class, widest first: zmm/ymm/xmm on x86, v on aarch64),
    ``packed`` (packed multiply(-add) mnemonics with their counts; on aarch64 only their vector
    forms count, since ``mul``/``mla`` also exist for general registers) and the most frequent
    mnemonics in ``top`` (every mnemonic's count is in ``ops``). Taught in day06_1.
    """
    from collections import Counter

    isa = isa or host_isa()
    spec = ASM_ISAS.get(isa)
    if spec is None:
        raise ValueError(f"no assembly rules for ISA {isa!r} (known: {', '.join(sorted(ASM_ISAS))})")
    ops, regs, packed = Counter(), Counter({name: 0 for name, _ in spec["registers"]}), Counter()
    vector = 0
    for line in asm.splitlines():
        s = line.strip()
        if not s or s.startswith((".", "#", "//", ";")) or s.endswith(":"):
            continue
        op = s.split()[0]
        ops[op] += 1
        cls = next((name for name, rx in spec["registers"] if rx.search(s)), None)
        if cls:
            regs[cls] += 1
            vector += 1
        if op in spec["packed"] and (isa.startswith("x86") or isa == "amd64" or cls):
            packed[op] += 1
    return {"isa": isa, "instructions": sum(ops.values()), "vector": vector, "registers": dict(regs),
            "packed": dict(packed.most_common()), "top": ops.most_common(12), "ops": dict(ops)}


def asm_summary(kernel, signature: int = 0) -> dict:
    """What LLVM made of a compiled kernel, for the ISA of this machine (see ``parse_asm``).

    Packed integer multiplies in the hot loop (``vpmullw``/``vpmaddwd`` on x86, ``sdot``/``mla`` on
    the board's A76) mean it vectorized; a wall of scalar ``vaddss``/``fadd s0`` means it did not. On
    x86 the keys ``zmm``/``ymm``/``xmm`` are kept for convenience. Call the kernel once first so that
    it is compiled. Taught in day05_1; day06_1 reads the assembly in depth.
    """
    if not kernel.signatures:
        raise ValueError(f"{kernel.__name__} has not been compiled yet: call it once first")
    import warnings

    sig = kernel.signatures[signature]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = parse_asm(kernel.inspect_asm(sig))
    if not summary["instructions"]:
        # Loaded from numba's on-disk cache: machine code without its assembly text. Compile a
        # private, uncached copy of the same function for the same signature to see it.
        opts = {k: v for k, v in kernel.targetoptions.items() if k in ("parallel", "fastmath")}
        fresh = njit(**opts)(kernel.py_func)
        fresh.compile(sig)
        summary = parse_asm(fresh.inspect_asm(sig))
    for name in ("zmm", "ymm", "xmm"):
        summary[name] = summary["registers"].get(name, 0)
    return summary


def _ir_main(argv: list[str]) -> None:
    """``python -m kestrel_lab.kernels.asm MODULE NAME SIGNATURE``: the LLVM IR of one numba function,
    compiled without numba's cache for ``SIGNATURE`` (numba types as a Python tuple). ``cross_asm`` runs
    it in a child with ``NUMBA_OPT=0``, so no host vectorization is baked into the IR it retargets."""
    import importlib

    import numba.types as nt

    mod, name, signature = argv
    f = njit(getattr(importlib.import_module(mod), name).py_func)
    sig = eval(signature, {"__builtins__": {}}, vars(nt))   # type names only: uint8[::1], int64, …
    f.compile(sig)
    print(f.inspect_llvm(sig))


def cross_asm(func: str, signature: str, cpus=("cortex-a76",), triple: str = "aarch64-unknown-linux-gnu") -> dict:
    """Assembly of the numba function ``func`` ("module:name") for other CPUs, e.g. the board's
    ``cortex-a76``, as {cpu: text}: numba compiles only for the host, so its *unoptimized* LLVM IR
    (``NUMBA_OPT=0`` in a subprocess, so no x86 vectorization is baked in) is retargeted to
    ``triple``, optimized at -O3 with each CPU's cost model and compiled by the same LLVM.
    ``signature``: numba types as a Python tuple, e.g. ``"(uint8[::1], int8[:, ::1])"``. The loop
    structure is numba's own; what this cannot check is the run itself (the board tests do).
    Taught in day07_1."""
    import os
    import subprocess

    import llvmlite.binding as llvm

    mod, name = func.split(":")
    env = dict(os.environ, NUMBA_OPT="0")
    text = subprocess.run([sys.executable, "-m", "kestrel_lab.kernels.asm", mod, name, signature], env=env,
                          capture_output=True, text=True, check=True).stdout
    text = re.sub(r"^target (triple|datalayout) = .*$", "", text, flags=re.M)
    text = re.sub(r'"target-(cpu|features)"="[^"]*"', "", text)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    out = {}
    for cpu in cpus:
        tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, opt=3)
        module = llvm.parse_assembly(text)
        module.triple, module.data_layout = triple, str(tm.target_data)
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = pto.slp_vectorization = True        # as numba's own pipeline at -O3
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)
        out[cpu] = tm.emit_assembly(module)
    return out


SDOT_SIGNATURE = "(uint8[::1], int8[:, ::1], float32[:, ::1], float32[::1], int64)"   # _dot_q4_0_signed's


if __name__ == "__main__":
    _ir_main(sys.argv[1:])
