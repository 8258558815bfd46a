"""The pieces of `make board-smoke` that can be checked without root or qemu: the step runner and its
statuses, the table, the results file, the warning detector, the expected hashes, the pinned board
subset, and that the script and the operator page agree on what a board installs."""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys

import pytest

from kestrel_lab.paths import REPO_ROOT

spec = importlib.util.spec_from_file_location("board_smoke", REPO_ROOT / "scripts/board_smoke.py")
bs = importlib.util.module_from_spec(spec)
sys.modules["board_smoke"] = bs
spec.loader.exec_module(bs)

PY = sys.executable


def test_step_statuses(tmp_path):
    ok = bs.run_step(bs.Step("echo", [PY, "-c", "print('fine')"], 60), tmp_path)
    assert (ok.status, ok.note) == ("ok", "fine") and (tmp_path / "echo.log").read_text().startswith("$ ")
    fail = bs.run_step(bs.Step("boom", [PY, "-c", "import sys; print('bad thing'); sys.exit(3)"], 60), tmp_path)
    assert fail.status == "FAIL" and fail.note.startswith("exit 3: bad thing")
    slow = bs.run_step(bs.Step("slow", [PY, "-c", "import time; time.sleep(30)"], 0.5), tmp_path)
    assert slow.status == "timeout" and "0.5 s limit" in slow.note
    noisy = [PY, "-c", "import warnings; warnings.warn('x', RuntimeWarning)"]
    assert bs.run_step(bs.Step("noisy", noisy, 60, quiet=True), tmp_path).status == "warning"
    assert bs.run_step(bs.Step("noisy-ok", noisy, 60), tmp_path).status == "ok"   # only quiet steps are checked
    checked = bs.run_step(bs.Step("chk", [PY, "-c", "print('abc')"], 60, check=bs._contains("xyz")), tmp_path)
    assert checked.status == "FAIL" and "output lacks 'xyz'" in checked.note
    missing = bs.run_step(bs.Step("nope", [str(tmp_path / "no-such-program")], 60), tmp_path)
    assert missing.status == "FAIL" and "cannot start" in missing.note


def test_step_stdin_and_env(tmp_path):
    r = bs.run_step(bs.Step("env", [PY, "-c", "import os, sys; print(sys.stdin.read().strip(), os.environ['K'])"],
                            60, stdin="hello\n", env={"K": "v"}), tmp_path)
    assert r.note == "hello v"


def test_warning_lines():
    text = "ok\n/x/kernels.py:12: RuntimeWarning: invalid value encountered in cast\nwarning: governor\nnot warned\n"
    assert bs.warnings_in(text) == ["/x/kernels.py:12: RuntimeWarning: invalid value encountered in cast",
                                    "warning: governor"]
    assert bs.warnings_in("no warnings here? 0 warnings") == []


def test_results_file_and_table(tmp_path):
    f = tmp_path / "r.tsv"
    f.write_text(bs.Result("host packages", "ok", 1.25, "already\tinstalled").tsv()
                 + bs.Result("make env", "FAIL", 100, "exit 2: pip").tsv())
    rows = bs.read_results(f)
    assert [(r.step, r.status, r.seconds, r.note) for r in rows] == [
        ("host packages", "ok", 1.2, "already installed"), ("make env", "FAIL", 100.0, "exit 2: pip")]
    table = bs.format_table(rows)
    assert table.splitlines()[1].split() == ["step", "status", "seconds", "note"]
    assert re.search(r"^host packages\s+ok\s+1\.2\s+already installed$", table, re.M)
    assert re.search(r"^total\s+101\.2$", table, re.M) and table.endswith("NOT ok: make env")
    assert bs.format_table(rows[:1]).endswith("all ok") and bs.format_table([]).endswith("no step ran")
    f.write_text("bad line\n")
    with pytest.raises(ValueError, match=r"r.tsv: line 1 is not"):
        bs.read_results(f)
    f.write_text("a\tok\tfast\n")
    with pytest.raises(ValueError, match="seconds 'fast'"):
        bs.read_results(f)


def test_table_command_exit_code(tmp_path):
    f = tmp_path / "r.tsv"
    f.write_text(bs.Result("a", "ok", 1).tsv())
    assert bs.main(["table", str(f)]) == 0
    f.write_text(bs.Result("a", "ok", 1).tsv() + bs.Result("b", "warning", 2, "1 warning").tsv())
    assert bs.main(["table", str(f)]) == 1


def test_expected_figures_come_from_the_repository():
    assert bs.expected_vocab_sha256() == "299e1c156bff1b85b5b4dc098c1d7f2e33e0b76fe1967d0d21df328985637a73"
    assert bs.expected_poem() == "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。"


def test_the_steps_are_the_ones_the_issue_names(tmp_path):
    names = [s.name for s in bs.steps(tmp_path, 60)]
    assert names[0] == "make env" and names[-1].startswith("rerun")
    for want in ("runner-info", "vocab compile", "convert", "generate (empty cache)", "generate (cached)", "chat",
                 "bench", "make board-test"):
        assert want in names
    quiet = {s.name.split(" ")[0] for s in bs.steps(tmp_path, 60) if s.quiet}
    assert quiet == {q.split(" ")[0] for q in bs.QUIET_STEPS}
    rerun = bs.steps(tmp_path, 60)[-1].argv
    assert rerun[1:] == ["rerun", "--runner", "emu-a76", "--days", "16-18"]


def test_notebook_warnings(tmp_path):
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "stream", "name": "stderr", "text": ["a.py:1: RuntimeWarning: invalid value\n"]},
        {"output_type": "stream", "name": "stdout", "text": ["warning: printed on stdout is the lesson's\n"]}]}]}
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1/day17_2.ipynb").write_text(json.dumps(nb))
    assert bs.notebook_warnings(tmp_path) == ["day17_2.ipynb: a.py:1: RuntimeWarning: invalid value"]


def test_script_is_valid_bash_and_refuses_without_root(tmp_path):
    script = REPO_ROOT / "scripts/board-smoke.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "id").write_text("#!/bin/sh\necho 1000\n")
    (fake / "id").chmod(0o755)
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 2 and "needs root" in p.stderr


def test_page_and_script_install_the_same_packages():
    """The script runs the page's own apt-get line; the line names libgomp1 (numba's omp layer) and no
    compiler (every Python dependency has an aarch64 wheel)."""
    page = (REPO_ROOT / "book/rerun.md").read_text(encoding="utf-8")
    lines = re.findall(r"^sudo apt-get install -y (.+)$", page, re.M)
    assert lines, "book/rerun.md lost its apt-get line"
    pkgs = lines[0].split()
    assert "libgomp1" in pkgs and {"git", "make", "python3", "python3-venv"} <= set(pkgs)
    assert "build-essential" not in pkgs and "python3-dev" not in pkgs
    assert "grep -m1 -E '^sudo apt-get install -y '" in (REPO_ROOT / "scripts/board-smoke.sh").read_text()


def test_the_makefile_targets():
    mk = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^board-smoke:\n\tbash scripts/board-smoke.sh$", mk, re.M)
    assert re.search(r"^board-test: \$\(VENV\)/\.test-installed$", mk, re.M) and "pytest -m board" in mk
    assert "board-smoke" not in (REPO_ROOT / ".ci/run").read_text()        # never in CI
    assert "make board-smoke" in (REPO_ROOT / "README.md").read_text(encoding="utf-8")


REFERENCES = {"torch", "transformers", "tokenizers", "tiktoken", "gguf", "safetensors", "playwright"}


def _imports(path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip"
              and node.args and isinstance(node.args[0], ast.Constant)):
            mods.add(node.args[0].value.split(".")[0])
    return mods


def test_board_subset_is_reference_free_and_marked(request):
    from conftest import BOARD_SUBSET

    assert "test_board_smoke.py" in BOARD_SUBSET and "test_engine_kernels.py" in BOARD_SUBSET
    for name in sorted(BOARD_SUBSET):
        path = REPO_ROOT / "tests" / name
        assert path.exists(), f"tests/board_subset.txt names {name}, which does not exist"
        bad = _imports(path) & REFERENCES
        assert not bad, f"{name} is in the board subset but imports {sorted(bad)}"
        assert not re.search(r"which\(\s*['\"]chromium|mark\.browser", path.read_text(encoding="utf-8")), name
    assert request.node.get_closest_marker("board") is not None
