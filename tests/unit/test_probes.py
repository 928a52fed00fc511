"""The probe library's rules without Docker: the sets, what applies to which tools, how a
beaten probe shows in `envkit validate`'s table and in the health figures."""

from types import SimpleNamespace

import pytest

from envkit.cli.output import console
from envkit.errors import UserError
from envkit.probes import PROBES, probe_set, skipped
from envkit.validate import TaskCheck, ValidationReport


def test_sets_nest_and_every_probe_names_its_hack():
    quick, every = probe_set("quick"), probe_set("all")
    assert probe_set("none") == [] and set(quick) < set(every) == set(PROBES)
    assert {"hang", "fork-bomb", "kill-verifier"} == {p.name for p in every} - {p.name for p in quick}
    assert len({p.name for p in PROBES}) == len(PROBES) and all(p.hack for p in PROBES)
    with pytest.raises(UserError, match="not a probe set"):
        probe_set("fast")


@pytest.mark.parametrize(("tools", "skip"), [
    (["bash"], {"path-escape", "off-origin"}),
    (["http"], {"report-patch", "exit-zero", "hang", "off-origin"}),
    ([], {"path-escape", "off-origin", "always-equal"}),
    (["bash", "http", "browser"], {"disabled-tools"}),
])
def test_a_probe_needing_a_missing_tool_is_skipped_with_the_reason(tools, skip):
    why = skipped(probe_set("all"), tools)
    assert skip <= set(why), why
    assert all(reason.startswith("the environment offers") for reason in why.values())
    assert "fake-reward-answer" not in why and "answer-stuffing" not in why  # every environment takes an answer


def test_a_beaten_probe_fails_the_task_in_the_table_and_the_figures():
    from envkit.cli.episode_cmd import _print_validation
    from envkit.probes import ProbeResult

    beaten = ProbeResult("exit-zero", "t1", 1.0, "ok", True, "reward 1 above the null agent's 0.0", 0.5)
    held = ProbeResult("always-equal", "t1", 0.0, "ok", False, "", 0.5)
    task = TaskCheck("t1", "easy", 1.0, "ok", 0.0, "ok", 1.0, ["probe exit-zero beat it: reward 1"], [0.5, 0.5],
                     [beaten, held])
    report = ValidationReport("ns/env@1.0.0", "sha256:" + "0" * 64, [task], {"ok": True, "seed": 0, "hashes": []}, 1.0,
                              probe_set="quick", probes_run=["exit-zero", "always-equal"],
                              probes_skipped={"off-origin": "the environment offers no browser tool"})
    assert not report.ok and report.beaten() == {"exit-zero": ["t1"]}
    figures = report.health_figures()["probes"]
    assert figures["beaten"] == {"exit-zero": ["t1"]} and figures["episodes"] == 2 and figures["tasks"] == 1
    with console.capture() as out:
        _print_validation(report, SimpleNamespace(build=SimpleNamespace(task_images={})))
    text = out.get()
    assert "beat t1" in text and "1/2 held" in text and "skipped" in text and "FAIL: 0/1" in text


def test_the_health_figures_count_failures_by_who_caused_them():
    tasks = [TaskCheck("t1", "easy", None, "infra_failure:sandbox_start", None, "", 0.0, ["sandbox: down"]),
             TaskCheck("t2", "easy", 1.0, "ok", 0.0, "model_failure:command_timeout", 1.0, [], [0.5, 0.5]),
             TaskCheck("t3", "easy", None, "verifier_failure:bad_output", None, "infra_failure:sandbox_start", 1.0,
                       ["x"], [0.5, 0.5])]
    report = ValidationReport("ns/env@1.0.0", "sha256:" + "0" * 64, tasks, {"ok": True, "seed": 0, "hashes": []}, 1.0)
    figures = report.health_figures()
    assert figures["episodes"] == 5 and figures["model_failures"] == 1
    # the verifier's apart
    assert figures["infra_failures"] == {"sandbox_start": 2} and figures["verifier_failures"] == 1
    assert figures["run"].startswith("envkit validate ns/env@1.0.0 at ")
