"""`envkit model tiny DIR`."""

from __future__ import annotations

from pathlib import Path

import typer

from envkit.cli.output import console, print_json
from envkit.errors import UserError
from envkit.extras import require

model_app = typer.Typer(no_args_is_help=True, help="Local models for tests and demos (no download).")


@model_app.command("tiny")
def tiny(
    folder: Path = typer.Argument(..., help="Folder to write the model into (new or empty)."),
    seed: int = typer.Option(0, "--seed", help="Weight initialisation seed."),
    warmup_steps: int = typer.Option(0, "--warmup-steps", min=0, max=100_000,
                                     help="Supervised warm-up steps: answer with one shell command (for environments/shellcmd)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write a tiny random-init Qwen2-shaped model with a locally trained tokenizer."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"`{folder}` already exists and is not empty; nothing was written", "choose a new folder")
    require("cpu", "`envkit model tiny`", "torch", "transformers", "tokenizers", "safetensors")
    from rl_runner.policy.tiny import TinySpec, write_tiny_model

    info = write_tiny_model(folder, TinySpec(seed=seed), warmup_steps=warmup_steps)
    if as_json:
        print_json({"folder": str(folder), **info})
        return
    console.print(f"wrote a tiny Qwen2 model to {folder}: {info['parameters']} parameters, vocab {info['vocab_size']}, "
                  f"head dim {info['head_dim']}" + (f", warm-up loss {info['warmup_loss']:.3f}" if warmup_steps else ""))
