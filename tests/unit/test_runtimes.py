"""Who decides the sandbox runtime (envkit.sandbox.runtimes), and what gVisor changes in a
sandbox's container options. The engine is faked at its declared seam: ``client.info()``."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from envkit.errors import UserError
from envkit.sandbox import SandboxLimits
from envkit.sandbox.limits import guest_args, gvisor_host_pids, limit_options
from envkit.sandbox.runtimes import choose_runtime

from ..conftest import envkit


def engine(*runtimes: str) -> SimpleNamespace:
    return SimpleNamespace(info=lambda: {"Runtimes": {name: {} for name in runtimes}})


@pytest.fixture(autouse=True)
def no_user_settings(monkeypatch, tmp_path):
    monkeypatch.delenv("ENVKIT_RUNTIME", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "envkit" / "config.toml"


def test_defaults_pulled_under_gvisor_local_under_runc():
    both = engine("runc", "runsc")
    assert choose_runtime(None, pulled=True, network="none", client=both).runtime == "gvisor"
    assert choose_runtime(None, pulled=False, network="none", client=both).runtime == "runc"


def test_a_pulled_environment_cannot_lower_itself_to_runc_but_the_user_can(monkeypatch, no_user_settings):
    both = engine("runc", "runsc")
    assert choose_runtime("runc", pulled=True, network="none", client=both).runtime == "gvisor"
    assert choose_runtime("gvisor", pulled=False, network="none", client=both).runtime == "gvisor"  # may ask for more
    assert choose_runtime("runc", pulled=True, network="none", requested="runc", client=both).why == "--runtime"
    monkeypatch.setenv("ENVKIT_RUNTIME", "runc")
    assert choose_runtime(None, pulled=True, network="none", client=both).runtime == "runc"
    monkeypatch.delenv("ENVKIT_RUNTIME")
    no_user_settings.parent.mkdir(parents=True)
    no_user_settings.write_text('[runtime]\npulled = "runc"\nlocal = "gvisor"\n')
    assert choose_runtime(None, pulled=True, network="none", client=both).runtime == "runc"
    assert choose_runtime(None, pulled=False, network="none", client=both).runtime == "gvisor"
    no_user_settings.write_text('[runtime]\nlocal = "kata"\n')
    with pytest.raises(UserError, match="unknown sandbox runtime 'kata'"):
        choose_runtime(None, pulled=False, network="none", client=both)


def test_gvisor_asked_for_where_the_engine_lacks_it_is_refused_never_runc(caplog):
    runc_only = engine("runc")
    for kwargs in ({"requested": "gvisor"}, {}):
        with pytest.raises(UserError) as e:
            choose_runtime("gvisor", pulled=False, network="none", client=runc_only, **kwargs)
        assert "not registered" in e.value.message and "scripts/setup.sh" in e.value.hint
    # the default for a pulled environment is gVisor *when available*: runc, said out loud
    with caplog.at_level(logging.WARNING):
        choice = choose_runtime(None, pulled=True, network="none", client=runc_only)
    assert choice.runtime == "runc" and "gVisor missing" in choice.why and "not registered" in caplog.text
    with pytest.raises(UserError, match="network"):
        choose_runtime(None, pulled=True, network="bridge", client=engine("runc", "runsc"))


def test_gvisor_container_options():
    runc, gvisor = SandboxLimits(pids=64, memory_mb=256), SandboxLimits(pids=64, memory_mb=256, runtime="gvisor")
    a, b = limit_options(runc), limit_options(gvisor)
    assert "runtime" not in a and a["pids_limit"] == 64 and a["mem_limit"] == "256m" and a["oom_score_adj"] == 500
    assert b["runtime"] == "runsc" and b["pids_limit"] == gvisor_host_pids(64) > 3 * 64
    # the sentry's share; no adj the engine gives the sentry
    assert b["mem_limit"] == "384m" and "oom_score_adj" not in b
    assert guest_args(runc) == [] and guest_args(gvisor) == ["--agent-pids", "64"]


def test_a_bad_runtime_on_the_command_line_is_exit_2():
    proc = envkit("run", "environments/shellcmd", "--task", "x", "--runtime", "kata")
    assert proc.returncode == 2 and "unknown sandbox runtime 'kata'" in proc.stderr and "Traceback" not in proc.stderr
