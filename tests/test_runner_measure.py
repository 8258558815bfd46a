"""measure's parts of the re-run loop: the staging overlay, the older-commit mark, the dashboard page."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kestrel_lab import measure, paths
from kestrel_lab.book import dashboard



def save(notebook, runner_label, figures, root, commit=None):
    rec = measure.Recorder(notebook, runner_label, params={"quick": True})
    for name, value, unit in figures:
        rec.record(name, value, unit, f"meaning of {name}")
    doc = rec.document()
    if commit is not None:
        doc["provenance"]["machine"]["git_commit"] = commit
    from kestrel_lab.atomic import write_json

    return write_json(root / runner_label / f"{notebook}.json", doc)


def test_staged_file_stands_in_for_the_published_one(data, tmp_path, monkeypatch):
    save("day01_3", "board", [("x", 1, "items")], data / "measurements")
    stage = tmp_path / "stage"
    monkeypatch.setenv(measure.STAGE_ENV, str(stage))
    rec = measure.Recorder("day01_3", "board")
    rec.record("x", 2, "items", "x")
    path = rec.save()
    assert path == stage / "board" / "day01_3.json"  # not published yet
    assert measure.load_file(data / "measurements" / "board" / "day01_3.json")["figures"][0]["value"] == 1
    rows = measure.compare("day01_3").rows
    assert [r["value"] for r in rows] == [2]
    monkeypatch.delenv(measure.STAGE_ENV)
    assert [r["value"] for r in measure.compare("day01_3").rows] == [1]


def git(repo: Path, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git checkout with a notebook committed twice: figures of the first commit are older."""
    r = tmp_path / "repo"
    nb = r / "notebooks" / "day01" / "day01_3_x.ipynb"
    nb.parent.mkdir(parents=True)
    git(r.parent, "init", "-q", str(r))
    nb.write_text("{}")
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "first")
    first = git(r, "rev-parse", "--short=12", "HEAD")
    nb.write_text('{"changed": true}')
    git(r, "commit", "-q", "-am", "second")
    second = git(r, "rev-parse", "--short=12", "HEAD")
    (r / "other.txt").write_text("later, unrelated")
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "third")
    third = git(r, "rev-parse", "--short=12", "HEAD")
    monkeypatch.setattr(paths, "REPO_ROOT", r)
    measure.notebook_commit.cache_clear()
    measure._contains.cache_clear()
    yield first, second, third
    measure.notebook_commit.cache_clear()
    measure._contains.cache_clear()


def test_older_commit_is_marked(data, repo):
    first, second, third = repo
    assert measure.notebook_commit("day01_3") == second
    assert measure.measured_with_older_commit(first, "day01_3") is True
    assert measure.measured_with_older_commit(second, "day01_3") is False
    assert measure.measured_with_older_commit(third + "+dirty", "day01_3") is False
    assert measure.measured_with_older_commit("0123456789ab", "day01_3") is None  # unknown here
    assert measure.measured_with_older_commit(None, "day01_3") is None

    save("day01_3", "old-board", [("x", 1, "items")], data / "measurements", commit=first)
    save("day01_3", "new-board", [("x", 2, "items")], data / "measurements", commit=third)
    table = measure.compare("day01_3")
    marks = {r["runner"]: r["stale"] for r in table.rows}
    assert marks == {"old-board": True, "new-board": False}
    md = table.to_markdown()
    assert f"{first} ⚠" in md and f"{third} ⚠" not in md and "早于这篇笔记本的当前版本" in md
    assert "⚠" in table._repr_html_()


def test_dashboard_page(data, tmp_path):
    root = data / "measurements"
    save("day02_3", "ci-check", [("read_bw", 15.5, "GB/s"), ("n", 3, "items")], root)
    save("day02_3", "rk3588-a76", [("read_bw", 9.25, "GB/s")], root)
    save("day02_3", "local", [("read_bw", 1.0, "GB/s")], root)
    text = dashboard.render()
    assert text.startswith(dashboard.HEADER)
    assert "| figure | unit | ci-check | rk3588-a76 |" in text
    assert "| read_bw | GB/s | 15.5 | 9.25 |" in text and "| n | items | 3 | — |" in text
    assert "| `local` |" not in text  # machine-specific: left out unless asked
    assert "```{raw} html\n<svg" in text and "day02_3 · read_bw" in text
    assert "| read_bw | GB/s | 15.5 | 9.25 | 1 |" in dashboard.render(include_local=True)
    page = tmp_path / "dashboard.md"
    assert dashboard.write(page=page) == (page, True)
    assert dashboard.write(page=page) == (page, False)  # deterministic: the SVG does not change
    assert not dashboard.is_stale(page=page)
    save("day02_3", "rk3588-a76", [("read_bw", 9.5, "GB/s")], root)
    assert dashboard.is_stale(page=page)


def test_dashboard_without_throughputs_or_data(data):
    assert "还没有任何 runner 的记录" in dashboard.render()
    save("day01_2", "ci-check", [("params", 596049920, "parameters")], data / "measurements")
    text = dashboard.render()
    assert "<svg" not in text and "还没有 runner 记录过吞吐类" in text


def test_plot_shows_shared_figures_first_and_at_most_the_cap():
    rows = [(f"day02_3 · f{i}", "ci-check", "GB/s", 1.0 + i) for i in range(dashboard.MAX_PLOTTED + 5)]
    rows.append(("day02_3 · f27", "rk3588-a76", "GB/s", 2.0))  # the only shared one, listed late
    labels = dashboard.plotted_labels(rows)
    assert len(labels) == dashboard.MAX_PLOTTED and labels[0] == "day02_3 · f27"
    assert labels[1:4] == ["day02_3 · f0", "day02_3 · f1", "day02_3 · f2"]


def test_dashboard_labels_computed_figures_and_never_plots_them(data):
    root = data / "measurements"
    rec = measure.Recorder("day23_1", "ci-check", params={"quick": True})
    rec.computed("roofline_bound", 40.0, "GB/s", "bandwidth bound from the board's datasheet")
    rec.computed("file_bytes", 4096, "B", "planned file size")
    rec.record("measured_bw", 12.5, "GB/s", "measured bandwidth")
    rec.save(root)
    text = dashboard.render()
    assert f"| roofline_bound | GB/s | 40 {dashboard.COMPUTED_MARK} |" in text
    assert f"| file_bytes | B | 4,096 {dashboard.COMPUTED_MARK} |" in text
    assert "| measured_bw | GB/s | 12.5 |" in text
    labels = [r[0] for r in dashboard.rate_rows(measure.load_all())]
    assert labels == ["day23_1 · measured_bw"]  # a computed speed is no measurement to compare
    assert "day23_1 · roofline_bound" not in text.split("## 按笔记本")[0]
    assert "1（另有 2 个计算）" in text


def test_a_runner_measured_on_two_machines_names_each_with_its_notebooks():
    def doc(notebook, model):
        return {"notebook": notebook, "provenance": {"machine": {
            "arch": "x86_64", "clusters": [{"model": model, "cpus": [0, 1]}], "memory_bytes": 24 * 2**30}}}
    one = [doc("day02_3", "AMD EPYC"), doc("day03_1", "AMD EPYC")]
    assert dashboard._machines_of(one) == "x86_64, 2×AMD EPYC, 24 GiB"
    two = one + [doc("day29_1", "Intel Xeon")]
    assert dashboard._machines_of(two) == ("x86_64, 2×AMD EPYC, 24 GiB（2 篇：day02_3、day03_1）；"
                                           "x86_64, 2×Intel Xeon, 24 GiB（1 篇：day29_1）")


def test_dashboard_shows_rerun_seconds_and_peak_and_flags_what_is_over_budget(data):
    from kestrel_lab.atomic import write_json

    root = data / "measurements"
    for nb, quick, secs, peak in (("day06_3", True, 52.3, int(7.77 * 2**30)), ("day25_1", True, 88.2, None),
                                  ("day01_1", True, 4.0, 300 * 2**20), ("day02_3", False, 95.0, 2**30)):
        rec = measure.Recorder(nb, "ci-check", params={"quick": quick})
        rec.record("x", 1, "items", "a figure")
        doc = rec.document()
        doc["provenance"]["rerun"] = {"seconds": secs, "peak_rss_bytes": peak}
        write_json(root / "ci-check" / f"{nb}.json", doc)
    text = dashboard.render()
    assert "| day06_3 | 52.3（quick） · 7.77 GiB ❗> 2.00 GiB |" in text
    assert "| day25_1 | 88.2（quick） ❗> 60 s |" in text               # an older record: no peak, still timed
    assert "| day01_1 | 4.0（quick） · 0.29 GiB |" in text
    assert "| day02_3 | 95.0（full） · 1.00 GiB |" in text               # 60 s is the defaults' budget only


def test_dashboard_marks_a_run_that_started_above_the_quiet_load(data):
    from kestrel_lab.atomic import write_json

    root = data / "measurements"
    for nb, outcome, load in (("day23_2", "gave_up", 2.4), ("day23_3", "waited", 0.8), ("day07_3", "quiet", 0.1)):
        rec = measure.Recorder(nb, "ci-check", params={"quick": True})
        rec.record("x", 1, "tok/s", "a figure")
        doc = rec.document()
        doc["provenance"]["rerun"] = {"seconds": 30.0, "quiet": {"outcome": outcome, "load1": load, "limit": 1.0,
                                                                "waited_s": 900.0, "max_wait_s": 900}}
        write_json(root / "ci-check" / f"{nb}.json", doc)
    text = dashboard.render()
    assert "| day23_2 | 30.0（quick） ⚡负载 2.40 > 1 |" in text
    assert "| day23_3 | 30.0（quick） |" in text and "| day07_3 | 30.0（quick） |" in text
