"""The `envkit` Typer app and its error handling: user mistakes exit 2 with a message and
a hint, never a traceback (set ENVKIT_DEBUG=1 to see one). SIGTERM and SIGHUP unwind like
Ctrl-C: whatever the command started (vLLM servers, sandboxes) is stopped on the way out."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import docker.errors
import typer
from rich.markup import escape

from envkit.cli import (
    bench_cmd,
    build_cmd,
    dist_cmd,
    episode_cmd,
    harbor_cmd,
    init_cmd,
    model_cmd,
    registry_cmd,
    rollout_cmd,
    serve_cmd,
    synth_cmd,
    train_cmd,
    view_cmd,
)
from envkit.cli.output import err_console
from envkit.errors import EnvkitError, UserError
from envkit.version import __version__

app = typer.Typer(
    name="envkit", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Reproducible RL environments for LLM agents: build, run, validate and benchmark them.",
)
init_cmd.register(app)
build_cmd.register(app)
episode_cmd.register(app)
dist_cmd.register(app)
rollout_cmd.register(app)
train_cmd.register(app)
serve_cmd.register(app)
view_cmd.register(app)
synth_cmd.register(app)
app.add_typer(bench_cmd.bench_app, name="bench")
app.add_typer(build_cmd.base_app, name="base")
app.add_typer(registry_cmd.registry_app, name="registry")
app.add_typer(model_cmd.model_app, name="model")
app.add_typer(dist_cmd.token_app, name="token")
app.add_typer(harbor_cmd.import_app, name="import")
app.add_typer(harbor_cmd.export_app, name="export")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"envkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version.")) -> None:
    """envkit command line."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread (where Python runs signal handlers). Like Ctrl-C's
    KeyboardInterrupt it unwinds through every ``finally`` and ``with`` block, which stop what
    the command started (`envkit train` killed by a scheduler left its vLLM server and 32
    sandboxes running), and ``except Exception`` does not swallow it; unlike it, Typer does not
    turn it into a silent exit 130, so the status says which signal (128 + its number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, _frame: object) -> None:
    # While it unwinds: a second SIGTERM ends the process at once (a hard stop asked for); a
    # hang-up is ignored (a closed terminal can deliver two: its shell's and the kernel's).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    raise Terminated(signum)


def main() -> None:
    debug = bool(os.environ.get("ENVKIT_DEBUG"))
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:  # not one a parent told us to ignore
            signal.signal(signum, _terminate)
    try:
        app()
    except UserError as e:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {escape(e.message)}", markup=True, soft_wrap=True)
        if e.hint:  # escaped: a hint such as pip install 'envkit[server]' is text, not markup
            err_console.print(f"[yellow]hint:[/] {escape(e.hint)}", markup=True, soft_wrap=True)
        sys.exit(2)
    except EnvkitError as e:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        sys.exit(1)
    except docker.errors.DockerException as e:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] the Docker engine failed: {escape(str(e))}", soft_wrap=True)
        sys.exit(1)
    except Terminated as e:
        with contextlib.suppress(OSError):  # a hung-up terminal answers EIO
            err_console.print(f"terminated ({e})")
        sys.exit(128 + e.signum)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
