"""What the registry's environment page shows of a README and a health history (no server)."""

from __future__ import annotations

import datetime as dt

from registry_server.web.present import README_LIMIT, health_chart, render_markdown, verifier_kind


def test_a_readme_is_rendered_without_anything_that_runs_or_loads():
    html, notice = render_markdown(b'# T\n<script>x()</script>\n\n![b](http://203.0.113.1/b.png)\n\n'
                                   b'[j](javascript:alert(1)) [o](https://example.org)\n'
                                   b'\n<a href="http://x" onclick="y()">raw</a>\n')
    assert notice == "" and "<h3>T</h3>" in html
    assert "<script" not in html and "<img" not in html and "onclick=\"" not in html and 'href="javascript' not in html
    assert '<a href="https://example.org" rel="nofollow noopener noreferrer">o</a>' in html


def test_a_readme_too_large_or_not_utf8_is_a_notice():
    assert render_markdown(b"x" * (README_LIMIT + 1)) == ("", f"The README is {(README_LIMIT + 1) / 1024:.0f} KiB, "
                                                            f"more than this page shows ({README_LIMIT // 1024} KiB).")
    html, notice = render_markdown(b"ok \xff")
    assert html == "" and "not UTF-8" in notice


def test_the_health_chart_has_a_point_per_report_and_rate():
    at = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)
    points = [{"at": at, "episodes": 10, "own": i % 2 == 0, "reporter": "alice", "run": f"r{i}",
               "infra_failure_rate": 0.1 * i, "verifier_failure_rate": 0.0,
               "oracle_pass_rate": None if i == 1 else 1.0, "probes_beaten": 1 if i == 2 else None}
              for i in range(3)]
    svg = health_chart(points)
    assert svg.startswith("<svg") and svg.count("<circle") == 3 + 3 + 2 and svg.count("<polyline") == 3
    assert "hack probes: 1 beat a task" in svg and "run r2" in svg and "<script" not in svg
    assert health_chart([]) == ""


def test_the_verifier_kind_comes_from_the_spec():
    assert verifier_kind({"verifier": {"command": "python3 /opt/envkit/pytest_verifier.py --tests t"}})[0] == (
        "pytest + envkit_check")
    assert verifier_kind({"environment": {"kind": "container"}, "verifier": {}})[0] == "Harbor tests"
    assert verifier_kind({"verifier": {"command": "./check"}})[0] == "custom command"
