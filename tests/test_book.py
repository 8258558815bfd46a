"""The built book: every page is there, Chinese search works, no notebook errored, and a real browser
renders it. `make test` builds the book before pytest runs."""
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat
import pytest
import yaml

from helpers.book import IN_CI, REPO, require_built_book

CJK = re.compile(r"[\u4e00-\u9fff]")


def toc_files() -> list[str]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [ch["file"] for ch in part["chapters"]]
    return files


def test_every_toc_page_is_built():
    html = require_built_book()
    missing = [f for f in toc_files() if not (html / f"{f}.html").exists()]
    assert not missing, f"pages missing from _build/html: {missing}"


def _search_index(html: Path) -> dict:
    text = (html / "searchindex.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("(") + 1: text.rindex(")")])


def test_search_indexes_chinese_words_of_notebooks():
    html = require_built_book()
    index = _search_index(html)
    docnames = index["docnames"]
    nb_docs = {i for i, d in enumerate(docnames) if d.startswith("notebooks/")}
    assert nb_docs, "no notebook pages in the search index"
    zh_terms = {t: docs for t, docs in index["terms"].items() if CJK.search(t)}
    in_notebooks = [t for t, docs in zh_terms.items()
                    if nb_docs & set(docs if isinstance(docs, list) else [docs])]
    assert len(in_notebooks) > 50, "Chinese words of the notebooks are not searchable (is jieba installed?)"


def test_executed_notebooks_have_no_errors():
    html = require_built_book()
    executed = sorted((html.parent / "jupyter_execute").rglob("*.ipynb"))
    assert executed, "the build executed no notebook"
    for path in executed:
        nb = nbformat.read(path, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, f"{path}: {errors[0].get('ename')}: {errors[0].get('evalue')}"


# A notebook draws when its code shows a matplotlib figure or one of the package's diagrams.
DRAWS = re.compile(r"\bplt\.(show|subplots|figure)\(|\.savefig\(|\bdiagrams\.|\bdraw_\w+\(")


def _page(html: Path, source: Path) -> Path:
    return html / source.with_suffix(".html")


def _pictures(page: Path) -> int:
    """Pictures a built page shows: output images (files under _images/, or inline data: images).

    Read from the HTML, not from _build/jupyter_execute: myst-nb writes that copy without outputs
    when a notebook comes from the execution cache."""
    text = page.read_text(encoding="utf-8") if page.exists() else ""
    return len(re.findall(r'<img[^>]+src="(?:[^"]*_images/|data:image/)', text))


def test_every_notebook_that_draws_shows_its_pictures():
    """A figure the code draws must reach the book: an inherited MPLBACKEND=Agg once dropped them all."""
    from kestrel_lab import syllabus

    html = require_built_book()
    drawing, missing = [], []
    for nb_id, src in sorted(syllabus.find_notebooks().items()):
        code = "\n".join(c.source for c in nbformat.read(REPO / src, as_version=4).cells if c.cell_type == "code")
        if not DRAWS.search(code):
            continue
        drawing.append(nb_id)
        if _pictures(_page(html, src)) == 0:
            missing.append(nb_id)
    assert drawing, "no notebook draws a figure?"
    assert not missing, f"these notebooks draw but the built book shows no picture: {missing}"


# A Markdown table that reached the page as text: its header row and its separator row in one paragraph.
UNRENDERED_TABLE = re.compile(r"<p>\|[^<]*\n\|\s*[-—–:]+\s*\|")


def test_tables_that_cells_display_render_as_tables():
    """A cell's ``display(Markdown(table))`` must become an HTML table (myst-nb's ``nb_render_markdown_format``:
    with its commonmark default the pipes were printed as one paragraph on five pages)."""
    html = require_built_book()
    assert UNRENDERED_TABLE.search("<p>| a | b |\n|---|---|\n| 1 | 2 |</p>")     # the pattern finds the failure
    bad = sorted(str(p.relative_to(html)) for p in (html / "notebooks").rglob("*.html")
                 if UNRENDERED_TABLE.search(p.read_text(encoding="utf-8")))
    assert not bad, f"Markdown tables printed as text on: {bad}"


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        if IN_CI:
            pytest.fail("chromium is missing: scripts/system-deps.sh installs it (Debian package chromium)")
        pytest.skip("chromium not installed (apt-get install chromium fonts-noto-cjk)")
    return exe


def _render(url: str, screenshot: Path | None = None) -> str:
    """Load a page in headless Chromium, let its scripts run, return the DOM."""
    exe = _chromium()
    with tempfile.TemporaryDirectory() as profile:
        flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--virtual-time-budget=8000", "--allow-file-access-from-files"]
        dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        if screenshot:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(flags + ["--window-size=1280,1600", f"--screenshot={screenshot}", url],
                           capture_output=True, timeout=120)
    return dom


@pytest.mark.browser
def test_browser_renders_intro_and_a_notebook_page():
    html = require_built_book()
    shots = html.parent / "screenshots"
    dom = _render((html / "index.html").as_uri(), shots / "intro.png")
    assert "从零手写 Qwen 推理引擎" in dom
    assert (shots / "intro.png").stat().st_size > 10_000
    notebook = next(f for f in toc_files() if f.startswith("notebooks/"))
    dom = _render((html / f"{notebook}.html").as_uri(), shots / "notebook.png")
    assert re.search(r"<h1[^>]*>.*Day \d\d", dom), "the notebook's Chinese title is not rendered"
    assert 'class="cell docutils container"' in dom or "cell_input" in dom, "no code cell in the DOM"
    assert CJK.search(dom)


IMAGE_PROBE = """<html><body><iframe id="f" src="{page}" width="1280" height="4000"></iframe><pre id="out">pending</pre>
<script>
document.getElementById('f').onload = function () {{ setTimeout(function () {{
  var out = document.getElementById('out');
  try {{
    var imgs = Array.from(document.getElementById('f').contentDocument.querySelectorAll('img'));
    out.textContent = 'IMAGES ' + JSON.stringify(imgs.map(function (i) {{
      return [i.getAttribute('src'), i.complete, i.naturalWidth, i.naturalHeight,
              i.getBoundingClientRect().width]; }}));
  }} catch (e) {{ out.textContent = 'ERROR ' + e; }}
}}, 500); }};
</script></body></html>"""


@pytest.mark.browser
def test_browser_displays_a_notebook_picture():
    """Chromium loads a notebook page and its plot images are really displayed (loaded, non-zero size)."""
    from kestrel_lab import syllabus

    html = require_built_book()
    page = next((src for _, src in sorted(syllabus.find_notebooks().items())
                 if re.search(r'<img[^>]+src="[^"]*_images/', _page(html, src).read_text(encoding="utf-8"))), None)
    assert page is not None, "no executed notebook has a picture"
    probe = html / "_kestrel_image_probe.html"
    probe.write_text(IMAGE_PROBE.format(page=page.with_suffix(".html").as_posix()), encoding="utf-8")
    try:
        dom = _render(probe.as_uri())
    finally:
        probe.unlink()
    m = re.search(r'<pre id="out">IMAGES (.*?)</pre>', dom, re.S)
    assert m, f"the probe could not read the page's images: {dom[-300:]}"
    images = json.loads(m.group(1).replace("&amp;", "&"))
    plots = [i for i in images if "_images/" in (i[0] or "")]
    assert plots, f"{page}: no plot <img> on the rendered page ({images})"
    broken = [i for i in plots if not (i[1] and i[2] > 0 and i[3] > 0 and i[4] > 0)]
    assert not broken, f"{page}: pictures not displayed (src, complete, w, h, shown width): {broken}"


@pytest.mark.browser
def test_browser_search_finds_a_chinese_word():
    html = require_built_book()
    dom = _render((html / "search.html").as_uri() + "?q=%E8%AF%8D%E8%A1%A8")  # 词表
    assert re.search(r'<ul class="search[^"]*">\s*<li', dom) or "search-summary" in dom
    hits = re.findall(r'<li[^>]*><a href="([^"]+)"', dom)
    assert hits, "searching 词表 found nothing in the rendered search page"
