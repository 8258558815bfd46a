"""kestrel-lab rerun on small fixture notebooks (tests/fixtures/notebooks/): provenance, failures,
timeouts, surviving figures, resume. Each test runs real papermill kernels, so they are few and share
runs; KESTREL_DATA_DIR points at a temporary folder so the real data/measurements/ is never touched."""
from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

from kestrel_lab import cli, machine, measure
from kestrel_lab.book import executor, runs, selection, rerun as book_rerun

FIXTURES = Path(__file__).parent / "fixtures"
RUNNER = "test-runner"


@pytest.fixture(autouse=True)
def clean_checkout(monkeypatch):
    """These tests are about running notebooks, not about the checkout they run from: make it look
    committed (tests/test_runner_dirty.py tests the dirty-tree refusal itself)."""
    monkeypatch.setattr(machine, "dirty_files", lambda repo=None: [])


def rerun(capsys, tmp_path, *args) -> tuple[int, str]:
    code = cli.main(["rerun", "--runner", RUNNER, "--root", str(FIXTURES),
                     "--runs-root", str(tmp_path / "runs"), *args])
    return code, capsys.readouterr().out


def summary_rows(out: str) -> dict[str, list[str]]:
    """notebook -> [status, seconds, figures…] from the summary table printed at the end."""
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("notebook  status"))
    rows = {}
    for line in lines[start + 2:]:
        if line.startswith("day"):
            rows[line.split()[0]] = line.split()[1:]
    return rows


def good_old_file(data: Path, notebook: str, runner_label: str = RUNNER, value=1) -> Path:
    rec = measure.Recorder(notebook, runner_label, params={"quick": True})
    rec.record("old_figure", value, "items", "a figure from an earlier good run")
    return rec.save(data / "measurements")


def test_two_notebooks_write_valid_provenance(data, tmp_path, capsys):
    code, out = rerun(capsys, tmp_path, "--notebooks", "day01_1,day01_3", "-p", "scale", "3",
                      "--cpus", "0", "--timeout", "120")
    assert code == 0, out
    rows = summary_rows(out)
    assert rows["day01_1"][0] == "ok" and rows["day01_3"][0] == "ok"
    assert "3 + 1 not measured" in out and "2/2 ok" in out

    doc = measure.load_file(data / "measurements" / RUNNER / "day01_1.json")
    prov = doc["provenance"]
    assert prov["runner"] == RUNNER and doc["source"] == "run"
    assert prov["parameters"] == {"quick": True, "scale": 3}
    assert prov["machine"]["affinity"] == [0]  # --cpus pinned the kernel
    assert prov["machine"]["numba_env"]["NUMBA_NUM_THREADS"] == "1"
    assert prov["rerun"]["cpus"] == [0] and prov["rerun"]["seconds"] > 0  # added when published
    # the kernel's peak: the worker's (its process tree, sampled) and the kernel's own (saved with the figures)
    assert prov["rerun"]["peak_rss_bytes"] > 20 * 2**20 and prov["process"]["peak_rss_bytes"] > 20 * 2**20
    assert rows["day01_1"][3] == "GiB"   # the summary's peak RSS column: "<n> GiB"
    figs = {f["name"]: f for f in doc["figures"]}
    assert figs["scaled"]["value"] == 21  # -p scale 3 reached the notebook
    assert figs["board_only"]["status"] == "not_measured"
    measure.load_file(data / "measurements" / RUNNER / "day01_3.json")

    run_dir = next((tmp_path / "runs" / RUNNER).iterdir())
    state = json.loads((run_dir / "run.json").read_text())
    assert state["complete"] and {n["status"] for n in state["notebooks"].values()} == {"ok"}
    nb = nbformat.read(run_dir / "day01_1.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "remove-cell" in injected[0].metadata.tags
    assert 'runner = "test-runner"' in injected[0].source
    assert not list((data / "measurements").glob(f"{RUNNER}/.*"))  # no temp files left behind


def test_failure_timeout_survivors_and_resume(data, tmp_path, capsys):
    old_fail = good_old_file(data, "day01_2")  # the failing notebook's previous good figures
    old_other = good_old_file(data, "day01_2", "some-board", value=5)
    before = old_fail.read_bytes(), old_other.read_bytes()

    code, out = rerun(capsys, tmp_path, "--keep-going", "--timeout", "15", "--jobs", "2")
    assert code == 1
    rows = summary_rows(out)
    assert rows["day01_1"][0] == "ok" and rows["day01_3"][0] == "ok"
    assert rows["day01_2"][0] == "failed" and "ZeroDivisionError" in out
    assert rows["day02_1"][0] == "timeout"
    # day01_2 called rec.save() before it failed: its figures are not published, the old ones survive
    assert (old_fail.read_bytes(), old_other.read_bytes()) == before
    assert not (data / "measurements" / RUNNER / "day02_1.json").exists()
    measure.load_file(data / "measurements" / RUNNER / "day01_1.json")
    measure.load_file(data / "measurements" / RUNNER / "day01_3.json")
    run_dirs = list((tmp_path / "runs" / RUNNER).iterdir())
    assert len(run_dirs) == 1
    done_1 = (data / "measurements" / RUNNER / "day01_1.json").stat().st_mtime_ns

    # Same command again: the same run folder, the done notebooks skipped, the others re-run.
    code, out = rerun(capsys, tmp_path, "--keep-going", "--timeout", "15", "--jobs", "2",
                      "--notebooks", "day01_1,day01_2,day01_3")
    assert code == 1
    assert f"{run_dirs[0]} (resumed)" in out and "2 already done there" in out
    rows = summary_rows(out)
    assert rows["day01_1"][:2] == ["ok", "(earlier)"] and rows["day01_2"][0] == "failed"
    assert (data / "measurements" / RUNNER / "day01_1.json").stat().st_mtime_ns == done_1
    assert list((tmp_path / "runs" / RUNNER).iterdir()) == run_dirs

    # --force re-runs a done notebook in that folder.
    code, out = rerun(capsys, tmp_path, "--force", "--notebooks", "day01_3", "--timeout", "60")
    assert code == 0 and "1 to run, 0 already done" in out and f"{run_dirs[0]} (resumed)" in out


def test_stops_after_first_failure_without_keep_going(data, tmp_path, capsys):
    code, out = rerun(capsys, tmp_path, "--notebooks", "day01_2,day01_3", "--timeout", "60")
    assert code == 1
    rows = summary_rows(out)
    assert rows["day01_2"][0] == "failed" and rows["day01_3"][:2] == ["not", "run"]
    assert "--keep-going" in out
    assert not (data / "measurements" / RUNNER).exists()


def test_different_parameters_start_a_new_run_folder(tmp_path):
    first = runs.RunFolder.create(tmp_path, RUNNER, {"quick": True})
    folder, how = runs.RunFolder.resume_or_create(tmp_path, RUNNER, {"quick": True})
    assert folder.path == first.path and how == "resumed"
    folder, how = runs.RunFolder.resume_or_create(tmp_path, RUNNER, {"quick": False})
    assert folder.path != first.path and how.startswith("new")
    folder.state["complete"] = True
    folder.save()
    again, how = runs.RunFolder.resume_or_create(tmp_path, RUNNER, {"quick": False})
    assert again.path != folder.path and how == "new"


def test_argument_parsing():
    assert selection.parse_days("16-18") == [16, 17, 18]
    assert selection.parse_days("1,3,5-6") == [1, 3, 5, 6]
    for bad in ("0-2", "18-16", "x", "31"):
        with pytest.raises(selection.RunnerError, match="--days"):
            selection.parse_days(bad)
    assert selection.parse_cpus("0") == [0]
    with pytest.raises(selection.RunnerError, match="not available"):
        selection.parse_cpus(f"{max(os.sched_getaffinity(0)) + 1}")
    with pytest.raises(selection.RunnerError, match="--cpus"):
        selection.parse_cpus("7-4")
    assert selection.parse_value("false") is False and selection.parse_value("3") == 3
    assert selection.parse_value("2.5") == 2.5 and selection.parse_value("None") is None
    assert selection.parse_value("/mnt/emmc/Modl/x.vqf") == "/mnt/emmc/Modl/x.vqf"
    assert selection.parse_parameters([["quick", "false"]]) == {"quick": False}
    with pytest.raises(selection.RunnerError, match="--runner"):
        selection.parse_parameters([["runner", "x"]])
    with pytest.raises(selection.RunnerError, match="not a Python name"):
        selection.parse_parameters([["model-dir", "x"]])


def test_rerun_refuses_the_article_label_and_bad_settings(data, tmp_path):
    nbs = selection.select_notebooks(FIXTURES, ids=["day01_3"])
    with pytest.raises(selection.RunnerError, match="article-\\* labels"):
        book_rerun.rerun("article-rk3588", nbs, runs_root=tmp_path)
    with pytest.raises(measure.MeasurementError, match="runner label"):
        book_rerun.rerun("bad label", nbs, runs_root=tmp_path)
    with pytest.raises(selection.RunnerError, match="--jobs"):
        book_rerun.rerun(RUNNER, nbs, jobs=0, runs_root=tmp_path)
    assert not (tmp_path / RUNNER).exists()


def test_select_notebooks():
    all_ = selection.select_notebooks(FIXTURES)
    assert list(all_) == ["day01_1", "day01_2", "day01_3", "day02_1"]
    assert list(selection.select_notebooks(FIXTURES, days=[2])) == ["day02_1"]
    assert list(selection.select_notebooks(FIXTURES, ids=["day01_3", "1_1"])) == ["day01_1", "day01_3"]
    with pytest.raises(selection.RunnerError, match="day05_1 has no notebook"):
        selection.select_notebooks(FIXTURES, ids=["day05_1"])
    with pytest.raises(selection.RunnerError, match="no written notebook"):
        selection.select_notebooks(FIXTURES, days=[20])


def test_publish_refuses_a_file_of_another_runner(data, tmp_path):
    rec = measure.Recorder("day01_1", "local")
    rec.record("x", 1, "items", "x")
    staged = rec.save(tmp_path / "stage")
    with pytest.raises(measure.MeasurementError, match="provenance.runner"):
        executor.publish(staged, RUNNER, "day01_1")
    assert not (data / "measurements" / RUNNER).exists()


def test_declared_parameters_and_typo_warning(data, tmp_path, capsys):
    alpha = FIXTURES / "notebooks/day01/day01_1_alpha.ipynb"
    assert selection.declared_parameters(alpha) == {"runner", "quick", "scale"}
    # an unknown parameter is reported before anything runs (the run itself stops at the failing notebook)
    code, out = rerun(capsys, tmp_path, "--notebooks", "day01_2", "-p", "scael", "3", "--timeout", "60")
    assert code == 1 and "no selected notebook has a parameter named scael" in out


def test_sigterm_stops_the_run_like_ctrl_c(data, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "kestrel_lab", "rerun", "--runner", RUNNER, "--root", str(FIXTURES),
           "--runs-root", str(tmp_path / "runs"), "--notebooks", "day02_1", "--allow-dirty"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state_files = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((tmp_path / "runs").rglob("day02_1.log")):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    state_files = list((tmp_path / "runs" / RUNNER).glob("*/run.json"))
    state = json.loads(state_files[0].read_text())
    assert state["notebooks"]["day02_1"]["status"] == "interrupted" and not state["complete"]
    assert "interrupted" in out and not (data / "measurements" / RUNNER / "day02_1.json").exists()


class FakeMachine:
    """A load average that follows a script, and a clock that only ``sleep`` moves: no real waiting."""

    def __init__(self, loads):
        self.loads, self.now, self.slept = list(loads), 0.0, []

    def read_load(self):
        load = self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]
        return None if load is None else (load, load, load)

    def sleep(self, s):
        self.slept.append(s)
        self.now += s

    def gate(self, limit, max_wait, poll=5.0):
        return book_rerun.QuietGate(limit, max_wait, poll, read_load=self.read_load, sleep=self.sleep,
                                    clock=lambda: self.now)


def test_quiet_gate_waits_gives_up_and_says_so(capsys):
    fake = FakeMachine([0.4])
    assert fake.gate(1.0, 60).wait("day01_1") == {"outcome": "quiet", "load1": 0.4, "limit": 1.0,
                                                  "waited_s": 0.0, "max_wait_s": 60}
    assert fake.slept == [] and capsys.readouterr().out == ""

    fake = FakeMachine([2.5, 2.0, 1.6, 1.2, 0.9])
    rec = fake.gate(1.0, 60).wait("day23_2")
    assert rec["outcome"] == "waited" and rec["load1"] == 0.9 and rec["waited_s"] == 20.0
    assert fake.slept == [5.0] * 4
    out = capsys.readouterr().out
    assert "day23_2 waits for the 1-minute load average to fall to 1 (now 2.50; at most 60 s" in out
    assert "load 0.90 ≤ 1 after 20 s of waiting" in out

    fake = FakeMachine([3.0] * 40 + [2.2])
    rec = fake.gate(1.0, 150, poll=4).wait("day07_3")
    assert rec["outcome"] == "gave_up" and rec["load1"] == 3.0 and rec["waited_s"] == 150.0
    assert sum(fake.slept) == 150.0 and max(fake.slept) == 4 and fake.slept[-1] == 2.0   # never past the limit
    out = capsys.readouterr().out
    assert "day07_3 still waits: load 3.00 > 1 after 60 s" in out and "after 120 s" in out
    assert "gave up waiting after 150 s: it starts at load 3.00, above --quiet-load 1 (its record says so)" in out

    rec = FakeMachine([None]).gate(1.0, 60).wait("day01_3")
    assert rec["outcome"] == "unknown" and rec["load1"] is None
    assert "keeps no load average" in capsys.readouterr().out
    with pytest.raises(selection.RunnerError, match="--quiet-load -1"):
        book_rerun.QuietGate(-1, 10)
    with pytest.raises(selection.RunnerError, match="--quiet-wait -5"):
        book_rerun.QuietGate(1.0, -5)


def test_rerun_records_the_quiet_wait(data, tmp_path, capsys):
    nbs = selection.select_notebooks(FIXTURES, ids=["day01_1", "day01_3"])
    fake = FakeMachine([1.8, 1.7, 0.6, 2.4])    # day01_1 waits 10 s, day01_3 gives up at 2.4
    results, folder = book_rerun.rerun(RUNNER, nbs, timeout=120, runs_root=tmp_path / "runs",
                                       quiet=fake.gate(1.0, 30, poll=5))
    out = capsys.readouterr().out
    assert [r.status for r in results] == ["ok", "ok"]
    assert "each waits for a 1-minute load ≤ 1 (at most 30 s)" in out
    assert "day01_1 waits for the 1-minute load average to fall to 1 (now 1.80" in out
    assert "day01_1 started at load 0.60" in out and "day01_3 started at load 2.40" in out
    assert "started at load 2.40 > 1 (gave up waiting after 30 s)" in out   # the summary's note
    assert "1 started above --quiet-load" in out
    state = json.loads((folder.path / "run.json").read_text())
    assert state["quiet_load"] == 1.0 and state["quiet_wait"] == 30
    assert state["notebooks"]["day01_1"]["quiet"]["outcome"] == "waited"
    assert state["notebooks"]["day01_3"]["quiet"] == {"outcome": "gave_up", "load1": 2.4, "limit": 1.0,
                                                     "waited_s": 30.0, "max_wait_s": 30}
    quiet_one = measure.load_file(data / "measurements" / RUNNER / "day01_1.json")["provenance"]["rerun"]["quiet"]
    loud = measure.load_file(data / "measurements" / RUNNER / "day01_3.json")
    assert quiet_one["outcome"] == "waited" and quiet_one["load1"] == 0.6
    assert loud["provenance"]["rerun"]["quiet"]["outcome"] == "gave_up"
    assert measure.start_load(loud)[0] >= 2.4          # quiet_series will pass it over
    with pytest.raises(selection.RunnerError, match="--jobs 2"):
        book_rerun.rerun(RUNNER, nbs, jobs=2, runs_root=tmp_path / "runs", quiet=fake.gate(1.0, 30))


def test_quiet_options_on_the_command_line(data, tmp_path, capsys, monkeypatch):
    seen = {}

    class Stop(Exception):
        pass

    def fake_rerun(runner, notebooks, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(book_rerun, "rerun", fake_rerun)
    with pytest.raises(Stop):
        cli.main(["rerun", "--runner", RUNNER, "--root", str(FIXTURES), "--notebooks", "day01_3",
                  "--quiet-load", "1.5", "--quiet-wait", "120"])
    assert seen["quiet"].limit == 1.5 and seen["quiet"].max_wait == 120
    with pytest.raises(Stop):
        cli.main(["rerun", "--runner", RUNNER, "--root", str(FIXTURES), "--notebooks", "day01_3",
                  "--quiet-load", "2"])
    assert seen["quiet"].max_wait == book_rerun.DEFAULT_QUIET_WAIT_S
    assert cli.main(["rerun", "--runner", RUNNER, "--root", str(FIXTURES), "--quiet-wait", "5"]) != 0
    assert "--quiet-wait needs --quiet-load" in capsys.readouterr().err
