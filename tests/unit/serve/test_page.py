"""The web page in a real browser: Debian's chromium driven by Playwright against a live server (tiny model). Skipped,
with the reason, where chromium or Playwright is missing (scripts/setup.sh --dev installs both)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
from serve_helpers import DOC, ThreadServer, make_runtime

CHROMIUM = os.environ.get("DPINFER_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync"]
SHOTS = os.environ.get("DPINFER_SCREENSHOTS")
"""Folder to write the screenshots of docs/serve.md to (unset: none written)."""

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (scripts/setup.sh --dev)")
if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
    pytest.skip(f"chromium not found at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

GOLD = [("John Smith", "PERSON"), ("12 March 1961", "DATETIME"), ("14 Baker Street", "LOC"), ("London", "LOC")]


@pytest.fixture(scope="module")
def page_server(tiny_lm, tmp_path_factory):
    from dpinfer.serve.app import create_app

    runtime = make_runtime(tiny_lm, tmp_path_factory.mktemp("page"), default_epsilon=1000.0)
    with ThreadServer(create_app(runtime, None)) as srv:
        srv.runtime = runtime
        yield srv
    runtime.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser, page_server):
    ctx = browser.new_context(viewport={"width": 1100, "height": 1300})
    pg = ctx.new_page()
    requests: list[str] = []
    console: list[str] = []
    pg.on("request", lambda r: requests.append(r.url))
    pg.on("console", lambda m: console.append(m.text))
    response = pg.goto(page_server.url + "/")
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    yield pg
    ctx.close()
    outside = [u for u in requests if not u.startswith(page_server.url)]
    assert outside == []  # no external asset
    assert not [m for m in console if "Content Security Policy" in m]  # the page works under its own CSP


def shot(pg, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def select(pg, start: int, end: int) -> None:
    pg.evaluate("([a, b]) => { const t = document.getElementById('doc'); t.focus(); t.setSelectionRange(a, b); }",
                [start, end])


def test_sanitise_the_example_with_gold_spans_shows_the_guarantee_and_the_budget(page) -> None:
    page.get_by_label("Document", exact=True).fill(DOC)
    for text, label in GOLD:
        start = DOC.index(text)
        select(page, start, start + len(text))
        page.get_by_label("Type of a new span").select_option(label)
        page.get_by_role("button", name="Add the selected text as a span").click()
    assert page.locator("#doc-view mark").count() == 4
    assert page.locator("#doc-view mark.PERSON").inner_text() == "John Smith"
    page.get_by_label("ε for PERSON").fill("30")
    page.get_by_label("Longest rewrite", exact=False).fill("8")
    page.get_by_label("Budget unit", exact=False).fill("page-case")
    shot(page, "serve-spans.png")
    page.get_by_role("button", name="Rewrite").click()
    page.locator("#out-sanitize").wait_for(state="visible", timeout=120_000)
    assert "differential" in page.locator("#guarantee-sanitize").inner_text() or \
        "ε" in page.locator("#guarantee-sanitize").inner_text()
    assert page.locator("#budget-sanitize").inner_text().startswith("Budget left on unit page-case: ε =")
    assert page.locator("#error-sanitize").is_hidden()
    shot(page, "serve-rewrite.png")


def test_remove_a_span_and_find_spans_with_the_tagger(page) -> None:
    page.get_by_label("Document", exact=True).fill(DOC)
    page.get_by_role("button", name="Find private spans").click()
    page.locator("#span-list li").first.wait_for(timeout=60_000)  # (no eval: the page's CSP forbids it)
    n = page.locator("#span-list li").count()
    page.locator("#span-list li button").first.click()
    assert page.locator("#span-list li").count() == n - 1


def test_an_over_budget_run_is_refused_with_a_readable_message(page, page_server) -> None:
    r = httpx.put(page_server.url + "/v1/budget/tiny-unit", json={"epsilon": 1})
    assert r.status_code == 200
    page.get_by_label("Document", exact=True).fill(DOC)
    start = DOC.index("John Smith")
    select(page, start, start + 10)
    page.get_by_role("button", name="Add the selected text as a span").click()
    page.get_by_label("Longest rewrite", exact=False).fill("4")
    page.get_by_label("Budget unit", exact=False).fill("tiny-unit")
    before = page_server.runtime.metrics.tokens
    page.get_by_role("button", name="Rewrite").click()
    alert = page.get_by_role("alert")
    alert.wait_for(state="visible", timeout=60_000)
    text = alert.inner_text()
    assert "budget exceeded for the unit" in text and "nothing was generated" in text
    assert "Budget left on unit tiny-unit" in text
    assert page.locator("#out-sanitize").is_hidden()
    assert page_server.runtime.metrics.tokens == before
    shot(page, "serve-refused.png")


def test_works_with_the_keyboard_only(page) -> None:
    kb = page.keyboard
    page.locator("#api-key").focus()
    kb.press("Tab")  # the selected tab
    assert page.evaluate("document.activeElement.id") == "tab-sanitize"
    kb.press("ArrowRight")
    assert page.evaluate("document.activeElement.id") == "tab-ask"
    assert page.locator("#panel-ask").is_visible() and page.locator("#panel-sanitize").is_hidden()
    kb.press("ArrowLeft")
    kb.press("Tab")  # into the sanitise panel: the document
    assert page.evaluate("document.activeElement.id") == "doc"
    kb.insert_text(DOC)
    start = DOC.index("John Smith")
    for _ in range(len(DOC) - start):  # select "John Smith" with the keyboard
        kb.press("ArrowLeft")
    for _ in range(len("John Smith")):
        kb.press("Shift+ArrowRight")
    while page.evaluate("document.activeElement.id") != "add-span":
        kb.press("Tab")
    kb.press("Enter")
    assert page.locator("#doc-view mark.PERSON").inner_text() == "John Smith"
    while page.evaluate("document.activeElement.id") != "max-tokens":
        kb.press("Tab")
    kb.type("6")
    while page.evaluate("document.activeElement.id") != "run-sanitize":
        kb.press("Tab")
    kb.press("Enter")
    page.locator("#out-sanitize").wait_for(state="visible", timeout=120_000)
    # the document's own unit (a keyed hash of its text), as the command line names it
    assert page.locator("#budget-sanitize").inner_text().startswith("Budget left on unit h-")


def test_every_input_has_a_label(page) -> None:
    unlabeled = page.evaluate("""() => Array.from(document.querySelectorAll('input, textarea, select'))
        .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')).map(el => el.id)""")
    assert unlabeled == []
