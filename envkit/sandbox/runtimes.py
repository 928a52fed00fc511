"""Which OCI runtime a sandbox runs under: ``runc`` (the engine's default: Linux namespaces and
cgroups on the host kernel) or ``gvisor`` (gVisor's ``runsc``: the agent's system calls are
served by a user-space kernel, the sentry, so a kernel bug is not a way out of the sandbox).

Who decides, first answer wins:

1. ``--runtime`` on the command line (``envkit run / validate / rollout / train / bench / serve``);
2. ``ENVKIT_RUNTIME`` in the environment;
3. the user's ``~/.config/envkit/config.toml`` (``XDG_CONFIG_HOME``)::

       [runtime]
       pulled = "gvisor"   # environments pulled from a registry
       local = "runc"      # environment folders on this machine

4. the spec's ``[limits] runtime``, except that a pulled environment cannot lower its own
   isolation: its author may ask for ``gvisor``, never for ``runc`` (the user may);
5. the default: pulled environments under gVisor when the engine has it (a warning and runc
   when it does not), local folders under runc.

gVisor asked for by 1-4 where the engine does not list the runtime is a :class:`UserError`
(exit 2) naming the set-up step, never a silent fallback. docs/architecture.md ("Sandboxes")
says which guarantees differ between the two.
"""

from __future__ import annotations

import logging
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envkit.errors import UserError

__all__ = ["ENGINE_NAMES", "RUNTIMES", "SETUP_STEP", "RuntimeChoice", "check_engine", "choose_runtime",
           "engine_runtimes", "parse_runtime", "user_config_path"]

log = logging.getLogger(__name__)

RUNTIMES = ("runc", "gvisor")
# envkit's name -> the runtime's name in the engine (scripts/gvisor.sh registers `runsc`)
ENGINE_NAMES = {"runc": "runc", "gvisor": "runsc"}
SETUP_STEP = ("run `bash scripts/setup.sh` as root (its step scripts/gvisor.sh fetches runsc from Debian trixie and "
              "registers it with the Docker engine as the runtime `runsc`), or pass --runtime runc")


@dataclass(frozen=True)
class RuntimeChoice:
    runtime: str  # runc | gvisor
    why: str  # who decided, for messages and the run's record


def user_config_path() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "envkit" / "config.toml"


def parse_runtime(value: str, where: str) -> str:
    """``value`` as a runtime name, or a UserError saying where it came from."""
    name = str(value).strip().lower()
    if name not in RUNTIMES:
        raise UserError(f"unknown sandbox runtime {value!r} ({where})", f"use one of: {', '.join(RUNTIMES)}")
    return name


def _user_default(pulled: bool) -> str | None:
    path = user_config_path()
    if not path.is_file():
        return None
    try:
        section = tomllib.loads(path.read_text(encoding="utf-8")).get("runtime", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"{path} is not readable TOML: {e}", "fix or remove the file") from None
    if not isinstance(section, dict):
        raise UserError(f"{path}: `runtime` must be a table", 'write [runtime] with pulled = "gvisor" / local = "runc"')
    key = "pulled" if pulled else "local"
    value = section.get(key)
    return None if value is None else parse_runtime(value, f"{path}, runtime.{key}")


def engine_runtimes(client: Any) -> set[str]:
    """The OCI runtimes the engine lists (``docker info``)."""
    try:
        return set((client.info() or {}).get("Runtimes") or {})
    except Exception:  # noqa: BLE001 - an engine that cannot say: nothing is known to be there
        return set()


def check_engine(client: Any, runtime: str, why: str = "") -> None:
    """A UserError (exit 2) when the engine does not have ``runtime``."""
    engine_name = ENGINE_NAMES[runtime]
    if engine_name not in engine_runtimes(client):
        asked = f" ({why})" if why else ""
        raise UserError(f"the sandbox runtime {runtime}{asked} is not registered with the Docker engine "
                        f"(it lists no `{engine_name}`)", SETUP_STEP)


def choose_runtime(spec_runtime: str | None, *, pulled: bool, network: str, requested: str | None = None,
                   client: Any | None = None) -> RuntimeChoice:
    """The runtime an environment's sandboxes run under (see the module's docstring); with a
    ``client``, gVisor is checked against the engine."""
    choice: RuntimeChoice | None = None
    if requested:
        choice = RuntimeChoice(parse_runtime(requested, "--runtime"), "--runtime")
    elif os.environ.get("ENVKIT_RUNTIME"):
        choice = RuntimeChoice(parse_runtime(os.environ["ENVKIT_RUNTIME"], "ENVKIT_RUNTIME"), "ENVKIT_RUNTIME")
    elif (configured := _user_default(pulled)) is not None:
        choice = RuntimeChoice(configured, f"{user_config_path()} runtime.{'pulled' if pulled else 'local'}")
    elif spec_runtime and (not pulled or spec_runtime == "gvisor"):
        choice = RuntimeChoice(spec_runtime, "the spec's [limits] runtime")
    if choice is None:  # the default
        if not pulled:
            return RuntimeChoice("runc", "default for a local folder")
        choice = RuntimeChoice("gvisor", "default for a pulled environment")
        if network != "none":
            raise UserError("this pulled environment asks for a network (limits.network = "
                            f"{network!r}), which envkit's gVisor runtime does not give",
                            "pass --runtime runc to run it under runc with its network")
        if client is not None and ENGINE_NAMES["gvisor"] not in engine_runtimes(client):
            log.warning("gVisor is not registered with the Docker engine: this pulled environment runs under runc "
                        "(%s)", SETUP_STEP)
            return RuntimeChoice("runc", "default for a pulled environment; gVisor missing")
        return choice
    if choice.runtime == "gvisor":
        if network != "none":
            raise UserError(f"limits.network = {network!r} under gVisor ({choice.why}): envkit registers gVisor "
                            "with no network", "use --runtime runc for an environment that needs a network")
        if client is not None:
            check_engine(client, "gvisor", choice.why)
    return choice
