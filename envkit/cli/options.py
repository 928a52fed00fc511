"""Options several commands share."""

from __future__ import annotations

from typing import Any

import typer

from envkit.sandbox.runtimes import parse_runtime

RUNTIME_HELP = ("Sandbox runtime: runc or gvisor. Default: gvisor for environments pulled from a registry (when the "
                "engine has it), runc for local folders; ENVKIT_RUNTIME and ~/.config/envkit/config.toml [runtime] "
                "set it too (docs/architecture.md, Sandboxes).")


def runtime_option() -> Any:
    return typer.Option(None, "--runtime", help=RUNTIME_HELP, show_default=False)


def requested_runtime(value: str | None) -> str | None:
    """``--runtime`` checked (runc or gvisor; a bad value: exit 2), or None. A command passes it
    to every EnvRuntime it makes (and a run's Ray workers get their driver's), where it outranks
    every other setting (envkit.sandbox.runtimes.choose_runtime)."""
    return parse_runtime(value, "--runtime") if value else None
