"""`envkit bench learn RECIPE --seeds K`: one recipe on K seeds, to tell a recipe that learns
from one that learned once.

Each seed is an ordinary `envkit train` run (``seed=N``, its own ``run_dir`` under ``--out``),
with the tiny model warmed up again at that seed when ``warmup`` is given (``lookup:1000``: the
warm-up is part of what must not depend on luck). A seed's row: the evaluation before and after
with their 95% intervals, the batch reward per step, the first step whose batch reward reached
the threshold, the steps without a learning signal (the doctor's check), and success: the
evaluation after training above the threshold. A finished seed (its ``sweep.json``) is not run
again, so a long sweep can be resumed. ``learn.png`` draws every seed's curve in one figure.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envkit.errors import UserError

__all__ = ["parse_warmup", "seed_row", "sweep", "wilson", "write_figure"]


def parse_warmup(text: str | None) -> tuple[str, int] | None:
    """``"lookup:1000"`` -> ("lookup", 1000); None for none; a clear error otherwise."""
    if not text:
        return None
    from rl_runner.policy.tiny import WARMUPS

    task, _, steps = text.partition(":")
    if task not in WARMUPS or not steps.isdigit() or int(steps) < 1:
        raise UserError(f"--warmup {text!r} is not TASK:STEPS",
                        f"write e.g. lookup:1000 (TASK one of: {', '.join(WARMUPS)})")
    return task, int(steps)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate (sound at 0 of n and n of n, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def seed_row(seed: int, run_dir: Path, threshold: float, seconds: float,
             warmed: dict[str, Any] | None) -> dict[str, Any]:
    """The figures of one finished seed, read back from its run folder."""
    from rl_runner.doctor import run_checks
    from rl_runner.report import load_run

    metrics, ev = load_run(run_dir)
    before_path = run_dir / "eval-before.json"
    before = json.loads(before_path.read_text()) if before_path.is_file() else None
    rewards = [m.reward.mean for m in metrics]
    reached = next((m.step for m in metrics if m.reward.mean is not None and m.reward.mean >= threshold), None)
    signal = next(c for c in run_checks(run_dir) if c.name == "learning signal")
    return {
        "seed": seed, "run_dir": str(run_dir), "seconds": round(seconds, 1),
        "eval_before": {"mean": before["mean"], "ci95": before["ci95"]} if before else None,
        "eval": {"mean": ev["mean"], "ci95": ev["ci95"]} if ev else None,
        "rewards": rewards, "steps_to_threshold": reached,
        "learned": bool(ev and ev["mean"] > threshold),
        "signal": {"status": signal.status, "measured": signal.measured},
        "warmup": warmed,
    }


def sweep(recipe_path: Path, overrides: list[str], seeds: list[int], out: Path, *, threshold: float = 0.5,
          warmup: tuple[str, int] | None = None, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    from rl_runner.recipes.config import load_recipe
    from rl_runner.recipes.grpo import train

    out.mkdir(parents=True, exist_ok=True)
    for key in ("seed", "run_dir") + (("model",) if warmup else ()):
        if any(o.partition("=")[0].strip() == key for o in overrides):
            raise UserError(f"`{key}=` is set by the sweep for each seed", f"leave `{key}=` out of the overrides")
    load_recipe(recipe_path, overrides)  # a bad recipe or override fails before the first seed
    rows = []
    for seed in seeds:
        folder = out / f"seed-{seed}"
        done = folder / "sweep.json"
        if done.is_file():
            say(f"seed {seed}: done before, read from {done}")
            rows.append(json.loads(done.read_text()))
            continue
        t0 = time.monotonic()
        extra = [f"seed={seed}", f"run_dir={folder / 'run'}"]
        warmed = None
        if warmup is not None:
            from rl_runner.policy.tiny import TinySpec, write_tiny_model

            shutil.rmtree(folder / "model", ignore_errors=True)  # an interrupted warm-up starts again
            say(f"seed {seed}: warming up a tiny model ({warmup[0]}, {warmup[1]} steps)")
            info = write_tiny_model(folder / "model", TinySpec(seed=seed), warmup_steps=warmup[1], warmup=warmup[0])
            warmed = {k: info[f"warmup_{k}"] for k in ("loss", "best_step", "answer_copied")}
            extra.append(f"model={folder / 'model'}")
        say(f"seed {seed}: training")
        train(load_recipe(recipe_path, [*overrides, *extra]), say=say)
        row = seed_row(seed, folder / "run", threshold, time.monotonic() - t0, warmed)
        done.write_text(json.dumps(row, indent=2) + "\n")
        rows.append(row)
        say(f"seed {seed}: eval {_ev(row['eval_before'])} -> {_ev(row['eval'])}")
    learned = sum(r["learned"] for r in rows)
    result = {"recipe": str(recipe_path), "overrides": overrides, "threshold": threshold,
              "warmup": f"{warmup[0]}:{warmup[1]}" if warmup else None, "seeds": rows,
              "learned": learned, "runs": len(rows), "learned_ci95": list(wilson(learned, len(rows))),
              "figure": str(out / "learn.png")}
    write_figure(result, out / "learn.png")
    (out / "sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _ev(ev: dict[str, Any] | None) -> str:
    return "–" if ev is None else f"{ev['mean']:.3f} [{ev['ci95'][0]:.3f}, {ev['ci95'][1]:.3f}]"


def write_figure(result: dict[str, Any], path: Path) -> None:
    """Every seed's batch reward per step in one figure, its evaluations after training as points
    with their intervals at the right edge, and the threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    last = 1
    for i, row in enumerate(result["seeds"]):
        steps = list(range(1, len(row["rewards"]) + 1))
        last = max(last, len(steps))
        line, = ax.plot(steps, [r if r is not None else float("nan") for r in row["rewards"]],
                        label=f"seed {row['seed']}" + ("" if row["learned"] else " (did not learn)"), linewidth=1.2)
        if row["eval"]:
            lo, hi = row["eval"]["ci95"]
            mean = row["eval"]["mean"]
            ax.errorbar([len(steps) + 1 + 0.12 * i], [mean], yerr=[[max(0.0, mean - lo)], [max(0.0, hi - mean)]],
                        fmt="o", color=line.get_color(), capsize=3)
    ax.axhline(result["threshold"], color="grey", linestyle="--", linewidth=0.8,
               label=f"threshold {result['threshold']:g}")
    ax.set_xlim(0.5, last + 2.5)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("step (points at the right: evaluation after training, 95% CI)")
    ax.set_ylabel("batch mean reward")
    ax.set_title(f"{Path(result['recipe']).name}: {result['learned']} of {result['runs']} seeds learned")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
