"""schemathesis against the registry's own OpenAPI spec: at least 500 generated cases,
zero 5xx (the `not_a_server_error` check), on SQLite and PostgreSQL."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .bundles import make_pyfix_bundle, put

SCHEMATHESIS = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "schemathesis"


@pytest.mark.slow
def test_no_server_errors_on_generated_requests(registry, tmp_path):
    with registry.client(registry.token) as c:  # some data, so reads find something
        assert put(c, make_pyfix_bundle(tmp_path)).status_code == 201
    proc = subprocess.run(
        [str(SCHEMATHESIS), "run", f"{registry.url}/api/v1/openapi.json", "--checks", "not_a_server_error",
         "--max-examples", "25", "--seed", "20261129", "-H", f"Authorization: Bearer {registry.token}",
         "--report", "junit", "--report-junit-path", str(tmp_path / "fuzz.xml")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    m = re.search(r"(\d+) generated, (\d+) passed", out)
    assert m, out[-3000:]
    generated, passed = int(m[1]), int(m[2])
    assert generated >= 500, out[-2000:]
    assert passed == generated and proc.returncode == 0, out[-4000:]
    assert "Server error" not in out and "500 Internal" not in out
