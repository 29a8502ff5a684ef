"""The built book in a real browser (Debian's Chromium, driven by Playwright), opened from disk, offline.

For every chapter page: MathJax (served from the book itself) typeset the math and left no raw TeX, every
figure decodes, no local (file:) request failed, nothing was fetched from the network, and the Colab
button points at .../github/<owner>/<repo>/blob/<branch>/chapters/<file>.ipynb. The code cells show none of the
toolchain's marker lines (`#| export`, `# NBVAL_...`: _ext/strip_markers.py), a tqdm bar shows its last state
only (_ext/progress_bars.py), and at a 1,400-px window no code
block scrolls sideways (_static/code-width.css).

Needs `_build/html` (`make book`, or `make book-stored` after nbval), /usr/bin/chromium
(`apt-get install chromium`) and Playwright. Locally the check is skipped, with the reason, when one of them is
missing; with REQUIRE_BROWSER=1 in the environment (set by `.ci/run`, so in CI) it FAILS instead: CI must never
pass without having opened the pages."""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
sys.path.insert(0, str(ROOT / CONFIG["sphinx"]["local_extensions"]["progress_bars"]))
from progress_bars import collapse_progress  # noqa: E402

TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CHAPTERS = [c["file"] for part in TOC["parts"] for c in part["chapters"] if c["file"].startswith("chapters/")]

REQUIRED = os.environ.get("REQUIRE_BROWSER", "") not in ("", "0")


def problem() -> str | None:
    """Why the browser check cannot run here, or None when it can."""
    if not Path(CHROMIUM).exists():
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    if not (HTML / "index.html").exists():
        return "_build/html is not built (run `make book`)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module")
def browser():
    """Skip locally (with the reason) when something is missing; fail where the check is required
    (REQUIRE_BROWSER=1, as in CI). In a fixture rather than at import, so a skip is a skipped test, not an
    empty collection (pytest's exit code 5)."""
    reason = problem()
    if reason and REQUIRED:
        pytest.fail(f"REQUIRE_BROWSER=1 but {reason}: the browser check cannot run, and CI must not pass "
                    "without it", pytrace=False)
    if reason:
        pytest.skip(f"{reason}: browser check skipped (set REQUIRE_BROWSER=1 to make this a failure)")
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def chapter_pages(browser):
    """Each chapter page opened once, at a 1,400-px window, for every check below (loading a page and waiting for
    MathJax is most of this file's time): chapter -> (page, failed local requests, network requests)."""
    pages = {}

    def get(chapter):
        if chapter not in pages:
            pages[chapter] = open_page(browser, f"{chapter}.html", viewport={"width": 1400, "height": 900})
        return pages[chapter]

    def close(chapter):                      # a check that changed the page: the next one to ask reopens it
        pages.pop(chapter)[0].close()
    get.close = close
    yield get
    for page, _, _ in pages.values():
        page.close()


def open_page(browser, rel, viewport=None):
    page = browser.new_page(viewport=viewport)
    failed, remote = [], []
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.on("request", lambda r: remote.append(r.url) if not r.url.startswith(("file:", "data:", "blob:")) else None)
    page.goto((HTML / rel).as_uri(), wait_until="load")
    if page.evaluate("() => [...document.scripts].some(s => /mathjax/i.test(s.src))"):   # pages with math
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
        page.evaluate("() => MathJax.startup.promise")
    return page, failed, remote


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.split("/")[-1])
def test_chapter_page_renders_offline(chapter_pages, chapter):
    page, failed, remote = chapter_pages(chapter)
    assert page.evaluate("() => document.querySelectorAll('article').length") > 0
    # math: typeset by the MathJax copied into the book, none left as raw TeX
    scripts = page.evaluate("() => [...document.scripts].map(s => s.src).filter(s => /mathjax/i.test(s))")
    assert scripts and all(s.startswith("file:") and "/_static/mathjax/" in s for s in scripts), scripts
    assert page.evaluate("() => document.querySelectorAll('mjx-container').length") > 0, "no typeset math"
    raw = page.evaluate("""() => [...document.querySelectorAll('span.math, div.math')]
        .filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 80))""")
    assert raw == [], f"math left as raw TeX: {raw[:5]}"
    # every figure decodes
    images = page.evaluate("""() => [...document.querySelectorAll('article img')]
        .map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0}))""")
    assert images, "no figure: every chapter teaches with at least one"
    broken = [i["src"] for i in images if not i["ok"]]
    assert not broken, f"images that do not decode: {broken}"
    assert failed == [], f"local requests that failed: {failed}"
    assert remote == [], f"the page fetched from the network: {remote}"
    # the Colab button
    owner_repo = re.fullmatch(r"https://github\.com/(.+)", CONFIG["repository"]["url"].rstrip("/")).group(1)
    links = page.evaluate("() => [...document.querySelectorAll('a')].map(a => a.href)"
                          ".filter(h => h.includes('colab.research.google.com'))")
    expected = (f"https://colab.research.google.com/github/{owner_repo}/blob/"
                f"{CONFIG['repository']['branch']}/{chapter}.ipynb")
    assert expected in links, f"Colab link {links} != {expected}"


MARKER_LINE = r"^\s*(#\||# NBVAL_)"      # the lines _ext/strip_markers.py removes (no indent there; any here)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.split("/")[-1])
def test_code_shows_no_markers_and_fits_the_page(chapter_pages, chapter):
    """The notebooks keep their nbdev/nbval marker lines; the book shows none of them, in the text of any code
    cell (hidden ones included). A tqdm bar shows one line, not one line per redraw (collapse_progress, tested in
    test_book_structure.py, finds nothing left to collapse in any output). At a 1,400-px window no code block (cell input, output, or Markdown code)
    is wider than its box: with every folded cell opened, no `pre` has scrollWidth > clientWidth + 1."""
    page, _, _ = chapter_pages(chapter)                            # opened by the check above, or now
    assert page.evaluate("() => window.innerWidth") == 1400
    inputs = page.evaluate("() => [...document.querySelectorAll('article div.cell_input')].map(e => e.textContent)")
    assert inputs, "no code cells found (did myst-nb's markup change?)"
    shown = [line.strip() for text in inputs for line in text.splitlines() if re.match(MARKER_LINE, line)]
    assert shown == [], f"marker lines shown in code cells: {shown[:5]}"
    outputs = page.evaluate("() => [...document.querySelectorAll('article div.cell_output pre')]"
                            ".map(e => e.textContent)")
    redraws = [text[:300] for text in outputs if collapse_progress(text) != text]
    assert redraws == [], f"progress-bar redraws shown (_ext/progress_bars.py keeps the last): {redraws[:2]}"
    page.evaluate("() => document.querySelectorAll('article details').forEach(d => { d.open = true; })")
    blocks = page.evaluate("""() => [...document.querySelectorAll('article pre')].map(p => ({
        sw: p.scrollWidth, cw: p.clientWidth, line: p.textContent.split('\\n')
            .reduce((a, l) => l.length > a.length ? l : a, '').slice(0, 100)}))""")
    assert all(b["cw"] > 0 for b in blocks), "a code block is still hidden: its width cannot be checked"
    wide = [f"{b['sw']} > {b['cw']} px: {b['line']}" for b in blocks if b["sw"] > b["cw"] + 1]
    assert wide == [], f"code blocks that scroll sideways at 1,400 px: {wide[:5]}"


def test_landing_page_and_bibliography(browser):
    page, failed, remote = open_page(browser, "intro.html")
    try:
        links = page.evaluate("() => [...document.querySelectorAll('article a')].map(a => a.getAttribute('href'))")
        assert all(any(h and h.startswith(f"{c}.html") for h in links) for c in CHAPTERS), links
        assert failed == [] and remote == []
    finally:
        page.close()
    page, failed, remote = open_page(browser, "references.html")
    try:
        assert "attention is all you need" in page.inner_text("article").lower()
        assert failed == [] and remote == []
    finally:
        page.close()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.split("/")[-1])
def test_page_fits_a_phone(chapter_pages, chapter):
    """At a 390-px window (a phone) nothing widens the page: no sideways scrolling of the whole document (inline
    code literals break, _static/code-width.css). Tables and wide outputs may scroll inside their own box."""
    page, _, _ = chapter_pages(chapter)
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        width = page.evaluate("() => document.documentElement.scrollWidth")
        culprits = page.evaluate("""() => [...document.querySelectorAll('article *')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1 && !e.closest('pre, table, .MathJax,'
                         + ' mjx-container, .cell_output, .table-wrapper, .bd-toc'))
            .slice(0, 3).map(e => e.tagName + ': ' + e.textContent.slice(0, 60))""")
        assert width <= 391, f"the page is {width} px wide at a 390-px window: {culprits}"
    finally:       # closed rather than resized back: laying the page out again at 1,400 px took longer (0.7 s here)
        chapter_pages.close(chapter)
