"""`envkit serve ENV`: the environment over OpenEnv's HTTP/WebSocket protocol."""

from __future__ import annotations

import typer

from envkit.catalog import resolve_environment
from envkit.cli.options import requested_runtime, runtime_option
from envkit.cli.output import console
from envkit.extras import require


def serve(
    env: str = typer.Argument(..., help="Environment folder or ns/name@version."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    max_sessions: int = typer.Option(8, "--max-sessions", min=1, max=1024,
                                     help="Concurrent sessions (each holds one sandbox); more are refused."),
    idle_timeout: float = typer.Option(300.0, "--idle-timeout", min=1.0,
                                       help="Seconds a session may sit idle before it is closed and its sandbox "
                                       "released."),
    task: str = typer.Option(None, "--task", "-t", help="Serve one task only (else reset picks: task=…, "
                             "or seed mod n)."),
    max_turns: int = typer.Option(None, "--max-turns", min=1, help="Steps per episode "
                                  "(default: the spec's max_turns)."),
    sandbox_runtime: str = runtime_option(),
) -> None:
    """Serve an environment to OpenEnv clients (TRL, SkyRL, torchforge, GenericEnvClient)."""
    asked = requested_runtime(sandbox_runtime)
    require("openenv", "`envkit serve`")
    import uvicorn  # openenv-core's own dependency

    from envkit.runtime import EnvRuntime
    from envkit.serve import create_app

    loaded = resolve_environment(env)
    if task is not None:
        loaded.task(task)  # an unknown task is an error now, not at the first reset
    runtime = EnvRuntime(loaded, sandbox_runtime=asked)
    app = create_app(runtime, max_sessions=max_sessions, idle_timeout_s=idle_timeout, task=task, max_turns=max_turns)
    console.print(f"serving {loaded.ref} on http://{host}:{port} (OpenEnv protocol: /ws, /health, /schema, /reset, "
                  f"/step); up to {max_sessions} sessions, idle ones closed after {idle_timeout:g} s")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        runtime.backend.cleanup()


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("serve")(serve)
