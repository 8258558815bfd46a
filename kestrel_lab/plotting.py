"""Matplotlib set-up for the book's plots: a CJK font, so Chinese labels are glyphs, not boxes.

Matplotlib's default font (DejaVu Sans) has no Chinese glyphs: every label renders as a box and a
"Glyph … missing from font" warning. ``setup()`` picks an installed CJK font (the Debian package
``fonts-noto-cjk`` provides "Noto Sans CJK SC"), puts it first in the sans-serif list with the
previous fonts as fallbacks, and turns off the Unicode minus sign (CJK fonts often lack U+2212).
Inside a Jupyter kernel it also makes sure the inline backend is active: an inherited
``MPLBACKEND=Agg`` makes ipykernel skip it, and every ``plt.show()`` is then dropped silently — the
book would ship without its pictures. Outside a kernel it never touches the backend.

Taught in day01_1 (first plot) and used by every notebook that draws.
"""
from __future__ import annotations

import fnmatch
import os
import warnings

# In order of preference: Simplified Chinese faces first, then fonts that cover the same glyphs.
PREFERRED_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Serif CJK SC",
    "WenQuanYi*",
    "Source Han Sans*",
    "SimHei",
)
# File-name patterns of those fonts, to find a font installed after matplotlib built its font cache.
_FONT_FILES = ("NotoSansCJK*", "NotoSerifCJK*", "wqy*", "SourceHanSans*", "simhei*")
INSTALL_HINT = "apt-get install fonts-noto-cjk"

_warned = False


def choose_font(available, preferred=PREFERRED_FONTS) -> str | None:
    """The first font of ``preferred`` (glob patterns allowed) among the ``available`` names.

    Patterns are tried in order of preference, and names matching one pattern sorted, so the choice
    depends only on what is installed, not on the order the font manager lists it. Taught in day01_1.
    """
    names = sorted(set(available))
    for pattern in preferred:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if hits:
            return hits[0]
    return None


def installed_fonts() -> list[str]:
    """Family names matplotlib knows. Taught in day01_1."""
    from matplotlib import font_manager

    return [f.name for f in font_manager.fontManager.ttflist]


def _register_new_cjk_files() -> bool:
    """Add CJK font files that matplotlib's cached font list does not know yet (installed later)."""
    from matplotlib import font_manager

    known = {os.path.realpath(f.fname) for f in font_manager.fontManager.ttflist}
    added = False
    for path in font_manager.findSystemFonts():
        base = os.path.basename(path)
        if any(fnmatch.fnmatch(base, pat) for pat in _FONT_FILES) and os.path.realpath(path) not in known:
            try:
                font_manager.fontManager.addfont(path)
                added = True
            except (OSError, RuntimeError, ValueError):
                continue
    return added


INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def in_kernel() -> bool:
    """True inside a Jupyter (ipykernel) kernel: the book build, papermill, a student's notebook."""
    import sys

    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return bool(shell) and type(shell).__name__ == "ZMQInteractiveShell"


def ensure_inline_backend() -> bool:
    """Switch a kernel that runs a non-interactive backend (Agg) to the inline one; True if switched.

    Figures drawn under Agg in a kernel go nowhere, so this never costs a picture anyone could see.
    """
    import matplotlib

    if not in_kernel() or "inline" in matplotlib.get_backend():
        return False
    from IPython import get_ipython

    get_ipython().run_line_magic("matplotlib", "inline")
    return True


def setup(preferred=PREFERRED_FONTS) -> str | None:
    """Configure matplotlib for Chinese labels; return the font chosen, or None (with one warning).

    Safe to call many times. Taught in day01_1.
    """
    global _warned
    import matplotlib

    ensure_inline_backend()

    font = choose_font(installed_fonts(), preferred)
    if font is None and _register_new_cjk_files():
        font = choose_font(installed_fonts(), preferred)
    matplotlib.rcParams["axes.unicode_minus"] = False
    if font is None:
        if not _warned:
            warnings.warn(
                "no CJK font found for matplotlib: Chinese labels will render as boxes. "
                f"Install one, e.g. `{INSTALL_HINT}` (Debian/Ubuntu), then restart the kernel.",
                RuntimeWarning, stacklevel=2)
            _warned = True
        return None
    rest = [f for f in matplotlib.rcParams["font.sans-serif"] if f != font]
    matplotlib.rcParams["font.sans-serif"] = [font] + rest
    matplotlib.rcParams["font.family"] = ["sans-serif"]
    return font
