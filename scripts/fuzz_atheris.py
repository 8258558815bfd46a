"""Coverage-guided fuzzing of one loader with atheris (libFuzzer for Python). Opt-in: not part of
``make test`` (needs ``pip install atheris==3.0.0``; the tests fuzz with Hypothesis).

    python scripts/fuzz_atheris.py vqf -runs=20000          # or: vocab, safetensors, config
    python scripts/fuzz_atheris.py config -max_total_time=60

The seed is the loader's real small file from ``kestrel_lab.fuzz.targets``; libFuzzer mutates the
bytes worth mutating (header and directory; the whole file for config.json and vocab.bin), the rest
of the seed is appended unchanged. Any outcome other than a load or the loader's own error class
naming the file is raised, so libFuzzer stops, prints it and saves the input as ``crash-*``. At the
every 1,000 cases the script prints cases run, cases per second and the outcomes (libFuzzer
prints its own exec/s).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

try:
    import atheris
except ImportError:
    sys.exit("atheris is not installed: pip install atheris==3.0.0 (opt-in; the tests use Hypothesis)")

from kestrel_lab import config, fuzz, limits, safetensors
from kestrel_lab.vocab import loader
from kestrel_lab.vqf import format as vqf_format, reader

# Coverage for the checking code, function by function: instrumenting whole modules would rewrite the
# bytecode of their numba kernels too, which numba then cannot compile.
for fn in (reader._parse, reader._parse_directory, vqf_format.config_from_header, vqf_format.unpack_str,
           vqf_format.source_from_header, limits.check_config, limits.Bound.check, config._parse,
           safetensors.parse_header, loader.parse_vocab_bin):
    atheris.instrument_func(fn)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in fuzz.BUILDERS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(fuzz.BUILDERS)}}} [libFuzzer flags]")
    name = sys.argv.pop(1)
    work = Path(tempfile.mkdtemp(prefix=f"atheris-{name}-"))
    target = fuzz.targets(work, [name])[name]
    corpus = work / "corpus"
    corpus.mkdir()
    (corpus / "seed").write_bytes(target.seed[:target.hot])
    case = work / f"case{target.suffix}"
    tail = target.seed[target.hot:]
    counts: dict[str, int] = {}
    t0 = time.perf_counter()

    def one_input(data: bytes) -> None:
        if target.hot == len(target.seed):          # config.json: the input is the whole file
            full = data
        else:                                        # a new prefix; the rest of the seed unchanged
            full = data + (tail if len(data) >= target.hot else target.seed[len(data):])
        out = fuzz.run(target, full, case)
        counts[out.status] = counts.get(out.status, 0) + 1
        if sum(counts.values()) % 1000 == 0:
            report()
        if out.finding:
            raise RuntimeError(f"{name}: {out.status}: {out.error}: {out.message}")

    def report() -> None:
        n = sum(counts.values())
        s = time.perf_counter() - t0
        print(f"\n{name}: {n:,} cases in {s:.1f} s = {n / s:,.0f} cases/s; outcomes {counts}", file=sys.stderr)

    flags = [f"-max_len={target.hot}"] + ([] if any(a.startswith("-artifact_prefix") for a in sys.argv)
                                            else [f"-artifact_prefix={work}/"])   # crash-* files go there
    atheris.Setup(sys.argv + [str(corpus)] + flags, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
