"""The documentation site in a real browser (issue 36, item 6): headless Chromium on the built site, opened as files.

The site is built as ``make docs`` builds it, then read the way a reader without a server or a network reads it:
``file://`` URLs, and a browser that reaches nothing outside (the theme's CDN included). Held:

- every page the navigation links to opens as a page with its title, never as a directory listing (which is what a
  ``page/`` link shows from files, hence ``use_directory_urls: false``), and every link of the site's pages that
  stays in the site names a file that exists;
- no page asks for anything outside the site (issue 42, item 2): every request its tab makes is a ``file://`` one
  (or data:/blob:/about:), Google Fonts and CDNs included;
- the architecture page's diagrams are drawn: each mermaid block is an SVG (mermaid is bundled, docs/bundled.py),
  and no diagram's source text is left on the page;
- search works (issue 42, item 2): typed into the home page's search box, a word found only on the reload page
  lists that page among the results (the index is read from a script, the worker runs in an iframe);
- no code block hides the end of a line (they wrap), and no key name in the configuration reference is broken over
  two lines.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from tests.ci import require_tool
from tests.harness import REPO
from tests.support.browser import Browser, nodes

DIAGRAMS_PAGE = "architecture.html"
DRAW_TIMEOUT_S = 60.0
SEARCH_PAGE = "operations/reload.html"
SEARCH_QUERY = "kubelet"  # a word of the reload page only (its ConfigMap section)
SEARCH_TIMEOUT_S = 60.0
LOCAL_SCHEMES = ("file", "data", "blob", "about")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    executable = require_tool("chromium", "chromium")
    b = Browser.start(executable, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def _in_site(url: str, site: Path) -> Path | None:
    parts = urlsplit(url)
    if parts.scheme != "file":
        return None
    path = Path(unquote(parts.path))
    return path if path.is_relative_to(site) else None


def _outside(requested: list[str]) -> list[str]:
    """The requests that leave the site (the page would need a network, and a reader offline sees less)."""
    return [url for url in requested if urlsplit(url).scheme not in LOCAL_SCHEMES]


def _mermaid_svgs(doc: dict[str, Any]) -> tuple[int, int]:
    """(mermaid blocks, those drawn: an svg inside the block's shadow root)."""
    blocks = drawn = 0
    for node in nodes(doc):
        attrs = dict(zip(node.get("attributes", [])[::2], node.get("attributes", [])[1::2], strict=True))
        if "mermaid" in attrs.get("class", "").split():
            blocks += 1
            drawn += any(n.get("nodeName", "").lower() == "svg" for n in nodes(node) if n is not node)
    return blocks, drawn


@pytest.mark.long  # the site's build alone takes 20-30 s on a loaded 2-core machine
def test_the_site_works_from_files_and_draws_its_diagrams(site: Path, browser: Browser) -> None:
    home = browser.open((site / "index.html").as_uri(), record_requests=True)
    links = browser.evaluate(home, "[...document.querySelectorAll('a[href]')].map(a => a.href)")
    nav = browser.evaluate(home, "[...document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]')]"
                                 ".map(a => a.href)")
    requested = {"index.html": browser.requested(home)}
    browser.close_tab(home)
    # The recording sees the site's own files, so an empty list of requests outside it means something.
    assert any(u.endswith("/search/search_index.js") or "/assets/javascripts/bundle." in u
               for u in requested["index.html"]), requested["index.html"]
    pages = sorted({p for p in (_in_site(u, site) for u in nav) if p is not None})
    assert len(pages) >= 20, nav
    seen_links: set[str] = set(links)
    titles: dict[str, str] = {}
    for page in pages:
        assert page.is_file(), f"the navigation links to {page}, which is no file: a browser shows a directory"
        tab = browser.open(page.as_uri(), record_requests=True)
        state = browser.evaluate(tab, "({h1: document.querySelector('article h1')?.innerText ?? null, "
                                      "listing: document.title.startsWith('Index of'), "
                                      "links: [...document.querySelectorAll('a[href]')].map(a => a.href)})")
        requested[str(page.relative_to(site))] = browser.requested(tab)
        browser.close_tab(tab)
        assert not state["listing"] and state["h1"], f"{page} does not render as a page: {state}"
        titles[page.name] = state["h1"]
        seen_links.update(state["links"])
    for url in sorted(seen_links):
        target = _in_site(url, site)
        if target is not None:
            assert target.is_file(), f"a link leads to {url}: no such file (a directory listing, or nothing)"
    outside = {page: _outside(urls) for page, urls in requested.items() if _outside(urls)}
    assert outside == {}, f"pages ask for things outside the site (a reader offline goes without): {outside}"

    diagrams = (REPO / "docs" / DIAGRAMS_PAGE.replace(".html", ".md")).read_text().count("```mermaid\n")
    assert diagrams >= 2
    tab = browser.open((site / DIAGRAMS_PAGE).as_uri())
    deadline = time.monotonic() + DRAW_TIMEOUT_S
    while (counts := _mermaid_svgs(browser.document(tab))) != (diagrams, diagrams):
        assert time.monotonic() < deadline, f"mermaid blocks and drawn diagrams on {DIAGRAMS_PAGE}: {counts}"
        time.sleep(0.2)
    assert not browser.evaluate(tab, "document.body.innerText.includes('flowchart TD')")
    texts = " ".join(n.get("nodeValue", "") for n in nodes(browser.document(tab)) if n.get("nodeType") == 3)
    assert "Syntax error" not in texts, "mermaid drew an error instead of a diagram"
    browser.close_tab(tab)


@pytest.mark.long  # shares the build above
def test_search_finds_a_page_from_files(site: Path, browser: Browser) -> None:
    tab = browser.open((site / "index.html").as_uri(), record_requests=True)
    # The header's search box, as a reader clicks into it (the window is wide enough for it to show in the header).
    box = browser.evaluate(tab, "(b => b ? (b.focus(), document.activeElement === b && b.getClientRects().length > 0)"
                                " : null)(document.querySelector('input.md-search__input'))")
    assert box, f"no visible search box on the home page to type into: {box}"
    browser.type(tab, SEARCH_QUERY)
    found = "[...document.querySelectorAll('.md-search-result__list a[href]')].map(a => a.href)"
    target = site / SEARCH_PAGE
    deadline = time.monotonic() + SEARCH_TIMEOUT_S
    while True:
        results = browser.evaluate(tab, found)
        if target in [_in_site(u, site) for u in results]:
            break
        # The list fills once the worker has the index; till then the line above it reads "Initializing search".
        meta = browser.evaluate(tab, "document.querySelector('.md-search-result__meta')?.innerText")
        assert time.monotonic() < deadline, f"{SEARCH_QUERY!r} finds no link to {target}: {meta!r}, {results}"
        time.sleep(0.2)
    assert _outside(requested := browser.requested(tab)) == [], requested
    browser.close_tab(tab)


@pytest.mark.long  # shares the build above
@pytest.mark.parametrize("page", ["index.html", "typed-tables.html", "tutorial.html", "reference/configuration.html"])
def test_code_lines_are_not_cut_off(site: Path, browser: Browser, page: str) -> None:
    tab = browser.open((site / page).as_uri())
    hidden = browser.evaluate(tab, "[...document.querySelectorAll('pre > code')]"
                                   ".filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.innerText.slice(0, 80))")
    browser.close_tab(tab)
    assert hidden == [], f"code blocks of {page} hide the end of their lines: {hidden}"


@pytest.mark.long  # shares the build above
def test_key_names_in_the_configuration_reference_stay_whole(site: Path, browser: Browser) -> None:
    tab = browser.open((site / "reference" / "configuration.html").as_uri())
    keys = browser.evaluate(tab, "[...document.querySelectorAll('td:first-child code')]"
                                 ".map(c => [c.innerText, c.getClientRects().length])")
    browser.close_tab(tab)
    assert len(keys) >= 30, keys
    broken = [name for name, lines in keys if lines != 1]
    assert broken == [], f"key names broken over lines: {broken}"
