"""`envkit view RUN_DIR | FILE.jsonl`: browse a run's trajectories in a local page (loopback)."""

from __future__ import annotations

import socket
from pathlib import Path

import typer

from envkit.cli.output import console, err_console
from envkit.errors import UserError
from envkit.extras import require


def view(
    target: Path = typer.Argument(..., help="A run folder (envkit train's or rollout's) "
                                  "or one trajectories .jsonl file."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port on 127.0.0.1 (0: any free one)."),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="Model folder whose tokenizer renders the tokens "
                                   "(default: the run's model, else its newest published weights)."),
) -> None:
    """Browse trajectories: a filterable list, and each one's turns with its tokens shaded by
    log-prob, observations set apart, weight versions, tool calls, verifier details and attempts.
    Serves on loopback only; Ctrl-C stops it."""
    require("server", "`envkit view`", "fastapi", "uvicorn", "jinja2")
    import uvicorn

    from rl_runner.viewer import TrajectoryIndex, find_tokenizer, make_app

    if tokenizer is not None and not (tokenizer / "tokenizer_config.json").is_file():
        raise UserError(f"--tokenizer {tokenizer}: no tokenizer there (no tokenizer_config.json)",
                        "give a model folder (e.g. RUN/weights/v000016), or leave --tokenizer out")
    index = TrajectoryIndex.scan(target)
    tok = find_tokenizer(target, tokenizer)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        raise UserError(f"cannot listen on 127.0.0.1:{port}: {e.strerror}",
                        "choose another --port, or 0 for any free one") from None
    bound = sock.getsockname()[1]
    err_console.print(f"{len(index.entries)} trajectories in {len(index.files)} file(s)"
                      + (f", {index.unreadable} unreadable line(s)" if index.unreadable else "")
                      + f"; tokens rendered with {tok or 'no tokenizer (ids shown)'}")
    console.print(f"http://127.0.0.1:{bound}/", soft_wrap=True)
    server = uvicorn.Server(uvicorn.Config(make_app(index, tok, str(target)), log_level="warning"))
    server.run(sockets=[sock])


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("view")(view)
