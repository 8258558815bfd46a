"""kestrel_lab.plotting: the CJK font choice (machine-independent) and one real render."""
import io
import warnings

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kestrel_lab import plotting


@pytest.fixture(autouse=True)
def _restore_rc(monkeypatch):
    monkeypatch.setattr(plotting, "_warned", False)
    with matplotlib.rc_context():
        yield


def test_choose_font_follows_preference_not_listing_order():
    available = ["DejaVu Sans", "WenQuanYi Zen Hei", "Noto Sans CJK JP", "Noto Sans CJK SC"]
    assert plotting.choose_font(available) == "Noto Sans CJK SC"
    assert plotting.choose_font(list(reversed(available))) == "Noto Sans CJK SC"
    jp_only = ["DejaVu Sans", "WenQuanYi Zen Hei", "Noto Sans CJK JP"]
    assert plotting.choose_font(jp_only) == "Noto Sans CJK JP"
    assert plotting.choose_font(["WenQuanYi Zen Hei", "WenQuanYi Micro Hei"]) == "WenQuanYi Micro Hei"
    assert plotting.choose_font(["Source Han Sans CN", "SimHei"]) == "Source Han Sans CN"
    assert plotting.choose_font(["DejaVu Sans", "Liberation Sans"]) is None
    assert plotting.choose_font([]) is None


def test_setup_uses_the_chosen_font(monkeypatch):
    monkeypatch.setattr(plotting, "installed_fonts", lambda: ["DejaVu Sans", "WenQuanYi Zen Hei"])
    matplotlib.rcParams["axes.unicode_minus"] = True
    assert plotting.setup() == "WenQuanYi Zen Hei"
    assert matplotlib.rcParams["font.sans-serif"][0] == "WenQuanYi Zen Hei"
    assert "DejaVu Sans" in matplotlib.rcParams["font.sans-serif"]  # kept as a fallback
    assert matplotlib.rcParams["font.family"] == ["sans-serif"]
    assert matplotlib.rcParams["axes.unicode_minus"] is False
    plotting.setup()
    assert matplotlib.rcParams["font.sans-serif"].count("WenQuanYi Zen Hei") == 1  # idempotent


def test_setup_warns_once_with_install_hint_when_no_cjk_font(monkeypatch):
    monkeypatch.setattr(plotting, "installed_fonts", lambda: ["DejaVu Sans"])
    monkeypatch.setattr(plotting, "_register_new_cjk_files", lambda: False)
    with pytest.warns(RuntimeWarning, match="apt-get install fonts-noto-cjk"):
        assert plotting.setup() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plotting.setup() is None  # no second warning
    assert matplotlib.rcParams["axes.unicode_minus"] is False


def test_setup_finds_a_font_installed_after_the_cache(monkeypatch):
    fonts = ["DejaVu Sans"]

    def register():
        fonts.append("Noto Sans CJK SC")
        return True

    monkeypatch.setattr(plotting, "installed_fonts", lambda: list(fonts))
    monkeypatch.setattr(plotting, "_register_new_cjk_files", register)
    assert plotting.setup() == "Noto Sans CJK SC"


def _render(title: str) -> list[str]:
    fig = Figure(figsize=(3, 2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([-1, 0, 1], [1, -2, 3])
    ax.set_title(title)
    ax.set_xlabel("线程数")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    assert buf.getvalue().startswith(b"\x89PNG")
    return [str(w.message) for w in caught if "missing from" in str(w.message)]


def test_real_render_has_no_missing_glyphs():
    if plotting.choose_font(plotting.installed_fonts()) is None and not plotting._register_new_cjk_files():
        pytest.skip(f"no CJK font installed ({plotting.INSTALL_HINT})")
    # Without the set-up the default font lacks the glyphs: the check below can fail.
    matplotlib.rcParams["font.family"] = ["sans-serif"]
    matplotlib.rcParams["font.sans-serif"] = ["DejaVu Sans"]
    assert _render("内存带宽 −1") != []
    font = plotting.setup()
    assert font is not None
    assert _render("内存带宽与 roofline −1") == []
