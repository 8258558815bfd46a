"""The steps of ``make board-smoke`` that run inside the emulated arm64 Debian root, and its table.

``scripts/board-smoke.sh`` (root, on the host) installs qemu-user-static, registers it, builds the
root, installs the operator page's Debian packages and clones the checkout into it; then it runs
``python3 scripts/board_smoke.py run`` inside the root as the unprivileged user ``kestrel``, with
``QEMU_CPU=cortex-a76 NUMBA_CPU_NAME=cortex-a76 KESTREL_EMULATED=qemu-aarch64-cortex-a76``. Each step
is a command from the operator page (book/rerun.md) or the README, run with a time limit; its output
goes to ``<log dir>/<step>.log``, its result (step, status, seconds, note) to one line of a TSV file
that the host side appends its own steps to. ``python3 scripts/board_smoke.py table FILE`` prints
them as one table, and exits non-zero unless every step is ``ok``.

Only the standard library: this runs on the root's system Python before ``make env`` made .venv.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATUSES = ("ok", "FAIL", "timeout", "warning", "skipped")
# A line that warns: Python's warnings (``RuntimeWarning: …``), numba's, ours (``warning: …``).
WARNING_LINE = re.compile(r"^.*(\b\w*Warning\b|\bwarning:).*$", re.MULTILINE)
# The commands that must print no warning on any architecture (issue 16 §6).
QUIET_STEPS = ("runner-info", "vocab compile", "convert", "generate", "chat", "bench", "rerun")
POEM_PROMPT = "《夜思》\\n作者：李白\\n"


@dataclass
class Result:
    step: str
    status: str
    seconds: float
    note: str = ""

    def tsv(self) -> str:
        def clean(s):
            return re.sub(r"[\t\r\n]+", " ", s).strip()

        return f"{clean(self.step)}\t{self.status}\t{self.seconds:.1f}\t{clean(self.note)}\n"


@dataclass
class Step:
    """One command of the smoke run. ``check(output)`` returns a problem (a sentence) or None."""

    name: str
    argv: list[str]
    timeout: float
    quiet: bool = False                       # a warning line in the output is a failure
    stdin: str | None = None
    env: dict = field(default_factory=dict)
    check: object = None


def warnings_in(text: str) -> list[str]:
    """The lines of ``text`` that are warnings (``…Warning``, ``warning:``), in order."""
    return [m.group(0).strip() for m in WARNING_LINE.finditer(text)]


def run_step(step: Step, log_dir: Path, cwd: Path = REPO) -> Result:
    """Run one step with its time limit; its output (stdout and stderr together) goes to its log."""
    log = log_dir / (re.sub(r"[^A-Za-z0-9._-]+", "-", step.name).strip("-") + ".log")
    env = dict(os.environ, **step.env)
    t0 = time.monotonic()
    try:
        p = subprocess.run(step.argv, cwd=cwd, env=env, input=step.stdin, capture_output=True, text=True,
                           timeout=step.timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = _text(e.stdout) + _text(e.stderr)
        log.write_text(f"$ {' '.join(step.argv)}\n{out}\n[stopped after {step.timeout:g} s]\n", encoding="utf-8")
        return Result(step.name, "timeout", time.monotonic() - t0, f"over the {step.timeout:g} s limit; see {log.name}")
    except OSError as e:
        return Result(step.name, "FAIL", time.monotonic() - t0, f"cannot start {step.argv[0]}: {e}")
    seconds = time.monotonic() - t0
    log.write_text(f"$ {' '.join(step.argv)}\n{out}\n[exit {rc}, {seconds:.1f} s]\n", encoding="utf-8")
    if rc != 0:
        tail = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        return Result(step.name, "FAIL", seconds, f"exit {rc}: {tail[0][:160]} (see {log.name})")
    if step.check is not None:
        problem = step.check(out)
        if problem:
            return Result(step.name, "FAIL", seconds, f"{problem} (see {log.name})")
    warned = warnings_in(out) if step.quiet else []
    if warned:
        return Result(step.name, "warning", seconds, f"{len(warned)} warning line(s), first: {warned[0][:160]}")
    return Result(step.name, "ok", seconds, _summary(out))


def _text(b) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")


def _summary(out: str) -> str:
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def read_results(path: Path) -> list[Result]:
    """The TSV lines both halves of the smoke run append to (step, status, seconds, note)."""
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 3 or parts[1] not in STATUSES:
            raise ValueError(f"{path}: line {i} is not 'step<TAB>status<TAB>seconds[<TAB>note]': {line!r}")
        try:
            seconds = float(parts[2])
        except ValueError:
            raise ValueError(f"{path}: line {i}: seconds {parts[2]!r} is not a number") from None
        out.append(Result(parts[0], parts[1], seconds, parts[3] if len(parts) > 3 else ""))
    return out


def format_table(results: list[Result], title: str = "make board-smoke") -> str:
    """One table: step, status, seconds (and a note), then the total and the verdict."""
    w = max([len("step")] + [len(r.step) for r in results])
    lines = [title, f"{'step':<{w}}  {'status':<8} {'seconds':>8}  note", f"{'-' * w}  {'-' * 8} {'-' * 8}  ----"]
    for r in results:
        lines.append(f"{r.step:<{w}}  {r.status:<8} {r.seconds:>8.1f}  {r.note}")
    total = sum(r.seconds for r in results)
    bad = [r.step for r in results if r.status != "ok"]
    lines.append(f"{'total':<{w}}  {'':<8} {total:>8.1f}")
    lines.append("all ok" if results and not bad else f"NOT ok: {', '.join(bad) or 'no step ran'}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the steps
def expected_vocab_sha256(repo: Path = REPO) -> str:
    """The sha256 of the article's vocab.bin, as its figures file records it."""
    doc = json.loads((repo / "data/measurements/article-rk3588/day18_2.json").read_text(encoding="utf-8"))
    return next(f["value"] for f in doc["figures"] if f["name"] == "vocab_bin_sha256")


def expected_poem(repo: Path = REPO) -> str:
    """What the poem model must recite after POEM_PROMPT (greedy.json, checked with transformers)."""
    cases = json.loads((repo / "data/models/qwen3-tiny-poem/greedy.json").read_text(encoding="utf-8"))["cases"]
    case = next(c for c in cases if c["prompt"] == POEM_PROMPT.replace("\\n", "\n"))
    return case["greedy_text"].split("<|endoftext|>")[0].strip()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _contains(*needles: str):
    def check(out: str):
        missing = [n for n in needles if n not in out]
        return f"output lacks {missing[0]!r}" if missing else None
    return check


def steps(out_dir: Path, test_limit: float, runner: str = "emu-a76", repo: Path = REPO) -> list[Step]:
    """The smoke run's steps inside the root, in order (each a command the operator page names)."""
    kl = str(repo / ".venv/bin/kestrel-lab")
    vocab, vqf = out_dir / "vocab.bin", out_dir / "qwen3-tiny-poem.vqf"
    cold = tempfile.mkdtemp(prefix="kestrel-cold-cache-", dir=out_dir)
    sha = expected_vocab_sha256(repo)
    poem = expected_poem(repo)

    def vocab_check(out: str):
        got = sha256_of(vocab) if vocab.exists() else "no file"
        return None if got == sha else f"vocab.bin sha256 {got[:16]}… is not the article's {sha[:16]}…"

    gen = [kl, "generate", str(vqf), "--prompt", POEM_PROMPT, "--max-new", "48"]
    return [
        Step("make env", ["make", "env"], 3600),
        Step("runner-info", [kl, "runner-info"], 600, quiet=True,
             check=_contains("numba layer omp", "emulated    ")),
        Step("vocab compile", [kl, "vocab", "compile", "-o", str(vocab)], 900, quiet=True, check=vocab_check),
        Step("convert", [kl, "convert", str(repo / "data/models/qwen3-tiny-poem"), "-o", str(vqf), "-q"], 900,
             quiet=True),
        Step("generate (empty cache)", gen, 1800, quiet=True, env={"KESTREL_CACHE_DIR": cold},
             check=_contains(poem)),
        Step("generate (cached)", gen, 900, quiet=True, env={"KESTREL_CACHE_DIR": cold}, check=_contains(poem)),
        Step("chat", [kl, "chat", str(vqf), "--max-new", "16", "--no-think"], 900, quiet=True,
             stdin="你好\n", check=_contains("助手> ")),
        Step("bench", [kl, "bench", "--config", str(repo / "data/models/qwen3-tiny-poem/config.json"),
                       "--threads", "1", "--decode-tokens", "8"], 2400, quiet=True,
             check=_contains("PyTorch: skipped")),
        Step("make board-test", ["make", "board-test", f"BOARD_TEST_LIMIT_S={int(test_limit)}"], test_limit + 600),
        Step("rerun --days 16-18", [kl, "rerun", "--runner", runner, "--days", "16-18"], 5400, quiet=True),
    ]


def notebook_warnings(run_root: Path) -> list[str]:
    """Warning lines in the stderr outputs of the executed notebooks under ``run_root``."""
    found = []
    for nb in sorted(run_root.rglob("day*_*.ipynb")):
        try:
            doc = json.loads(nb.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for cell in doc.get("cells", []):
            for o in cell.get("outputs", []):
                if o.get("output_type") == "stream" and o.get("name") == "stderr":
                    found += [f"{nb.name}: {w}" for w in warnings_in("".join(o.get("text", "")))]
    return found


def run(args) -> int:
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    results_file = Path(args.results)
    ok = True
    for step in steps(out_dir, args.test_limit, args.runner):
        if only and step.name.split(" ")[0] not in only and step.name not in only:
            continue
        print(f"board-smoke: {step.name} …", flush=True)
        res = run_step(step, log_dir)
        if step.name.startswith("rerun") and res.status == "ok":
            warned = notebook_warnings(REPO / "runs" / args.runner)
            if warned:
                res = Result(res.step, "warning", res.seconds,
                             f"{len(warned)} warning line(s) in executed notebooks, first: {warned[0][:140]}")
        print(f"board-smoke: {step.name}: {res.status} in {res.seconds:.1f} s {res.note}", flush=True)
        with open(results_file, "a", encoding="utf-8") as fh:
            fh.write(res.tsv())
        ok &= res.status == "ok"
        if step.name == "make env" and res.status != "ok":
            break  # nothing else can run without .venv
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the steps inside the emulated root")
    r.add_argument("--results", required=True, help="TSV file to append each step's result to")
    r.add_argument("--log-dir", required=True)
    r.add_argument("--out-dir", required=True, help="where vocab.bin, the VQF and the cold numba cache go")
    r.add_argument("--test-limit", type=float, default=1800, help="seconds for the pinned pytest subset")
    r.add_argument("--runner", default="emu-a76")
    r.add_argument("--only", help="comma-separated step names (first word), e.g. runner-info,generate")
    t = sub.add_parser("table", help="print the results file as one table")
    t.add_argument("results")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return run(args)
    results = read_results(Path(args.results))
    print(format_table(results))
    return 0 if results and all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
