"""Per-step metrics of a training run: one JSON line per step in ``RUN_DIR/metrics.jsonl``
(the record `envkit report` and `envkit doctor` read) and the same numbers in TensorBoard
(``RUN_DIR/tb``), distributions as histograms."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from envkit.bench import percentile

__all__ = ["MetricsLog", "distribution", "mean_or_none", "read_metrics"]


def mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pct(values: list[float], p: float, digits: int = 3) -> float | None:
    """The ``p``-th percentile, rounded; None for no values."""
    return round(percentile(values, p), digits) if values else None


def distribution(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean": None, "p10": None, "p50": None, "p90": None, "max": None}
    return {"n": len(values), "mean": mean_or_none(values), "p10": percentile(values, 10), "p50": percentile(values, 50),
            "p90": percentile(values, 90), "max": max(values)}


def _scalars(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, int | float):
        if math.isfinite(float(value)):
            out[prefix] = float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _scalars(f"{prefix}/{k}" if prefix else str(k), v, out)


class MetricsLog:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def log(self, record: dict[str, Any], histograms: dict[str, list[float]] | None = None) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        if self.writer is None:
            return
        step = int(record.get("step", 0))
        flat: dict[str, float] = {}
        _scalars("", {k: v for k, v in record.items() if k != "step"}, flat)
        for k, v in flat.items():
            self.writer.add_scalar(k, v, step)
        for k, values in (histograms or {}).items():
            if values:
                import numpy as np

                self.writer.add_histogram(k, np.asarray(values, dtype=np.float64), step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
