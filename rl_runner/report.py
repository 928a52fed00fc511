"""`envkit report RUN_DIR`: PNG plots and a summary table from a run's ``metrics.jsonl``.

Plots (``RUN_DIR/plots``): reward.png (mean reward per step, the final evaluation with its 95%
interval), ttb.png (time to trainable batch, train and publication time per step; generated tokens/s and
trajectories/s over each step), batch.png
(straggler wait share, idle episode slots, inference idle share and sandbox utilisation while
the trainer waited for each batch),
staleness_kl.png (per-sample k3 KL p50/p90/max and the mean version lag), mismatch_kl.png
(KL and max |Δ log-prob| between vLLM and the trainer at equal versions), failures.png (infra /
model / verifier failure rates). The summary goes to ``RUN_DIR/summary.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envkit.errors import UserError
from envkit.stats import percentile
from rl_runner.metrics import StepMetrics, mean_or_none, read_metrics

__all__ = ["PLOTS", "summarize_run", "write_report"]

PLOTS = ("reward.png", "ttb.png", "batch.png", "staleness_kl.png", "mismatch_kl.png", "failures.png")
_FLOOR = 1e-12  # log-scale plots: a KL of exactly 0 is drawn at the floor


def _range(values: list[Any]) -> list[float] | None:
    v = [float(x) for x in values if x is not None]
    return [min(v), max(v)] if v else None


def load_run(run_dir: Path) -> tuple[list[StepMetrics], dict[str, Any] | None]:
    if not run_dir.is_dir():
        raise UserError(f"`{run_dir}` is not a folder",
                        "give the run folder that `envkit train` printed (e.g. runs/shellcmd)")
    metrics = read_metrics(run_dir)
    if not metrics:
        raise UserError(f"`{run_dir}` has no metrics.jsonl (or it is empty)",
                        "point at a folder written by `envkit train`")
    ev = json.loads((run_dir / "eval.json").read_text()) if (run_dir / "eval.json").is_file() else None
    before = run_dir / "eval-before.json"
    if ev is not None and before.is_file():
        ev["before"] = json.loads(before.read_text())
    return metrics, ev


def summarize_run(metrics: list[StepMetrics], ev: dict[str, Any] | None) -> dict[str, Any]:
    rewards = [m.reward.mean for m in metrics if m.reward.mean is not None]
    ttb = [float(m.ttb_s) for m in metrics if m.ttb_s is not None]
    pub = [float(m.publish.total_s) for m in metrics if m.publish.total_s is not None]
    kl_max = _range([m.staleness.kl.max for m in metrics])
    return {
        "steps": len(metrics), "mode": metrics[-1].mode, "final_version": metrics[-1].version,
        "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
        "reward_last5_mean": mean_or_none(rewards[-5:]),
        "ttb_s_p50": percentile(ttb, 50) if ttb else None, "ttb_s_p90": percentile(ttb, 90) if ttb else None,
        "generated_tokens_per_s_mean": _mean_of([m.throughput.generated_tokens_per_s for m in metrics]),
        "trajectories_per_s_mean": _mean_of([m.throughput.trajectories_per_s for m in metrics]),
        "publish_s_p50": percentile(pub, 50) if pub else None, "publish_s_max": max(pub) if pub else None,
        "staleness_kl_p50_range": _range([m.staleness.kl.p50 for m in metrics]),
        "staleness_kl_max_range": kl_max,
        "version_lag_max": max((int(k) for m in metrics for k in m.staleness.lag), default=None),
        "rejected_stale": sum(m.staleness.rejected or 0 for m in metrics),
        "mismatch_kl_range": _range([m.mismatch.kl for m in metrics]),
        "mismatch_max_abs_range": _range([m.mismatch.max_abs for m in metrics]),
        "trajectory_s_p99_max": max((float(m.batch.trajectory_s.p99) for m in metrics
                                     if m.batch.trajectory_s.p99 is not None),
                                    default=None),
        "straggler_wait_share_mean": _mean_of([m.batch.straggler_wait_share for m in metrics]),
        "inference_idle_share_mean": _mean_of([m.batch.inference_idle_share for m in metrics]),
        "sandbox_utilisation_mean": _mean_of([m.batch.sandbox_utilisation for m in metrics]),
        "infra_failure_rate": _mean_of([m.failures.infra for m in metrics]),
        "model_failure_rate": _mean_of([m.failures.model for m in metrics]),
        "eval": None if ev is None else {k: ev.get(k) for k in ("episodes", "mean", "ci95", "half_width", "version")},
        "eval_before": None if not ev or not ev.get("before") else
        {k: ev["before"].get(k) for k in ("episodes", "mean", "ci95", "half_width", "version")},
    }


def _mean_of(values: list[Any]) -> float | None:
    return mean_or_none([float(x) for x in values if x is not None])


def _save(fig: Any, ax: Any, path: Path, loc: str = "best") -> None:
    import matplotlib.pyplot as plt

    ax.legend(loc=loc)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _yerr(ev: dict[str, Any]) -> list[list[float]]:
    """Error bars from a mean and its interval, never negative (an eval.json written before the
    interval was made to hold its mean can have it an ulp outside)."""
    lo, hi = ev["ci95"]
    return [[max(0.0, ev["mean"] - lo)], [max(0.0, hi - ev["mean"])]]


def write_report(run_dir: Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics, ev = load_run(run_dir)
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    steps = [m.step for m in metrics]

    def floor(values: list[Any]) -> list[float]:
        return [max(_FLOOR, float(v)) if v is not None else float("nan") for v in values]

    def nan(values: list[Any]) -> list[float]:
        return [float(v) if v is not None else float("nan") for v in values]

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, nan([m.reward.mean for m in metrics]), marker="o", ms=3, label="batch mean reward")
    if ev and ev.get("mean") is not None:
        ax.errorbar([steps[-1]], [ev["mean"]], yerr=_yerr(ev), fmt="s", color="C3", capsize=4,
                    label=f"eval ({ev['episodes']} episodes, 95% CI)")
    if ev and ev.get("before") and ev["before"].get("mean") is not None:
        b = ev["before"]
        ax.errorbar([0], [b["mean"]], yerr=_yerr(b), fmt="s", color="C2",
                    capsize=4, label="eval before training")
    ax.set(xlabel="step", ylabel="reward", title="Reward", ylim=(-0.02, 1.02))
    _save(fig, ax, out / "reward.png", loc="lower right")

    fig, (ax, tp) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax.plot(steps, nan([m.ttb_s for m in metrics]), marker="o", ms=3, label="time to trainable batch")
    ax.plot(steps, nan([m.train.train_s for m in metrics]), marker="o", ms=3, label="train step")
    ax.plot(steps, nan([m.publish.total_s for m in metrics]), marker="o", ms=3, label="weight publication")
    ax.set(ylabel="seconds", title="Time per step, and throughput over each step", yscale="log")
    ax.legend(loc="best")
    tp.plot(steps, nan([m.throughput.generated_tokens_per_s for m in metrics]), marker="o", ms=3, color="C3",
            label="generated tokens/s")
    tp.set(xlabel="step", ylabel="tokens/s")
    tr = tp.twinx()
    tr.plot(steps, nan([m.throughput.trajectories_per_s for m in metrics]), marker="s", ms=3, color="C4",
            label="trajectories/s")
    tr.set(ylabel="trajectories/s")
    handles = tp.get_legend_handles_labels()[0] + tr.get_legend_handles_labels()[0]
    tp.legend(handles, [str(h.get_label()) for h in handles], loc="best")
    fig.tight_layout()
    fig.savefig(out / "ttb.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    batches = [m.batch for m in metrics]
    for label, shares in (("straggler wait share", [b.straggler_wait_share for b in batches]),
                          ("episode slots idle", [b.slot_idle_share for b in batches]),
                          ("inference idle share", [b.inference_idle_share for b in batches]),
                          ("sandbox utilisation", [b.sandbox_utilisation for b in batches])):
        ax.plot(steps, nan(shares), marker="o", ms=3, label=label)
    ax.set(xlabel="step", ylabel="share of the wait for the batch", title="Batch assembly (while the trainer waited)",
           ylim=(-0.02, 1.02))
    _save(fig, ax, out / "batch.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    kls = [m.staleness.kl for m in metrics]
    for q, values in (("p50", [d.p50 for d in kls]), ("p90", [d.p90 for d in kls]), ("max", [d.max for d in kls])):
        ax.plot(steps, floor(values), marker="o", ms=3, label=f"staleness KL {q}")
    ax.set(xlabel="step", ylabel="k3 KL(behaviour ‖ trainer)", title="Staleness", yscale="log")
    lag = [sum(int(k) * n for k, n in m.staleness.lag.items()) / max(1, sum(m.staleness.lag.values())) for m in metrics]
    ax2 = ax.twinx()
    ax2.plot(steps, lag, color="C4", ls="--", label="mean version lag")
    ax2.set_ylabel("versions")
    ax2.legend(loc="upper right")
    _save(fig, ax, out / "staleness_kl.png", loc="upper left")

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, floor([m.mismatch.kl for m in metrics]), marker="o", ms=3, label="KL (probe, equal versions)")
    ax.plot(steps, floor([m.mismatch.max_abs for m in metrics]), marker="o", ms=3, label="max |Δ log-prob|")
    ax.set(xlabel="step", ylabel="vLLM vs trainer", title="Numerical mismatch", yscale="log")
    _save(fig, ax, out / "mismatch_kl.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    failures = [m.failures for m in metrics]
    for label, rates in (("infra (excluded)", [f.infra for f in failures]), ("retried", [f.retried for f in failures]),
                         ("model", [f.model for f in failures]), ("verifier", [f.verifier for f in failures])):
        ax.plot(steps, nan(rates), marker="o", ms=3, label=label)
    ax.set(xlabel="step", ylabel="share of episodes", title="Failure rates", ylim=(-0.02, 1.02))
    _save(fig, ax, out / "failures.png")

    summary = summarize_run(metrics, ev)
    summary["plots"] = [str(out / p) for p in PLOTS]
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
