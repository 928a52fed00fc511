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
                                     help="Supervised warm-up steps (the format of the --warmup environment)."),
    warmup: str = typer.Option("shellcmd", "--warmup", help="What the warm-up teaches: shellcmd (answer with some "
                               "shell command) or lookup (call ./codeword, then answer with some code word)."),
    template: str = typer.Option("chatml", "--template", help="Chat template: chatml (tool calls in envkit's <tool> "
                                 "format) or hermes (tools in the template, tool-call tags as special tokens, "
                                 "as Qwen2.5)."),
    tie_embeddings: bool = typer.Option(False, "--tie-embeddings", help="One matrix for the input embedding and the "
                                        "output projection (tie_word_embeddings)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write a tiny random-init Qwen2-shaped model with a locally trained tokenizer."""
    from rl_runner.policy.tiny import TEMPLATES, WARMUPS

    problems = []
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        problems.append((f"`{folder}` already exists and is not empty; nothing was written", "choose a new folder"))
    if warmup not in WARMUPS:
        problems.append((f"--warmup {warmup!r} is not known", f"use one of: {', '.join(WARMUPS)}"))
    if template not in TEMPLATES:
        problems.append((f"--template {template!r} is not known", f"use one of: {', '.join(TEMPLATES)}"))
    if problems:
        raise UserError("; ".join(p for p, _ in problems), "; ".join(h for _, h in problems))
    require("cpu", "`envkit model tiny`", "torch", "transformers", "tokenizers", "safetensors")
    from rl_runner.policy.tiny import TinySpec, write_tiny_model

    info = write_tiny_model(folder, TinySpec(seed=seed, template=template, tie_word_embeddings=tie_embeddings),
                            warmup_steps=warmup_steps, warmup=warmup)
    if as_json:
        print_json({"folder": str(folder), **info})
        return
    console.print(f"wrote a tiny Qwen2 model to {folder}: {info['parameters']} parameters, vocab {info['vocab_size']}, "
                  f"head dim {info['head_dim']}, {template} template" + (", tied embeddings" if tie_embeddings else "")
                  + (f", {warmup} warm-up: held-out loss {info['warmup_loss']:.3f} (kept the weights of step "
                     f"{info['warmup_best_step']} of {warmup_steps})" if warmup_steps else "")
                  + (f", copies {info['warmup_answer_copied']:.0%} of the 20 code words after `./lookup code`"
                     if info.get("warmup_answer_copied") is not None else ""))
