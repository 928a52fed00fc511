"""The registry's pages in a real Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import shutil

import pytest
from playwright.sync_api import expect, sync_playwright

from .bundles import make_pyfix_bundle, put

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture
def seeded(registry, tmp_path):
    with registry.client(registry.token) as c:
        for name, desc in [("alpha", "Sorting puzzles."), ("beta", "Parsing drills."), ("gamma", "More sorting work.")]:
            assert put(c, make_pyfix_bundle(tmp_path, name=f"envkit/{name}", description=desc), name=name).status_code == 201
        assert put(c, make_pyfix_bundle(tmp_path, name="envkit/alpha", version="1.1.0", description="Sorting puzzles."),
                   name="alpha", version="1.1.0").status_code == 201
        c.post("/environments/envkit/alpha/versions/1.1.0/yank", json={"reason": "hidden tests leak"}).raise_for_status()
        c.post("/environments/envkit/alpha/versions/1.0.0/deprecate", json={"successor": "envkit/alpha@1.2.0"}).raise_for_status()
        c.post("/environments/envkit/alpha/versions/1.0.0/health",
               json={"episodes": 64, "infra_failures": {"sandbox_start": 2}, "model_failures": 8,
                     "oracle_pass_rate": 1.0, "p50_episode_s": 3.2, "p95_episode_s": 9.5,
                     "probes": {"set": "quick", "tasks": 13, "episodes": 156, "beaten": {"exit-zero": ["fix-median"]},
                                "skipped": {"off-origin": "the environment offers no browser tool"}}}).raise_for_status()
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
