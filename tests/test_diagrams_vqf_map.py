"""The VQF map diagram is drawn from the planner: its regions tile the file exactly."""
import matplotlib

matplotlib.use("Agg")

from kestrel_lab import paths
from kestrel_lab.diagrams import vqf_map
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf.planner import plan_file


def _plan():
    return plan_file(paths.configs_dir() / "qwen3-vl-2b-instruct.config.json")


def test_regions_tile_the_whole_file():
    fp = _plan()
    regs = vqf_map.regions(fp)
    assert regs[0].start == 0 and regs[-1].end == fp.file_size
    assert all(a.end == b.start for a, b in zip(regs, regs[1:]))
    tensors = [r for r in regs if r.kind == "tensor"]
    assert [r.label for r in tensors] == [e.spec.name for e in fp.entries]
    assert tensors[0].start == fp.data_offset == 4096
    d = next(r for r in regs if r.kind == "directory")
    assert (d.start, d.size) == (F.DIR_OFFSET, 64 * 41)
    assert [r.kind for r in regs[:5]] == ["header", "VQFSig", "gap", "directory", "pad"]
    assert regs[-1].kind == "trailer" and regs[-1].start == fp.file_len


def test_figure_has_two_rows_with_chinese_labels():
    import matplotlib.pyplot as plt

    fig = vqf_map.draw_vqf_map(_plan())
    ax_all, ax_zoom = fig.axes[:2]
    assert "MB" in ax_all.get_xlabel() and "字节" in ax_zoom.get_xlabel()
    assert ax_zoom.get_xlim() == (0, vqf_map.ZOOM_BYTES)
    assert "VQF" in fig._suptitle.get_text()
    plt.close(fig)
