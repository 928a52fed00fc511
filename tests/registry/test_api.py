"""The registry API against SQLite and a real PostgreSQL (each test runs on both)."""

import hashlib

from sqlalchemy import create_engine, text

from .bundles import image_for, make_pyfix_bundle, put


def assert_error(response, status: int, code: str, fragment: str = ""):
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code and body["message"] and "hint" in body
    assert fragment in body["message"] + body["hint"], body


def test_publish_is_idempotent_and_immutable(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    with registry.client(registry.token) as c:
        first = put(c, bundle)
        assert first.status_code == 201, first.text
        body = first.json()
        assert body["created"] is True
        v = body["version"]
        assert v["ref"] == "envkit/pyfix@1.0.0" and v["bundle_digest"] == bundle.digest and v["task_count"] == 13
        assert v["publisher"] == "alice" and v["size"] == len(bundle.data)
        again = put(c, bundle)
        assert again.status_code == 200 and again.json()["created"] is False
        other = make_pyfix_bundle(tmp_path, salt="changed")
        assert_error(put(c, other), 409, "conflict", "bump the version")
    assert len(registry.blob_files()) == 1


def test_digest_is_recomputed(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    with registry.client(registry.token) as c:
        assert_error(put(c, bundle, digest="sha256:" + "0" * 64), 400, "bad_request", "not sha256:0000")
        assert c.get("/environments/envkit/pyfix").status_code == 404
    assert registry.blob_files() == [] and registry.tmp_files() == []


def test_url_must_match_the_bundle(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path, version="2.0.0")
    with registry.client(registry.token) as c:
        assert_error(put(c, bundle, version="1.0.0"), 422, "invalid", "envkit/pyfix@2.0.0")


def test_list_search_and_paging(registry, tmp_path):
    with registry.client(registry.token) as c:
        for n, desc in [("alpha", "sorting"), ("beta", "parsing"), ("gamma", "sorting")]:
            b = make_pyfix_bundle(tmp_path, name=f"envkit/{n}", description=desc)
            assert put(c, b, name=n).status_code == 201
    with registry.client() as anon:  # reads are public
        page = anon.get("/environments", params={"page_size": 2}).json()
        assert page["count"] == 3 and [e["name"] for e in page["data"]] == ["alpha", "beta"]
        page2 = anon.get("/environments", params={"page_size": 2, "page": 2}).json()
        assert [e["name"] for e in page2["data"]] == ["gamma"]
        found = anon.get("/environments", params={"q": "SORTING"}).json()
        assert found["count"] == 2 and {e["name"] for e in found["data"]} == {"alpha", "gamma"}
        assert anon.get("/environments", params={"kind": "website"}).json()["count"] == 0
        detail = anon.get("/environments/envkit/beta").json()
        assert detail["latest_version"] == "1.0.0" and detail["task_count"] == 13 and len(detail["versions"]) == 1


def test_download_bundle(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    with registry.client(registry.token) as c:
        put(c, bundle)
    with registry.client() as anon:
        r = anon.get("/environments/envkit/pyfix/versions/1.0.0/bundle")
        assert r.status_code == 200 and r.headers["x-envkit-digest"] == bundle.digest
        assert "sha256:" + hashlib.sha256(r.content).hexdigest() == bundle.digest
        spec = anon.get("/environments/envkit/pyfix/versions/1.0.0").json()["spec"]
        assert spec["environment"]["name"] == "envkit/pyfix" and spec["limits"]["network"] == "none"


def test_latest_yank_unyank_deprecate(registry, tmp_path):
    with registry.client(registry.token) as c:
        for v in ["1.0.0", "1.10.0", "1.2.0", "2.0.0-rc.1"]:
            assert put(c, make_pyfix_bundle(tmp_path, version=v), version=v).status_code == 201
        latest = c.get("/environments/envkit/pyfix/versions/latest").json()
        assert latest["version"] == "1.10.0"  # semver order; a pre-release only by its version
        assert c.get("/environments/envkit/pyfix/versions/2.0.0-rc.1").json()["version"] == "2.0.0-rc.1"
        c.post("/environments/envkit/pyfix/versions/1.10.0/yank", json={"reason": "broken verifier"}).raise_for_status()
        assert c.get("/environments/envkit/pyfix/versions/latest").json()["version"] == "1.2.0"
        yanked = c.get("/environments/envkit/pyfix/versions/1.10.0").json()
        assert yanked["yanked"] and yanked["yank_reason"] == "broken verifier"  # still downloadable by version
        c.post("/environments/envkit/pyfix/versions/1.10.0/unyank").raise_for_status()
        assert c.get("/environments/envkit/pyfix/versions/latest").json()["version"] == "1.10.0"
        dep = c.post("/environments/envkit/pyfix/versions/1.0.0/deprecate",
                     json={"successor": "envkit/pyfix@1.10.0"}).json()
        assert dep["deprecated"] and dep["successor"] == "envkit/pyfix@1.10.0"
        assert_error(c.post("/environments/envkit/pyfix/versions/1.0.0/deprecate", json={"successor": "nope"}), 422,
                     "invalid")
        versions = [v["version"] for v in c.get("/environments/envkit/pyfix").json()["versions"]]
        assert versions == ["2.0.0-rc.1", "1.10.0", "1.2.0", "1.0.0"]


def test_authz(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    with registry.client() as anon:
        r = put(anon, bundle)
        assert_error(r, 401, "unauthorized", "Bearer")
        assert r.headers["www-authenticate"] == "Bearer"
    with registry.client("ekt_not_a_token") as bad:
        assert_error(put(bad, bundle), 401, "unauthorized")
    with registry.client(registry.other_token) as bob:
        assert_error(put(bob, bundle), 403, "forbidden", "envkit")
        assert_error(bob.post("/environments/envkit/pyfix/versions/1.0.0/yank", json={"reason": "x"}), 403, "forbidden")
    with registry.client(registry.token) as alice:
        created = alice.post("/tokens", json={"name": "ci", "namespaces": ["envkit"]})
        assert created.status_code == 201
        new = created.json()
        assert new["token"].startswith("ekt_") and new["namespaces"] == ["envkit"]
        assert all("token" not in t for t in alice.get("/tokens").json())  # secrets are shown once
        assert_error(alice.post("/tokens", json={"namespaces": ["bobs"]}), 403, "forbidden", "bobs")
        assert_error(alice.post("/tokens", json={"namespaces": ["nobody"]}), 404, "not_found")
    with registry.client(new["token"]) as ci:
        assert put(ci, bundle).status_code == 201
    with registry.client(registry.token) as alice:
        revoked = alice.delete(f"/tokens/{new['id']}").json()
        assert revoked["revoked_at"] is not None
    with registry.client(new["token"]) as ci:
        assert_error(ci.get("/tokens"), 401, "unauthorized", "revoked")


def test_tokens_are_stored_hashed(registry, tmp_path):
    engine = create_engine(registry.settings.database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM tokens")).fetchall()
    engine.dispose()
    secret = registry.token.split("_", 2)[2]
    assert rows and all(secret not in " ".join(str(v) for v in row) for row in rows)


def test_health_reports_are_aggregated(registry, tmp_path):
    with registry.client(registry.token) as c:
        put(c, make_pyfix_bundle(tmp_path))
        url = "/environments/envkit/pyfix/versions/1.0.0/health"
        c.post(url, json={"episodes": 100, "infra_failures": {"sandbox_start": 2}, "model_failures": 10,
                          "oracle_pass_rate": 1.0, "p50_episode_s": 2.0, "p95_episode_s": 6.0}).raise_for_status()
    with registry.client(registry.other_token) as bob:  # any valid token may report
        r = bob.post(url, json={"episodes": 300, "infra_failures": {"sandbox_start": 1, "container_lost": 3},
                                "model_failures": 30, "oracle_pass_rate": 0.5, "p50_episode_s": 4.0,
                                "p95_episode_s": 10.0})
        assert r.status_code == 201
        assert_error(bob.post(url, json={"episodes": 0}), 422, "invalid", "episodes")
    with registry.client() as anon:
        h = anon.get("/environments/envkit/pyfix/versions/1.0.0").json()["health"]
    assert h["reports"] == 2 and h["episodes"] == 400
    assert h["infra_failures"] == {"sandbox_start": 3, "container_lost": 3} and h["infra_failure_rate"] == 0.015
    assert h["model_failures"] == 40 and h["model_failure_rate"] == 0.1
    assert h["oracle_pass_rate"] == 0.625 and h["p50_episode_s"] == 3.5 and h["p95_episode_s"] == 9.0
    assert h["probes"] is None  # no report carried probe results yet


def test_health_reports_carry_probe_results_and_the_newest_is_shown(registry, tmp_path):
    url = "/environments/envkit/pyfix/versions/1.0.0/health"
    first = {"set": "all", "tasks": 13, "episodes": 195, "beaten": {"exit-zero": ["fix-median", "fix-slugify"]},
             "skipped": {"off-origin": "the environment offers no browser tool"}}
    with registry.client(registry.token) as c:
        put(c, make_pyfix_bundle(tmp_path))
        c.post(url, json={"episodes": 26, "probes": first}).raise_for_status()
        r = c.post(url, json={"episodes": 26, "probes": {**first, "set": "quick", "episodes": 156, "beaten": {}}})
        assert r.status_code == 201 and r.json()["probes"]["set"] == "quick" and r.json()["probes"]["beaten"] == {}
        c.post(url, json={"episodes": 26}).raise_for_status()  # a report without probes keeps the last results
        for bad in ({**first, "set": "most"}, {**first, "beaten": {"Exit Zero!": ["t"]}},
                    {**first, "beaten": {"x": ["../t"]}}, {**first, "extra": 1}, {**first, "tasks": -1}):
            assert_error(c.post(url, json={"episodes": 1, "probes": bad}), 422, "invalid")
    with registry.client() as anon:
        h = anon.get("/environments/envkit/pyfix/versions/1.0.0").json()["health"]
    assert h["reports"] == 3 and h["probes"]["set"] == "quick" and h["probes"]["episodes"] == 156
    assert (h["probes"]["skipped"] == {"off-origin": "the environment offers no browser tool"}
            and h["probes"]["reported_at"])


def test_errors_have_one_shape(registry):
    with registry.client() as anon:
        assert_error(anon.get("/environments/envkit/nothing"), 404, "not_found", "doesn't exist")
        assert_error(anon.get("/environments/BAD/x"), 422, "invalid")
        assert_error(anon.get("/no/such/route"), 404, "not_found")
        assert_error(anon.get("/environments", params={"page": 0}), 422, "invalid", "page")


def test_image_id_claim_is_recorded(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    with registry.client(registry.token) as c:
        put(c, bundle)
        assert c.get("/environments/envkit/pyfix/versions/1.0.0").json()["image_id"] == image_for(bundle)


def test_a_container_environment_is_shown_as_not_reproducible(registry, tmp_path):
    from envkit.bundle import make_bundle
    from envkit.harbor import import_harbor
    from envkit.spec import load_environment

    from ..harbor_tasks import write_harbor_tasks

    write_harbor_tasks(tmp_path / "src")
    import_harbor([tmp_path / "src"], tmp_path / "env", name="envkit/harbor-testset")
    harbor = make_bundle(load_environment(tmp_path / "env"))
    with registry.client(registry.token) as c:
        assert put(c, harbor, name="harbor-testset").status_code == 201
        assert put(c, make_pyfix_bundle(tmp_path)).status_code == 201
        assert c.get("/environments/envkit/harbor-testset/versions/1.0.0").json()["reproducible"] is False
        assert c.get("/environments/envkit/pyfix/versions/1.0.0").json()["reproducible"] is True
        page = c.get(registry.url + "/e/envkit/harbor-testset")
        assert page.status_code == 200 and "not reproducible" in page.text
        assert "not reproducible" not in c.get(registry.url + "/e/envkit/pyfix").text


def test_health_reports_say_who_sent_them_and_are_rate_limited(registry, tmp_path):
    registry.settings.health_reports_per_hour = 3  # the live server reads the same settings
    figures = {"episodes": 10, "infra_failures": {"sandbox_start": 1}, "model_failures": 2, "verifier_failures": 1,
               "oracle_pass_rate": 1.0}
    with registry.client(registry.token) as alice, registry.client(registry.other_token) as bob:
        assert put(alice, make_pyfix_bundle(tmp_path)).status_code == 201
        url = "/environments/envkit/pyfix/versions/1.0.0/health"
        mine = alice.post(url, json={**figures, "run": "runs/nightly-42"})
        assert mine.status_code == 201, mine.text
        theirs = bob.post(url, json={**figures, "infra_failures": {}, "verifier_failures": 0})
        assert theirs.status_code == 201, theirs.text
        health = theirs.json()
        assert (health["own_reports"], health["other_reports"], health["reports"]) == (1, 1, 2)
        assert health["verifier_failures"] == 1 and health["verifier_failure_rate"] == 0.05
        assert health["infra_failures"] == {"sandbox_start": 1}  # verifier failures are counted apart
        for _ in range(2):
            assert bob.post(url, json=figures).status_code == 201
        assert_error(bob.post(url, json=figures), 429, "too_many_requests", "in the last hour")  # bob's 4th this hour
        assert alice.post(url, json=figures).status_code == 201  # per token: alice's second is fine
        assert_error(bob.post(url, json={**figures, "run": "bad\nrun"}), 422, "invalid")
        version = alice.get("/environments/envkit/pyfix/versions/1.0.0").json()
        assert (version["health"]["own_reports"], version["health"]["other_reports"]) == (2, 3)
