"""The registry keeps its own contract: schemathesis with every check (`--checks all`: server
errors, status codes and response bodies as declared, timestamps as RFC 3339, schema-valid
requests accepted and invalid ones refused, 405 with `Allow` for undeclared methods, …) and
the stateful phase, 60 examples per operation, on SQLite (the schema is the same on PostgreSQL, and
SQLite is where stored times come back without their offset): zero failures.
tests/registry/schemathesis.toml states the one exception (a publish body the schema cannot
describe: a tar that hashes to its digest)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .bundles import make_pyfix_bundle, put

SCHEMATHESIS = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "schemathesis"
CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.mark.slow
# the contract is the schema's: one database (44 s) suffices
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_api_keeps_its_contract(registry, tmp_path):
    with registry.client(registry.token) as c:  # some data, so reads and the stateful phase find something
        assert put(c, make_pyfix_bundle(tmp_path)).status_code == 201
    proc = subprocess.run(
        [str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", f"{registry.url}/api/v1/openapi.json", "--checks",
         "all", "--max-examples", "60", "--seed", "20261204", "-H", f"Authorization: Bearer {registry.token}",
         "--report", "junit", "--report-junit-path", str(tmp_path / "contract.xml")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    m = re.search(r"(\d+) generated, (\d+) passed", out)
    assert m, out[-3000:]
    generated, passed = int(m[1]), int(m[2])
    assert generated >= 1000, out[-2000:]
    assert passed == generated and proc.returncode == 0, out[-6000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in out, out[-3000:]
