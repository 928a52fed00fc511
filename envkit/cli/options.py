"""Options several commands share."""

from __future__ import annotations

import os
from typing import Any

import typer

from envkit.sandbox.runtimes import parse_runtime

RUNTIME_HELP = ("Sandbox runtime: runc or gvisor. Default: gvisor for environments pulled from a registry (when the "
                "engine has it), runc for local folders; ENVKIT_RUNTIME and ~/.config/envkit/config.toml [runtime] "
                "set it too (docs/architecture.md, Sandboxes).")


def runtime_option() -> Any:
    return typer.Option(None, "--runtime", help=RUNTIME_HELP, show_default=False)


def use_runtime(value: str | None) -> None:
    """Make ``--runtime`` the choice of every environment this process (and the workers it
    starts) runs: it is passed on as ENVKIT_RUNTIME, which outranks every other setting."""
    if value:
        os.environ["ENVKIT_RUNTIME"] = parse_runtime(value, "--runtime")
