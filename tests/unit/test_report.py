"""The eval interval and the report's plots: equal rewards (a converged policy) made the
bootstrap interval miss its own mean by an ulp, and matplotlib refused the negative error bar,
so `envkit train` failed after training (CI run of 9cc4097)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from rl_runner.evaluate import bootstrap_ci
from rl_runner.report import PLOTS, write_report


@pytest.mark.parametrize("values", [[0.7] * 16, [0.1] * 7, [1 / 3] * 40, [0.0, 1.0] * 5, [0.2, 0.9, 0.9, 0.4, 0.35]])
def test_the_interval_holds_the_mean(values: list[float]) -> None:
    lo, hi = bootstrap_ci(values, seed=3)
    mean = statistics.fmean(values)
    assert lo <= mean <= hi, (lo, mean, hi)


def test_equal_rewards_give_a_point_interval() -> None:
    assert bootstrap_ci([0.7] * 16) == (0.7, 0.7)


def test_report_draws_an_eval_whose_interval_misses_its_mean_by_an_ulp(tmp_path: Path) -> None:
    metrics = [{"step": s, "mode": "sync", "version": s, "reward": {"mean": 0.5 + s / 100}, "ttb_s": 1.0 + s,
                "batch": {"straggler_wait_share": 0.1}, "staleness": {"kl": {"p50": 0.0, "max": 1e-4}, "lag": {"0": 8}},
                "failures": {"infra": 0.0, "model": 0.25}} for s in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    # as written by the old bootstrap: lo one ulp above the mean
    ev = {"episodes": 16, "mean": 0.7, "ci95": [0.7000000000000001, 0.7], "half_width": 0.0, "version": 3,
          "before": {"episodes": 16, "mean": 0.7, "ci95": [0.6999999999999998, 0.6999999999999999], "half_width": 0.0}}
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    summary = write_report(tmp_path)
    for name in PLOTS:
        assert (tmp_path / "plots" / name).stat().st_size > 1000, name
    assert summary["eval"]["mean"] == 0.7 and summary["steps"] == 3
