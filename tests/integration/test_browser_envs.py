"""Website environments through the browser tool (Playwright + Debian's Chromium)."""

from __future__ import annotations

import json
import subprocess

import pytest

from envkit.agents import NullAgent, OracleAgent, run_episode
from envkit.runtime import EnvRuntime
from envkit.spec import load_environment

from ..conftest import ROOT, envkit
from .conftest import TEST_LABEL


@pytest.fixture(scope="module")
def tracker(client) -> EnvRuntime:
    rt = EnvRuntime(load_environment(ROOT / "environments" / "issuetracker"), client=client)
    rt.backend.labels.update(TEST_LABEL)
    return rt


@pytest.mark.slow
def test_validate_issuetracker_via_cli():
    # a seeded 6 of the 15 tasks (the suite's time budget; scripts/demo.sh validates all 15)
    proc = envkit("validate", "environments/issuetracker", "--sample", "6", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and len(report["tasks"]) == 6 and report["determinism"]["ok"]
    assert all(t["oracle_reward"] == 1.0 and t["null_reward"] == 0.0 for t in report["tasks"])
    probes = report["probes"]  # the default set, played on every task: none beat any
    assert (probes["set"] == "quick" and probes["beaten"] == {}
            and {"off-origin", "disabled-tools"} <= set(probes["run"]))
    assert probes["skipped"]["path-escape"] == "the environment offers no http tool"


def test_snapshot_lists_elements_with_ids_and_pagination_works(tracker):
    class Browse:
        name = "browse"

        def act(self, episode):
            first = episode.browser({"action": "goto", "path": "/issues"})
            assert "page: Issues" in first and "Page 1 of" in first
            nxt = next(line for line in first.splitlines()
                       if line.endswith('"Next page" -> /issues?status=open&assignee=&label=&page=2'))
            element_id = nxt.split("]")[0].strip("[")
            second = episode.browser({"action": "click", "id": int(element_id)})
            assert "Page 2 of" in second
            episode.answer("x")

    result = run_episode(tracker, tracker.env.task("oldest-open"), 0, Browse())
    assert result.outcome == "ok" and len(result.steps) == 3


def test_missing_element_is_the_models_mistake(tracker):
    class Clumsy:
        name = "clumsy"

        def act(self, episode):
            obs = episode.browser({"action": "click", "id": 9999})
            assert obs.startswith("error: no element matches id=9999")
            obs = episode.browser({"action": "goto", "path": "http://example.com/"})
            assert obs.startswith("error: goto needs a path")

    result = run_episode(tracker, tracker.env.task("close-issue"), 0, Clumsy())
    assert result.outcome == "ok" and result.reward == 0.0
    assert [s.exit_code for s in result.steps] == [1, 1]


def test_requests_to_other_origins_are_aborted(tracker):
    class Prober:
        name = "prober"

        def act(self, episode):
            episode.browser({"action": "read"})
            page = episode._browser.page
            verdict = page.evaluate("fetch('http://127.0.0.1:9/').then(() => 'reached', () => 'blocked')")
            assert verdict == "blocked"
            same = page.evaluate("fetch('/health').then(r => r.text())")
            assert same == "ok"

    assert run_episode(tracker, tracker.env.task("close-issue"), 0, Prober()).outcome == "ok"


def test_browser_crash_is_infra(tracker):
    class Crasher:
        name = "crasher"

        def act(self, episode):
            episode.browser({"action": "read"})
            subprocess.run(["pkill", "-9", "-f", "chromium"], check=False)
            episode.browser({"action": "goto", "path": "/issues"})

    result = run_episode(tracker, tracker.env.task("close-issue"), 0, Crasher())
    assert result.outcome == "infra_failure:browser_crash", result.outcome
    assert result.reward is None


def test_oracle_and_null(tracker):
    task = tracker.env.task("reassign-dave")
    assert run_episode(tracker, task, 0, OracleAgent()).reward == 1.0
    assert run_episode(tracker, task, 0, NullAgent()).reward == 0.0


def test_init_website_scaffold_builds_and_validates(tmp_path):
    folder = tmp_path / "guestbook"
    assert envkit("init", str(folder), "--kind", "website").returncode == 0
    proc = envkit("validate", str(folder))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: 2/2 tasks" in proc.stdout
