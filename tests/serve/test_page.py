"""The search page in a real browser (playwright driving the system chromium; skipped without either):
pick an image and see k results, drop another, click a result to search with it, see an error."""

from __future__ import annotations

import base64
import shutil
import time

import pytest
from helpers.pages import screenshot_stats

from helpers.serving import cli_records

K = 5


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed: no browser test")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(browser):
    """A page for playwright's scripted checks (``wait_for_function`` evaluates strings, which the service's
    Content-Security-Policy forbids: it is bypassed here and tested on its own below)."""
    return browser.new_page(viewport={"width": 1280, "height": 900}, bypass_csp=True)


def _results(page) -> list[dict]:
    return page.eval_on_selector_all(".result", """cards => cards.map(card => ({
        id: card.dataset.id, score: card.querySelector('.score').textContent,
        label: card.querySelector('.label')?.textContent ?? null,
        loaded: card.querySelector('img').complete && card.querySelector('img').naturalWidth > 0}))""")


def _wait_for_status(page, text: str) -> None:
    page.wait_for_function("text => document.getElementById('status').textContent.includes(text)", arg=text,
                           timeout=60_000)


@pytest.mark.slow
def test_pick_drop_and_click_in_a_browser(browser_page, live_server, served, query_files, tmp_path, capsys):
    page = browser_page
    expected = cli_records(served / "idx", query_files, tmp_path, k=K)
    capsys.readouterr()
    page.goto(live_server)
    page.wait_for_function("document.getElementById('index-info').textContent.includes('12 items')")
    page.fill("#k", str(K))
    # pick a file: k results with their thumbnails, scores and labels as rankopt search gives them
    page.set_input_files("#file", str(query_files[0]))
    _wait_for_status(page, f"top {K} for {query_files[0].name}")
    page.wait_for_function("[...document.querySelectorAll('.result img')].every(i => i.complete && i.naturalWidth > 0)")
    shown = _results(page)
    want = expected[0]["results"]
    assert [r["id"] for r in shown] == [str(r["id"]) for r in want]
    assert [r["score"] for r in shown] == [f"{r['score']:.4f}" for r in want]
    assert [r["label"] for r in shown] == [r["label"] for r in want] and all(r["loaded"] for r in shown)
    assert page.is_visible("#query-image")
    # drop another image on the drop zone
    data = base64.b64encode(query_files[1].read_bytes()).decode()
    transfer = page.evaluate_handle("""([data, name]) => {
        const bytes = Uint8Array.from(atob(data), c => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], name, {type: 'image/jpeg'}));
        return transfer; }""", [data, query_files[1].name])
    page.dispatch_event("#drop", "drop", {"dataTransfer": transfer})
    _wait_for_status(page, f"top {K} for {query_files[1].name}")
    assert [r["id"] for r in _results(page)] == [str(r["id"]) for r in expected[1]["results"]]
    # click a result: more like this, the clicked item first
    clicked = _results(page)[2]["id"]
    page.click(f".result[data-id='{clicked}']")
    _wait_for_status(page, f"top {K} for item {clicked}")
    shown = _results(page)
    assert len(shown) == K and shown[0]["id"] == clicked and shown[0]["score"] == "1.0000"
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    colours, spread = screenshot_stats(tmp_path / "page.png")
    assert colours > 50 and spread > 10, f"blank page: {colours} colours, std {spread:.1f}"
    # a file that is not an image: the error is shown, the results stay
    page.set_input_files("#file", {"name": "notes.png", "mimeType": "image/png", "buffer": b"not an image"})
    page.wait_for_selector("#status.error")
    assert "not an image" in page.inner_text("#status") and len(_results(page)) == K


@pytest.mark.slow
def test_the_page_works_under_its_content_security_policy(browser, live_server, query_files):
    """The service's own page, its script, styles, thumbnails and the dropped image's preview, all load under the
    Content-Security-Policy it sends: no violation reported, the results shown with their pictures."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    messages: list[str] = []
    page.on("console", lambda message: messages.append(message.text))
    page.goto(live_server)
    page.wait_for_selector("#index-info:has-text('12 items')", timeout=60_000)
    page.set_input_files("#file", str(query_files[0]))
    page.wait_for_selector(f"#status:has-text('for {query_files[0].name}')", timeout=60_000)
    page.wait_for_selector(".result img", timeout=60_000)
    # thumbnails load lazily: bring each into view, then wait until every picture has finished (loaded or failed)
    pictures = "[...document.querySelectorAll('.result img, #query-image')]"
    page.evaluate(f"{pictures}.forEach(i => i.scrollIntoView())")
    deadline = time.monotonic() + 60  # polled from here: wait_for_function may need eval, which the policy forbids
    while not page.evaluate(f"{pictures}.every(i => i.complete)") and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    loaded = page.evaluate(f"{pictures}.map(i => i.naturalWidth > 0)")
    assert len(loaded) > 1 and all(loaded), loaded
    assert page.evaluate("getComputedStyle(document.body).fontFamily") not in ("", "Times New Roman")  # style.css
    assert not [m for m in messages if "Content Security Policy" in m], messages
