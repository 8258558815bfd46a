"""What the machine code puts into every figure's provenance, and what the book does with it: numba's
threading layer (probed) and libgomp in every measurements file; an emulated run (make board-smoke)
marked so by KESTREL_EMULATED, labelled "(emulated)"/「（模拟）」 and kept out of every speed comparison."""
from __future__ import annotations

from kestrel_lab import machine, measure
from kestrel_lab.atomic import write_json
from kestrel_lab.book import dashboard


def _doc(runner, figures, *, emulated=None, notebook="day23_2"):
    rec = measure.Recorder(notebook, runner, params={"quick": True})
    for name, value, unit in figures:
        rec.record(name, value, unit, f"meaning of {name}")
    doc = rec.document()
    doc["provenance"]["machine"].update(clusters=[{"model": "Cortex-A76", "max_mhz": None, "cpus": [0, 1, 2, 3]}],
                                        cores=4, git_commit="0123456789ab", emulated=emulated)
    return doc


def _write(root, doc):
    write_json(root / doc["provenance"]["runner"] / f"{doc['notebook']}.json", doc)


def test_every_provenance_names_the_threading_layer(tmp_path, monkeypatch):
    monkeypatch.setenv(machine.EMULATED_ENV, "qemu-aarch64-cortex-a76")
    rec = measure.Recorder("day01_3", "r1")
    rec.record("x", 1.0, "s", "a time")
    doc = measure.load_file(rec.save(tmp_path))
    mach = doc["provenance"]["machine"]
    assert mach["numba"]["layer_in_use"] in ("omp", "tbb", "workqueue")   # probed, never left unknown
    assert isinstance(mach["numba"]["libgomp"], bool)
    assert mach["emulated"] == "qemu-aarch64-cortex-a76" and measure.is_emulated(doc)
    assert isinstance(mach["warnings"], list) and mach["measured_cpus"] == mach["affinity"]
    assert all("governors" in c for c in mach["clusters"])


def test_emulated_timings_are_never_compared(tmp_path):
    _write(tmp_path, _doc("rk3588-a76", [("tok_s", 50.0, "tok/s"), ("n", 3, "tokens")]))
    _write(tmp_path, _doc("emu-a76", [("tok_s", 1.0, "tok/s"), ("n", 3, "tokens")], emulated="qemu-aarch64-cortex-a76"))
    _write(tmp_path, _doc("rk3588-a76-b", [("tok_s", 5.0, "tok/s")]))
    table = measure.compare("day23_2", tmp_path)
    flags = {(r["figure"], r["runner"]): r["disagree"] for r in table.rows}
    assert not flags[("tok_s", "emu-a76")]                 # 50× slower than the board, and not flagged
    assert flags[("tok_s", "rk3588-a76")] and flags[("tok_s", "rk3588-a76-b")]   # two real boards are
    md = table.to_markdown()
    assert "| tok_s | emu-a76 | 1 (emulated) |" in md and "| n | emu-a76 | 3 |" in md


def test_dashboard_labels_emulated_figures_and_never_plots_them(tmp_path):
    _write(tmp_path, _doc("rk3588-a76", [("tok_s", 50.0, "tok/s")]))
    _write(tmp_path, _doc("emu-a76", [("tok_s", 1.0, "tok/s"), ("n", 3, "tokens")], emulated="qemu-aarch64-cortex-a76"))
    docs = measure.load_all(tmp_path)
    assert {r[1] for r in dashboard.rate_rows(docs)} == {"rk3588-a76"}
    header, rows = dashboard.wide_table("day23_2", docs)
    col = header.index("emu-a76")
    cells = {r[0]: r[col] for r in rows}
    assert cells["tok_s"] == f"1 {dashboard.EMULATED_MARK}" and cells["n"] == "3"
    page = dashboard.render(tmp_path)
    assert "模拟重跑（qemu，速度不可比）" in page
