"""`envkit yank / unyank / deprecate` and `envkit token create / list / revoke` against a live
registry (SQLite and PostgreSQL), and what `latest` means: the newest release that is not
yanked, a pre-release only by its exact version."""

from __future__ import annotations

import json

import httpx

from ..conftest import envkit
from .bundles import make_pyfix_bundle, put


def _publish(registry, tmp_path, *versions: str) -> None:
    with httpx.Client(base_url=registry.url + "/api/v1", headers={"Authorization": f"Bearer {registry.token}"}) as c:
        for v in versions:
            r = put(c, make_pyfix_bundle(tmp_path, version=v), version=v)
            assert r.status_code == 201, r.text


def _latest(registry) -> str:
    r = httpx.get(f"{registry.url}/api/v1/environments/envkit/pyfix/versions/latest")
    assert r.status_code == 200, r.text
    return r.json()["version"]


def test_yank_unyank_deprecate_and_latest(registry, cli_env, tmp_path):
    _publish(registry, tmp_path, "1.0.0", "1.1.0", "1.2.0-rc.1")
    assert _latest(registry) == "1.1.0"  # the pre-release is newer, but not a release
    listed = json.loads(envkit("search", "pyfix", "--json", env=cli_env).stdout)["data"]
    assert listed[0]["latest_version"] == "1.1.0"

    y = envkit("yank", "envkit/pyfix@1.1.0", "--reason", "wrong oracle", env=cli_env)
    assert y.returncode == 0, y.stderr
    assert "envkit/pyfix@1.1.0: yanked (wrong oracle)" in y.stdout
    assert _latest(registry) == "1.0.0"
    pinned = httpx.get(f"{registry.url}/api/v1/environments/envkit/pyfix/versions/1.1.0").json()
    assert pinned["yanked"] and pinned["yank_reason"] == "wrong oracle"  # still there by its version

    u = envkit("unyank", "envkit/pyfix@1.1.0", "--json", env=cli_env)
    assert u.returncode == 0 and json.loads(u.stdout)["yanked"] is False, u.stderr
    assert _latest(registry) == "1.1.0"

    d = envkit("deprecate", "envkit/pyfix@1.0.0", "--successor", "envkit/pyfix@1.1.0", env=cli_env)
    assert d.returncode == 0 and "deprecated, successor envkit/pyfix@1.1.0" in d.stdout, d.stderr

    # every version yanked but the pre-release: no `latest`, and the error says how to name one
    for v in ("1.0.0", "1.1.0"):
        assert envkit("yank", f"envkit/pyfix@{v}", "--reason", "x", env=cli_env).returncode == 0
    r = httpx.get(f"{registry.url}/api/v1/environments/envkit/pyfix/versions/latest")
    assert r.status_code == 404 and "pre-release" in r.json()["error"]["message"]
    assert httpx.get(f"{registry.url}/api/v1/environments/envkit/pyfix/versions/1.2.0-rc.1").status_code == 200


def test_version_verbs_refuse_bad_input_clearly(registry, cli_env, tmp_path):
    _publish(registry, tmp_path, "1.0.0")
    cases = [
        (("yank", "envkit/pyfix", "--reason", "x"), "names no version"),  # never `latest` by accident
        (("yank", "envkit/pyfix@9.9.9", "--reason", "x"), "has no version 9.9.9"),
        (("deprecate", "envkit/pyfix@1.0.0", "--successor", "envkit/pyfix"), "names no version"),
        (("unyank", "Not A Ref@1"), "ref"),
        (("yank", "envkit/nothing@1.0.0", "--reason", "x"), "doesn't exist"),
        (("yank", "bobs/thing@1.0.0", "--reason", "x"), "may not write to namespace `bobs`"),
    ]
    for args, words in cases:
        p = envkit(*args, env=cli_env)
        assert p.returncode in (1, 2) and words in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    # another user's namespace: refused by the registry, nothing changed
    bob = {**cli_env, "ENVKIT_TOKEN": registry.other_token}
    p = envkit("yank", "envkit/pyfix@1.0.0", "--reason", "mine now", env=bob)
    assert p.returncode != 0 and "Traceback" not in p.stderr and "envkit" in p.stderr, p.stderr
    assert _latest(registry) == "1.0.0"


def test_token_create_list_revoke(registry, cli_env):
    made = envkit("token", "create", "--namespace", "envkit", "--name", "ci", env=cli_env)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("ekt_") and "shown once" in made.stderr
    listed = json.loads(envkit("token", "list", "--json", env=cli_env).stdout)
    mine = [t for t in listed if t["name"] == "ci"]
    assert len(mine) == 1 and mine[0]["namespaces"] == ["envkit"] and "token" not in mine[0]
    table = envkit("token", "list", env=cli_env)
    assert table.returncode == 0 and mine[0]["id"] in table.stdout and secret not in table.stdout

    new = {**cli_env, "ENVKIT_TOKEN": secret}
    assert envkit("token", "list", "--json", env=new).returncode == 0  # the new token works
    gone = envkit("token", "revoke", mine[0]["id"], env=cli_env)
    assert gone.returncode == 0 and f"revoked {mine[0]['id']}" in gone.stdout, gone.stderr
    refused = envkit("token", "list", env=new)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr and "401" not in refused.stdout

    # a namespace the user does not own, and a token id that is not theirs: clear errors
    p = envkit("token", "create", "--namespace", "bobs", env=cli_env)
    assert p.returncode != 0 and "bobs" in p.stderr and "Traceback" not in p.stderr, p.stderr
    bob_id = registry.other_token.split("_")[1]
    p = envkit("token", "revoke", bob_id, env=cli_env)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    # bob's still works
    assert envkit("token", "list", env={**cli_env, "ENVKIT_TOKEN": registry.other_token}).returncode == 0
