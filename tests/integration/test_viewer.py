"""`envkit view`: a run of 10,000 trajectories (with a cut-off line and a foreign one) browsed
in a real Chromium (Debian's, driven by Playwright): the list and its filters, paging, one
trajectory's turns (tokens shaded by log-prob, the observation set apart, weight versions,
the parsed tool call), its verifier details and its attempts with their evidence."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT, envkit

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
N = 10_000


def _write_run(run: Path) -> None:
    """A run folder as `envkit train` leaves it, with a tokenizer (the tiny model's) and N
    two-turn trajectories written the way the runner writes them."""
    from rl_runner.policy.tiny import TinySpec, tokenizer_for
    from rl_runner.rollout.chat import ChatFormat
    from rl_runner.rollout.trajectory import Trajectory

    tok_dir = run / "model"
    tok = tokenizer_for(TinySpec())
    tok.save_pretrained(tok_dir)
    (run / "recipe.json").write_text(json.dumps({"model": str(tok_dir)}))
    fmt = ChatFormat(tok)
    conv = fmt.start("What is the code word? Look it up, then answer with it.", ["bash"])
    call = fmt.encode(fmt.format_call("bash", {"command": "./lookup code"})) + [fmt.stop_ids[0]]
    observation = conv.observe(call, "exit 0\nmaple\n")
    answer = fmt.encode(fmt.format_call("answer", {"text": "maple"})) + [fmt.stop_ids[0]]
    completion = call + observation + answer
    mask = [1] * len(call) + [0] * len(observation) + [1] * len(answer)
    logprobs = [-0.01 * (i % 7) if m else 0.0 for i, m in enumerate(mask)]
    logprobs[3] = -6.5  # one unlikely token
    lines = []
    for i in range(N):
        version = str(i // 128)
        versions = [version if m else "" for m in mask]
        versions[-len(answer):] = [str(i // 128 + 1)] * len(answer)  # published between the two turns
        t = Trajectory(env_ref="envkit/lookup@1.0.0" if i % 5 else "envkit/other@2.0.0",
                       image_digest="sha256:" + "ab" * 32, bundle_digest="sha256:" + "cd" * 32,
                       task_id=("find", "look-up", "answer-it")[i % 3], seed=i // 16, group_id=f"g{i // 16}",
                       prompt_token_ids=conv.prompt_ids, completion_token_ids=completion, logprobs=logprobs,
                       weight_versions=versions, loss_mask=mask, reward=1.0 if i % 4 == 0 else 0.0, turns=2,
                       timings={"episode_s": 1.0 + (i % 10) / 10})
        t.verifier = {"expected": "maple", "answered": "maple" if i % 4 == 0 else "rose"}
        if i % 97 == 0:
            t.outcome, t.evidence = "model_failure:unparseable_action", {"message": "the tool call is not valid JSON"}
        if i == 7:
            t.attempts = ["infra_failure:sandbox_start"]
            t.attempt_evidence = [{"container": "c0ffee", "error": "the engine refused the start"}]
        lines.append(json.dumps(t.to_dict()))
    folder = run / "trajectories"
    folder.mkdir(parents=True)
    half = N // 2
    (folder / "step-00001.jsonl").write_text("\n".join(lines[:half]) + '\n{"some": "other program"}\n')
    # cut off: the writer died
    (folder / "step-00002.jsonl").write_text("\n".join(lines[half:]) + "\n" + lines[0][:200])


def test_view_refuses_a_folder_without_trajectories(tmp_path):
    (tmp_path / "trajectories").mkdir()
    p = envkit("view", str(tmp_path))
    assert p.returncode == 2 and "holds no trajectories" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = envkit("view", str(tmp_path / "nope"))
    assert p.returncode == 2 and "does not exist" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_view_browses_ten_thousand_trajectories_in_chromium(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    if not shutil.which("chromium"):
        pytest.fail("Debian's chromium is not installed: run scripts/setup.sh")
    run = tmp_path / "run"
    _write_run(run)
    proc = subprocess.Popen([sys.executable, "-m", "envkit.cli.app", "view", str(run)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, proc.stderr.read() if proc.poll() is not None else "")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url)
                expect(page.locator("#summary")).to_contain_text(f"{N} of {N} trajectories")
                expect(page.locator("#summary")).to_contain_text("2 unreadable lines")
                rows = page.locator("#trajectories tbody tr")
                expect(rows).to_have_count(50)
                page.get_by_role("link", name="next ›").click()
                expect(page.locator("nav.pages")).to_contain_text("page 2 of 201")

                # filters: one environment's model failures
                page.goto(url)
                page.get_by_label("environment").select_option("envkit/other@2.0.0")
                page.get_by_label("outcome").select_option("model_failure:")
                page.get_by_role("button", name="Filter").click()
                failures = [i for i in range(N) if i % 97 == 0 and i % 5 == 0]
                expect(page.locator("#summary")).to_contain_text(f"{len(failures)} of {N} trajectories")
                expect(rows.first).to_contain_text("model_failure:unparseable_action")
                rows.first.get_by_role("link").click()
                expect(page.locator("#evidence")).to_contain_text("the tool call is not valid JSON")

                # one trajectory: the turns, the tokens, the versions, the call, the verifier, the attempts
                page.goto(url + "t/7")
                expect(page.get_by_role("heading", level=1)).to_contain_text("#7 look-up")
                model = page.locator("section.turn.model")
                expect(model).to_have_count(2)
                expect(model.nth(0).locator(".call")).to_have_text('→ bash({"command": "./lookup code"})')
                expect(model.nth(1).locator(".call")).to_have_text('→ answer({"text": "maple"})')
                expect(model.nth(0).locator(".version")).to_have_text("0")
                expect(model.nth(1).locator(".version")).to_have_text("1")
                expect(page.locator("section.turn.runner")).to_contain_text("exit 0")
                expect(page.locator("section.turn.runner")).to_contain_text("maple")
                unlikely = model.nth(0).locator(".tok").nth(3)
                assert "log-prob -6.500" in (unlikely.get_attribute("title") or "")
                assert "rgba(220, 38, 38" in (unlikely.get_attribute("style") or "")
                expect(page.locator("#verifier")).to_contain_text('"answered": "rose"')
                attempts = page.locator("#attempts li")
                expect(attempts).to_have_count(2)
                expect(attempts.nth(0)).to_contain_text("infra_failure:sandbox_start")
                expect(attempts.nth(0)).to_contain_text("the engine refused the start")

                # the lines that are not trajectories: listed, each with why
                page.goto(url + "?unreadable=true")
                expect(rows).to_have_count(2)
                expect(rows.nth(0)).to_contain_text("not a trajectory record")
                expect(rows.nth(1)).to_contain_text("cut off")
                rows.nth(1).get_by_role("link").click()
                expect(page.get_by_role("heading", level=1)).to_contain_text("unreadable")
                page.goto(url + "t/99999")
                expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
            finally:
                browser.close()
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
