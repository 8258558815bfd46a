import json

import pytest

from kestrel_lab import measure


def test_record_save_load_roundtrip(tmp_path):
    rec = measure.Recorder("day02_3", "test-runner", params={"quick": True})
    assert rec.record("mem_read_gbs", 12.5, "GB/s", "read bandwidth") == 12.5
    rec.record("count", 3, "items", "a count")
    rec.not_measured("fnv_seconds", "s", "FNV over the 2 GB file", "no model.vqf on this runner")
    path = rec.save(tmp_path)
    assert path == tmp_path / "test-runner" / "day02_3.json"
    doc = measure.load_file(path)
    prov = doc["provenance"]
    assert prov["runner"] == "test-runner" and prov["parameters"] == {"quick": True}
    mach = prov["machine"]
    for key in ("arch", "clusters", "cores", "memory_bytes", "os", "versions"):
        assert key in mach
    assert {"python", "numpy", "numba", "kestrel_lab"} <= set(mach["versions"])
    names = [f["name"] for f in doc["figures"]]
    assert names == ["mem_read_gbs", "count", "fnv_seconds"]
    assert doc["figures"][2]["status"] == "not_measured" and doc["figures"][2]["value"] is None


def test_nothing_written_until_save_and_failed_save_keeps_old_file(tmp_path):
    rec = measure.Recorder("day01_3", "r1")
    rec.record("x", 1.0, "s", "first")
    path = rec.save(tmp_path)
    before = path.read_text()
    rec2 = measure.Recorder("day01_3", "r1")
    with pytest.raises(measure.MeasurementError):
        rec2.save(tmp_path)  # nothing recorded
    with pytest.raises(measure.MeasurementError):
        rec2.record("bad", float("nan"), "s", "not finite")
    assert path.read_text() == before
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("notebook", ["day1_1", "day31_1", "day02_4", "dayXX_1", "day00_1"])
def test_bad_notebook_ids_rejected(notebook):
    with pytest.raises(measure.MeasurementError, match="dayDD_P"):
        measure.Recorder(notebook)


@pytest.mark.parametrize("runner", ["", "../etc", "a b", "x" * 65, "-lead"])
def test_bad_runner_labels_rejected(runner):
    with pytest.raises(measure.MeasurementError, match="runner"):
        measure.Recorder("day01_1", runner)


def test_validate_names_file_and_field(tmp_path):
    rec = measure.Recorder("day01_1", "r")
    rec.record("x", 1, "u", "m")
    doc = rec.document()
    doc["figures"][0]["status"] = "guessed"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(measure.MeasurementError, match=r"bad\.json.*figures\[0\]\.status"):
        measure.load_file(p)
    p.write_text("{not json")
    with pytest.raises(measure.MeasurementError, match="not valid JSON at line 1"):
        measure.load_file(p)


def test_compare_puts_article_first_and_marks_not_measured(tmp_path):
    for runner, value in (("zz-board", 2.0), ("aa-laptop", 3.0)):
        r = measure.Recorder("day16_3", runner)
        r.record("vqf_fnv_seconds", value, "s", "FNV time")
        r.not_measured("vqf_fnv_stored", "hex", "trailer", "needs the board's model.vqf")
        r.save(tmp_path)
    article = measure.Recorder("day16_3", "article-rk3588").document()
    article["source"] = "article"
    article["figures"] = [dict(name="vqf_fnv_seconds", value=7.21, unit="s", meaning="FNV time",
                               status="article", reason=None, extra={})]
    (tmp_path / "article-rk3588").mkdir()
    (tmp_path / "article-rk3588" / "day16_3.json").write_text(json.dumps(article))
    table = measure.compare("day16_3", tmp_path)
    fnv = [r for r in table.rows if r["figure"] == "vqf_fnv_seconds"]
    assert [r["runner"] for r in fnv] == ["article-rk3588", "aa-laptop", "zz-board"]
    md = table.to_markdown()
    assert "7.21 (article)" in md and "not measured here (needs the board's model.vqf)" in md
    assert "<table" in table._repr_html_()


def test_timeit_reports_median_of_samples():
    calls = []
    t = measure.timeit(lambda: calls.append(1), repeat=7, warmup=2)
    assert len(calls) == 9 and len(t.samples) == 7
    assert t.best <= t.median


def test_article_datasets_are_valid_and_marked():
    for nb in ("day16_3", "day18_2"):
        docs = measure.load_notebook(nb)
        art = [d for d in docs if d["provenance"]["runner"] == "article-rk3588"]
        assert len(art) == 1 and art[0]["source"] == "article"
        assert all(f["status"] == "article" for f in art[0]["figures"])
    sha = {f["name"]: f["value"] for f in measure.load_notebook("day18_2")[0]["figures"]}["vocab_bin_sha256"]
    assert sha == "299e1c156bff1b85b5b4dc098c1d7f2e33e0b76fe1967d0d21df328985637a73"


def _doc(notebook, runner, figures, *, model="AMD EPYC", cores=2, params=None, commit="0123456789ab"):
    """A run's document with a chosen machine kind: figures are (name, value, unit[, status])."""
    rec = measure.Recorder(notebook, runner, params=params if params is not None else {"quick": True})
    for name, value, unit, *status in figures:
        (rec.computed if status == ["computed"] else rec.record)(name, value, unit, f"meaning of {name}")
    doc = rec.document()
    doc["provenance"]["machine"].update(clusters=[{"model": model, "max_mhz": None, "cpus": list(range(cores))}],
                                        cores=cores, git_commit=commit,
                                        emulated=None)  # a real machine, even under qemu
    return doc


def _write(root, doc):
    from kestrel_lab.atomic import write_json

    write_json(root / doc["provenance"]["runner"] / f"{doc['notebook']}.json", doc)


def test_computed_figures_are_labelled(tmp_path):
    _write(tmp_path, _doc("day16_3", "ci-check", [("file_bytes", 4096, "B", "computed"), ("t", 1.0, "s")]))
    table = measure.compare("day16_3", tmp_path)
    md = table.to_markdown()
    assert "4,096 (computed)" in md and "1 (computed)" not in md
    assert [r["status"] for r in table.rows] == ["computed", "measured"]


def test_compare_flags_a_twofold_difference_on_the_same_machine_kind(tmp_path):
    _write(tmp_path, _doc("day23_2", "ci-check", [("tok_s", 50.0, "tok/s"), ("n", 3, "tokens"), ("ms", 10.0, "ms")]))
    _write(tmp_path, _doc("day23_2", "local", [("tok_s", 150.0, "tok/s"), ("n", 9, "tokens"), ("ms", 15.0, "ms")]))
    # another kind of machine, or other parameters: a different figure is expected, nothing flagged
    _write(tmp_path, _doc("day23_2", "rk3588-a76", [("tok_s", 5.0, "tok/s")], model="Cortex-A76", cores=4))
    _write(tmp_path, _doc("day23_2", "ci-check-full", [("tok_s", 900.0, "tok/s")], params={"quick": False}))
    table = measure.compare("day23_2", tmp_path)
    flags = {(r["figure"], r["runner"]): r["disagree"] for r in table.rows}
    assert flags[("tok_s", "ci-check")] and flags[("tok_s", "local")]
    assert not flags[("tok_s", "rk3588-a76")] and not flags[("tok_s", "ci-check-full")]
    assert not flags[("ms", "ci-check")]  # 1.5×: within noise
    assert not flags[("n", "local")]  # not a timing: a count that differs is a bug, not noise
    md = table.to_markdown()
    assert "50 ≠2×" in md and "150 ≠2×" in md and "5 ≠2×" not in md
    assert any(n.startswith("≠2×") and "2 倍" in n for n in table.notes)
    assert measure.machine_kind(_doc("day23_2", "x", [("a", 1, "s")])) == ((("AMD EPYC", 2),), 2)


def test_no_twofold_note_when_runners_agree(tmp_path):
    _write(tmp_path, _doc("day23_2", "ci-check", [("tok_s", 50.0, "tok/s")]))
    _write(tmp_path, _doc("day23_2", "local", [("tok_s", 90.0, "tok/s")]))
    table = measure.compare("day23_2", tmp_path)
    assert not any(r["disagree"] for r in table.rows) and not table.notes


def test_html_groups_rows_by_figure_and_folds_a_long_table(tmp_path):
    runners = ("aa", "bb", "cc")
    for r in runners:
        _write(tmp_path, _doc("day10_2", r, [("f1", 1.0, "s"), ("f2", 2, "B")]))
    short = measure.compare("day10_2", tmp_path)
    h = short._repr_html_()
    assert not short.collapsed() and "<details" not in h
    assert h.count(">f1</th>") == 1 and 'rowspan="3"' in h  # the figure's name once, then one row per runner
    assert h.count("<tbody>") == 2 and h.count("<tr>") == 1 + 6
    assert 'title="meaning of f1"' in h
    md = short.to_markdown()
    assert md.count("| f1 |") == 3  # the CLI's Markdown keeps the name on every row (grep-able)

    for r in runners:
        _write(tmp_path, _doc("day10_2", r, [(f"f{i}", 1.0 + i, "s") for i in range(5)]))
    long = measure.compare("day10_2", tmp_path)
    assert len(long) == 15 > measure.FigureTable.COLLAPSE_ROWS and long.collapsed()
    h = long._repr_html_()
    assert h.startswith('<details class="kestrel-figures"><summary>') and "</table></details>" in h
    assert "5 个数字，15 行" in h and "<details open" not in h


def test_machine_state_is_computed_from_load_and_spread():
    from kestrel_lab.measure import MachineState, Timing, machine_state

    assert not MachineState(0.2, 2, 0.05).busy and "机器不忙" in MachineState(0.2, 2, 0.05).sentence()
    loaded = MachineState(3.9, 2, 0.05)
    assert loaded.busy and "负载 3.9（2 个 CPU）" in loaded.sentence() and "负载超过" in loaded.sentence()
    noisy = MachineState(0.1, 2, 0.4)
    assert noisy.busy and "离散超过" in noisy.sentence() and "负载超过" not in noisy.sentence()
    st = machine_state(Timing([1.0, 1.0, 1.0]), Timing([1.0, 2.0, 1.0]))
    assert st.spread == 1.0 and st.cpus >= 1


# --------------------------------------------------------------------------- the quiet run
def _fake_run(root, runner, *, load, cores=2, params=None, values=None, emulated=False, date=None,
              rerun_load=None):
    """A measurements file as a re-run would publish it, with the load and machine set by hand."""
    rec = measure.Recorder("day23_2", runner, params={"quick": True} if params is None else params)
    for name, value in (values or {"prefill_tok_s_1": 100.0, "prefill_tok_s_64": 300.0}).items():
        rec.record(name, value, "tok/s", f"{name} of a fake run")
    doc = rec.document()
    prov = doc["provenance"]
    prov["load_avg"] = None if load is None else [load, load, load]
    prov["machine"] = {**prov["machine"], "cores": cores, "hostname": f"host-{runner}"}
    if emulated:
        prov["machine"]["emulated"] = True
    if date:
        prov["date"] = date
    if rerun_load is not None:
        prov["rerun"] = {"quiet": {"load1": rerun_load, "limit": 1.0, "outcome": "quiet"}}
    path = root / runner / "day23_2.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_quiet_series_chooses_the_quietest_run_with_the_same_parameters(tmp_path):
    _fake_run(tmp_path, "busy-box", load=3.0, values={"prefill_tok_s_1": 1.0, "prefill_tok_s_64": 2.0})
    _fake_run(tmp_path, "calm", load=0.6, values={"prefill_tok_s_1": 90.0, "prefill_tok_s_64": 280.0})
    _fake_run(tmp_path, "calmest", load=0.2, values={"prefill_tok_s_1": 110.0, "prefill_tok_s_64": 320.0})
    _fake_run(tmp_path, "other-params", load=0.0, params={"quick": False})
    _fake_run(tmp_path, "qemu", load=0.0, emulated=True)
    run, why = measure.quiet_series("day23_2", {"quick": True}, ["prefill_tok_s_1", "prefill_tok_s_64"],
                                    root=tmp_path)
    assert run is not None and run.runner == "calmest"
    assert run.figures == {"prefill_tok_s_1": 110.0, "prefill_tok_s_64": 320.0}
    assert run.load1 == 0.2 and run.cpus == 2 and "host-calmest" in run.machine and run.commit is not None
    assert why == run.sentence() and "calmest" in why and "0.20" in why
    # per CPU: 0.4 on 8 CPUs is quieter than 0.2 on 2
    _fake_run(tmp_path, "big-box", load=0.4, cores=8)
    run, _ = measure.quiet_series("day23_2", {"quick": True}, ["prefill_tok_s_1"], root=tmp_path)
    assert run.runner == "big-box" and run.figures == {"prefill_tok_s_1": 100.0}


def test_quiet_series_reads_the_higher_of_the_two_loads_at_start(tmp_path):
    # the runner saw 1.8 before starting the notebook, the Recorder 0.3: the run was not quiet
    _fake_run(tmp_path, "gave-up", load=0.3, rerun_load=1.8)
    assert measure.start_load(measure.load_file(tmp_path / "gave-up" / "day23_2.json")) == (1.8, 2)
    run, why = measure.quiet_series("day23_2", {"quick": True}, root=tmp_path)
    assert run is None and "gave-up：开始时 1 分钟平均负载 1.80" in why
    _fake_run(tmp_path, "fine", load=0.9, rerun_load=0.4, date="2026-12-01T00:00:00+00:00")
    _fake_run(tmp_path, "fine-newer", load=0.9, date="2026-12-05T00:00:00+00:00")
    run, _ = measure.quiet_series("day23_2", {"quick": True}, root=tmp_path)
    assert run.runner == "fine-newer"          # same load: the newer one
    assert set(run.figures) == {"prefill_tok_s_1", "prefill_tok_s_64"}   # no names: every figure


def test_quiet_series_is_none_with_the_reason(tmp_path):
    run, why = measure.quiet_series("day23_2", {"quick": True}, root=tmp_path)
    assert run is None and "还没有任何 runner 的记录" in why
    _fake_run(tmp_path, "no-load", load=None)
    _fake_run(tmp_path, "loaded", load=1.2)
    _fake_run(tmp_path, "quick-false", load=0.1, params={"quick": False})
    _fake_run(tmp_path, "old-names", load=0.1, values={"prefill_tok_s_1": 5.0})
    run, why = measure.quiet_series("day23_2", {"quick": True}, ["prefill_tok_s_1", "prefill_tok_s_64"],
                                    root=tmp_path)
    assert run is None and why.startswith("day23_2 还没有安静的重跑记录")
    assert "no-load：没有记下开始时的负载" in why
    assert "loaded：开始时 1 分钟平均负载 1.20，超过 2 个 CPU 的 50%" in why
    assert "quick-false：参数不同（quick=False，本次 True）" in why
    assert "old-names：缺少数字 prefill_tok_s_64" in why


def test_one_reader_of_the_load_average(monkeypatch):
    from kestrel_lab import procfs

    monkeypatch.setattr(procfs.os, "getloadavg", lambda: (1, 2.5, 3), raising=False)
    assert procfs.load_average() == (1.0, 2.5, 3.0)
    rec = measure.Recorder("day01_3", "r1")
    assert rec.load_at_start == (1.0, 2.5, 3.0)
    assert measure.machine_state().load1 == 1.0 and measure.machine_state(load1=0.25).load1 == 0.25

    def refuses():
        raise OSError("no load average here")

    monkeypatch.setattr(procfs.os, "getloadavg", refuses)
    assert procfs.load_average() is None and measure.machine_state().load1 is None
    rec.record("x", 1.0, "s", "a figure")
    assert rec.document()["provenance"]["load_avg"] == [1.0, 2.5, 3.0]   # the load at the start, not at save()
    monkeypatch.delattr(procfs.os, "getloadavg")
    assert procfs.load_average() is None
    assert measure.provenance("r1")["load_avg"] is None


def test_reading_says_which_figures_the_conclusion_reads(tmp_path, monkeypatch):
    from kestrel_lab import procfs

    _fake_run(tmp_path, "calm", load=0.2, values={"prefill_tok_s_1": 110.0, "prefill_tok_s_64": 320.0})
    monkeypatch.setattr(procfs.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    rec = measure.Recorder("day23_2", "local", params={"quick": True})
    own = {"prefill_tok_s_1": 50.0, "prefill_tok_s_64": 60.0}
    names = list(own)
    calm = measure.reading(rec, names, 0.05, root=tmp_path)        # a quiet run of our own
    assert not calm.reads_quiet and calm.figures(own) == own
    assert "结论读本次运行的数字（旁边列出安静的重跑：runner calm" in calm.sentence()
    noisy = measure.reading(rec, names, 0.6, root=tmp_path)        # repeats 60 % apart: busy
    assert noisy.reads_quiet and noisy.figures(own) == {"prefill_tok_s_1": 110.0, "prefill_tok_s_64": 320.0}
    assert "离散超过" in noisy.sentence() and "结论读安静的重跑：runner calm" in noisy.sentence()
    monkeypatch.setattr(procfs.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    loaded = measure.Recorder("day23_2", "local", params={"quick": False})   # no quiet run with these parameters
    alone = measure.reading(loaded, names, 0.05, root=tmp_path)
    assert alone.state.busy and alone.state.load1 == 3.0 and not alone.reads_quiet and alone.figures(own) == own
    assert "还没有安静的重跑记录" in alone.sentence() and "结论只能读本次运行的数字" in alone.sentence()
