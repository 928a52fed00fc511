"""`envkit bench learn`'s arithmetic and its reading of a finished run, without training: the
success rate's interval, the warm-up option, a seed's row from a run folder, the figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envkit.errors import UserError
from rl_runner.metrics import StepMetrics
from rl_runner.recipes.sweep import parse_warmup, seed_row, sweep, wilson, write_figure


def test_wilson_holds_at_the_edges():
    assert wilson(5, 5)[1] == 1.0 and wilson(5, 5)[0] == pytest.approx(0.566, abs=1e-3)  # 5 of 5 is not a certainty
    assert wilson(0, 10)[0] == 0.0 and wilson(0, 10)[1] == pytest.approx(0.278, abs=1e-3)
    lo, hi = wilson(9, 10)
    assert lo < 0.9 < hi


def test_the_warmup_option():
    assert parse_warmup(None) is None and parse_warmup("lookup:1000") == ("lookup", 1000)
    for bad in ("lookup", "nope:10", "lookup:x", "lookup:0"):
        with pytest.raises(UserError, match="TASK:STEPS"):
            parse_warmup(bad)


def _run(folder: Path, rewards: list[float], before: float, after: float) -> Path:
    folder.mkdir(parents=True)
    lines = []
    for i, r in enumerate(rewards):
        m = StepMetrics(step=i + 1, version=i + 1)
        m.reward.mean = r
        m.signal.groups, m.signal.groups_with_signal, m.signal.valid_actions, m.signal.entropy = 8, 4, 1.0, 0.5
        lines.append(json.dumps(m.to_dict()))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for name, mean in (("eval-before.json", before), ("eval.json", after)):
        (folder / name).write_text(json.dumps({"mean": mean, "ci95": [max(0.0, mean - 0.05), min(1.0, mean + 0.05)],
                                               "half_width": 0.05, "scored": 128, "episodes": 128}))
    return folder


def test_a_seeds_row_and_the_figure(tmp_path: Path):
    row = seed_row(3, _run(tmp_path / "a", [0.05, 0.2, 0.55, 0.7], 0.05, 0.72), 0.5, 61.0, {"answer_copied": 1.0})
    assert row["learned"] and row["steps_to_threshold"] == 3 and row["eval"]["mean"] == 0.72
    assert row["eval_before"] == {"mean": 0.05, "ci95": [0.0, 0.1]} and row["signal"]["status"] == "ok"
    flat = seed_row(4, _run(tmp_path / "b", [0.0, 0.0, 0.0, 0.0], 0.0, 0.0), 0.5, 60.0, None)
    assert not flat["learned"] and flat["steps_to_threshold"] is None
    result = {"recipe": "lookup.yaml", "threshold": 0.5, "seeds": [row, flat], "learned": 1, "runs": 2}
    write_figure(result, tmp_path / "learn.png")
    assert ((tmp_path / "learn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            and (tmp_path / "learn.png").stat().st_size > 10_000)


def test_a_sweep_refuses_to_be_told_the_seed(tmp_path: Path):
    with pytest.raises(UserError, match="set by the sweep"):
        sweep(Path("rl_runner/recipes/lookup.yaml"), ["seed=3"], [0], tmp_path)


def test_a_sweep_reads_finished_seeds_back(tmp_path: Path):
    """A rerun trains nothing for a seed whose row is there (so a long sweep resumes)."""
    row = seed_row(0, _run(tmp_path / "seed-0" / "run", [0.1, 0.6], 0.05, 0.8), 0.5, 10.0, None)
    (tmp_path / "seed-0" / "sweep.json").write_text(json.dumps(row))
    root = Path(__file__).resolve().parents[2]
    result = sweep(root / "rl_runner" / "recipes" / "lookup.yaml", [], [0], tmp_path)
    assert result["learned"] == 1 and result["runs"] == 1 and (tmp_path / "learn.png").is_file()
    assert json.loads((tmp_path / "sweep.json").read_text())["seeds"][0]["eval"]["mean"] == 0.8
