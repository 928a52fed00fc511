"""The registry's pages in a real Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import os
import shutil

import pytest
from playwright.sync_api import expect, sync_playwright

from .bundles import make_many_tasks_bundle, make_pyfix_bundle, put

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture
def seeded(registry, tmp_path):
    with registry.client(registry.token) as c:
        for name, desc in [("alpha", "Sorting puzzles."), ("beta", "Parsing drills."), ("gamma", "More sorting work.")]:
            assert put(c, make_pyfix_bundle(tmp_path, name=f"envkit/{name}", description=desc),
                       name=name).status_code == 201
        assert put(c, make_pyfix_bundle(tmp_path, name="envkit/alpha", version="1.1.0", description="Sorting puzzles."),
                   name="alpha", version="1.1.0").status_code == 201
        c.post("/environments/envkit/alpha/versions/1.1.0/yank",
               json={"reason": "hidden tests leak"}).raise_for_status()
        c.post("/environments/envkit/alpha/versions/1.0.0/deprecate",
               json={"successor": "envkit/alpha@1.2.0"}).raise_for_status()
        c.post("/environments/envkit/alpha/versions/1.0.0/health",
               json={"episodes": 64, "infra_failures": {"sandbox_start": 2}, "model_failures": 8,
                     "oracle_pass_rate": 1.0, "p50_episode_s": 3.2, "p95_episode_s": 9.5,
                     "probes": {"set": "quick", "tasks": 13, "episodes": 156, "beaten": {"exit-zero": ["fix-median"]},
                                "skipped": {
                                    "off-origin": "the environment offers no browser tool"}}}).raise_for_status()
    return registry


def test_list_search_click_through(seeded):
    if not shutil.which("chromium"):
        pytest.fail("Debian's chromium is not installed: run scripts/setup.sh")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(seeded.url + "/")
            rows = page.locator("#environments tbody tr")
            expect(rows).to_have_count(3)
            page.get_by_role("searchbox", name="Search environments").fill("sorting")
            page.get_by_role("button", name="Search").click()
            expect(page.locator("#result-count")).to_contain_text("2 environments matching")
            expect(rows).to_have_count(2)
            page.get_by_role("link", name="envkit/alpha").click()
            expect(page.get_by_role("heading", level=1)).to_contain_text("envkit/alpha")
            versions = page.locator("#versions tbody tr.version")
            expect(versions).to_have_count(2)
            expect(versions.nth(0)).to_contain_text("1.1.0")
            expect(versions.nth(0).locator(".badge.yanked")).to_be_visible()
            expect(versions.nth(0)).to_contain_text("hidden tests leak")
            expect(versions.nth(1)).to_contain_text("deprecated → envkit/alpha@1.2.0")
            expect(versions.nth(1)).to_contain_text("64 episodes")
            expect(versions.nth(1)).to_contain_text("infra failures 3.1%")
            expect(versions.nth(1)).to_contain_text("oracle pass 100%")
            expect(versions.nth(1).locator(".probes")).to_contain_text("hack probes (quick): 156 episodes on 13 tasks")
            expect(versions.nth(1).locator(".beaten")).to_have_text("exit-zero beat fix-median")
            expect(versions.nth(1).locator(".probes")).to_contain_text("skipped: off-origin")
            expect(page.locator("body")).to_contain_text("13 tasks")
            page.goto(seeded.url + "/e/envkit/nope")
            expect(page.locator("h1")).to_have_text("Not found")
        finally:
            browser.close()


README = b"""# Alpha

Sorting puzzles for agents. <script>document.title = "pwned"</script>

<img src="http://203.0.113.9/track.png" onerror="document.title='pwned'">

![a remote badge](http://203.0.113.9/badge.svg) and [the docs](https://example.org/docs).

| task | what |
| --- | --- |
| fix-median | even lengths |
"""


@pytest.fixture
def hub(registry, tmp_path):
    """Environments to browse: one with a README (with a script and remote images in it), health
    reports over time from its namespace's token and from another user's, one without a README
    and one whose README is not UTF-8."""
    with registry.client(registry.token) as c, registry.client(registry.other_token) as bob:
        assert put(c, make_pyfix_bundle(tmp_path, name="envkit/alpha", readme=README), name="alpha").status_code == 201
        assert put(c, make_pyfix_bundle(tmp_path, name="envkit/beta"), name="beta").status_code == 201
        assert put(c, make_pyfix_bundle(tmp_path, name="envkit/gamma", readme=b"\xff\xfe not utf-8"),
                   name="gamma").status_code == 201
        url = "/environments/envkit/alpha/versions/1.0.0/health"
        for i, (client, infra) in enumerate([(c, 4), (bob, 9), (c, 2), (c, 0)]):
            body = {"episodes": 100, "infra_failures": {"sandbox_start": infra}, "verifier_failures": i,
                    "model_failures": 10, "oracle_pass_rate": 0.9 + i / 40, "run": f"nightly-{i}"}
            if i == 3:
                body["probes"] = {"set": "quick", "tasks": 13, "episodes": 156, "beaten": {}, "skipped": {}}
            assert client.post(url, json=body).status_code == 201
    return registry


def _links_resolve(page, base: str) -> int:
    """Every link on the page answers 200 (same-site links; anchors on the page exist)."""
    import httpx

    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    checked = 0
    for href in hrefs:
        if href.startswith("#"):
            assert page.locator(href).count() == 1, href
        elif href.startswith("/"):
            assert httpx.get(base + href).status_code == 200, href
            checked += 1
    return checked


def test_environment_pages_show_what_an_environment_is(hub, tmp_path):
    import httpx

    if not shutil.which("chromium"):
        pytest.fail("Debian's chromium is not installed: run scripts/setup.sh")
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.goto(hub.url + "/e/envkit/alpha")
            expect(page.get_by_role("heading", level=1)).to_contain_text("envkit/alpha")
            readme = page.locator("#readme-body")
            expect(readme.get_by_role("heading", level=3)).to_have_text("Alpha")  # under the page's own headings
            expect(readme.locator("table")).to_contain_text("even lengths")
            expect(readme).to_contain_text("<script>")  # shown as text, never run
            assert readme.locator("script, img, iframe").count() == 0
            assert page.title() != "pwned" and page.locator("script").count() == 0
            expect(readme.locator(".img-alt")).to_have_text("[a remote badge]")
            assert readme.get_by_role("link", name="the docs").get_attribute("rel") == "nofollow noopener noreferrer"
            assert all(r.startswith(hub.url) for r in requests), requests  # no remote resource was fetched
            # the tasks, never their params or oracles; the files, not the verifier's or oracles'
            tasks = page.locator("#task-table tbody tr")
            expect(tasks).to_have_count(13)
            expect(page.locator("#task-table")).to_contain_text("fix-median")
            assert ("oracle/" not in page.locator("#task-table").inner_text()
                    and "params" not in page.locator("#task-table").inner_text())
            files = page.locator("#file-table").inner_text()
            assert "README.md" in files and "repo/kit/stats.py" in files and "tasks.jsonl" not in files
            assert "oracle/" not in files and "verify/" not in files
            expect(page.locator("#files")).to_contain_text("of the verifier's and oracles' not listed")
            facts = page.locator("#facts")
            expect(facts).to_contain_text("pytest + envkit_check")
            expect(facts).to_contain_text("bash")
            expect(facts).to_contain_text("512 MiB memory")
            # health over time: a point per report and rate, own tokens filled, others hollow; the split table
            chart = page.locator(".health-chart")
            expect(chart).to_be_visible()
            expect(chart.locator("circle")).to_have_count(12)
            expect(chart.locator("polyline")).to_have_count(3)
            split = page.locator("#health-split tbody tr")
            expect(split.nth(0)).to_contain_text("from the namespace's own tokens")
            expect(split.nth(0).locator("td").nth(1)).to_have_text("3")
            expect(split.nth(1).locator("td").nth(1)).to_have_text("1")
            expect(split.nth(1).locator("td").nth(3)).to_have_text("9.0%")
            assert _links_resolve(page, hub.url) >= 2
            if shots := os.environ.get("ENVKIT_SCREENSHOTS"):
                page.screenshot(path=f"{shots}/registry-environment.png", full_page=True)

            page.goto(hub.url + "/e/envkit/beta")
            expect(page.locator("#readme-notice")).to_have_text("This version has no README.")
            expect(page.locator("#no-health")).to_contain_text("No health reports for 1.0.0 yet")
            page.goto(hub.url + "/e/envkit/gamma")
            expect(page.locator("#readme-notice")).to_contain_text("not UTF-8")

            # the search page and its filters
            page.goto(hub.url + "/")
            expect(page.locator("#environments tbody tr")).to_have_count(3)
            page.get_by_label("with health reports").check()
            page.get_by_role("button", name="Search").click()
            expect(page.locator("#result-count")).to_contain_text("1 environment · with health reports")
            expect(page.locator("#environments tbody tr")).to_contain_text("envkit/alpha")
            page.goto(hub.url + "/?namespace=envkit&kind=repo")
            expect(page.locator("#environments tbody tr")).to_have_count(3)
            page.goto(hub.url + "/?kind=website")
            expect(page.locator("#environments tbody tr")).to_contain_text("No environments")
            page.goto(hub.url + "/")
            assert _links_resolve(page, hub.url) >= 3
            if shots:
                page.screenshot(path=f"{shots}/registry-search.png", full_page=True)
        finally:
            browser.close()
    response = httpx.get(hub.url + "/e/envkit/alpha")
    assert "script-src" not in response.headers["content-security-policy"]  # default-src 'none': no script at all
    assert response.headers["content-security-policy"].startswith("default-src 'none'")
    assert httpx.get(hub.url + "/e/envkit/alpha?version=9.9.9").status_code == 404


def test_an_environment_of_hundreds_of_tasks_pages_through_them(registry, tmp_path):
    """envkit synth makes hundreds of tasks: the page shows 50 at a time, with page links and a
    filter (no script: plain links and a GET form)."""
    if not shutil.which("chromium"):
        pytest.fail("Debian's chromium is not installed: run scripts/setup.sh")
    with registry.client(registry.token) as c:
        assert put(c, make_many_tasks_bundle(tmp_path, 520), name="many").status_code == 201
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(registry.url + "/e/envkit/many")
            rows = page.locator("#task-table tbody tr")
            expect(rows).to_have_count(50)
            expect(page.locator("#tasks")).to_contain_text("(520)")
            expect(rows.first).to_contain_text("task-0000")
            expect(page.locator("#task-pages")).to_contain_text("tasks page 1 of 11")
            page.locator("#task-pages").get_by_role("link", name="next").click()
            expect(rows.first).to_contain_text("task-0050")
            page.locator("#task-pages").get_by_role("link", name="11", exact=True).click()
            expect(rows).to_have_count(20)
            expect(rows.last).to_contain_text("task-0519")
            page.get_by_role("searchbox", name="filter tasks").fill("task number 7")
            page.get_by_role("button", name="filter").click()
            expect(page.locator("#tasks")).to_contain_text("(11 of 520)")  # tasks 7 and 70 to 79
            expect(rows).to_have_count(11)
            expect(rows.first).to_contain_text("task-0007")
        finally:
            browser.close()
