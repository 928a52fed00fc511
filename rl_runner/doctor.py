"""`envkit doctor RUN_DIR`: the readiness checks a team should pass before scaling, each
measured from a run (``envkit train`` writes everything they need) and judged against a
stated threshold.

| check | measured as | ok when |
|---|---|---|
| batch readiness | time to trainable batch p50/p90; share of the run's wall time the trainer waited for batches | wait share ≤ 50% |
| policy freshness | per-sample staleness KL (k3) p90, max version lag, share of samples refused by KL admission | ≤ 10% refused |
| numerical alignment | vLLM vs trainer at equal versions: KL and max abs log-prob difference | KL ≤ 1e-3 |
| environment reliability | infra failures (excluded after retries) per env version | ≤ 1% for every version |
| weight publication | publication time p50/max; every probe token reports the version just published | round trip ok every step |
| evaluation precision | 95% CI half-width of the final eval reward at its sample size | half-width ≤ 0.05 |
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envkit.bench import percentile
from rl_runner.report import _get, load_run

__all__ = ["Check", "run_checks"]


@dataclass
class Check:
    name: str
    measured: str
    threshold: str
    status: str  # ok | warn | n/a

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "–" if x is None else format(x, spec)


def run_checks(run_dir: Path) -> list[Check]:
    metrics, ev = load_run(run_dir)
    checks = []

    ttb = [float(m["ttb_s"]) for m in metrics]
    busy = sum(float(_get(m, "train.train_s") or 0) + float(_get(m, "publish.total_s") or 0) for m in metrics)
    wait = sum(ttb) / max(1e-9, sum(ttb) + busy)
    checks.append(Check("batch readiness", f"TTB p50 {_fmt(percentile(ttb, 50))} s, p90 {_fmt(percentile(ttb, 90))} s; "
                        f"trainer waited {wait:.0%} of the time", "wait share ≤ 50%", "ok" if wait <= 0.5 else "warn"))

    kl_p90 = [float(x) for m in metrics if (x := _get(m, "staleness.kl.p90")) is not None]
    kl_max_cfg = next((float(x) for m in metrics if (x := _get(m, "staleness.kl_max")) is not None), 0.05)
    lags = [int(k) for m in metrics for k in (_get(m, "staleness.lag") or {})]
    rejected = sum(int(_get(m, "staleness.rejected") or 0) for m in metrics)
    worst = max(kl_p90) if kl_p90 else None
    total = sum(int(_get(m, "staleness.admitted") or 0) + int(_get(m, "staleness.rejected") or 0) for m in metrics)
    share = rejected / max(1, total)
    checks.append(Check("policy freshness", f"staleness KL p90 up to {_fmt(worst)}, max lag {max(lags, default=0)}; "
                        f"{rejected}/{total} samples ({share:.0%}) refused above KL {kl_max_cfg:g}",
                        "≤ 10% refused as stale", "n/a" if worst is None else ("ok" if share <= 0.10 else "warn")))

    mm = [float(x) for m in metrics if (x := _get(m, "mismatch.kl")) is not None]
    mx = [float(x) for m in metrics if (x := _get(m, "mismatch.max_abs")) is not None]
    checks.append(Check("numerical alignment", f"KL {_fmt(min(mm) if mm else None)}–{_fmt(max(mm) if mm else None)}, "
                        f"max |Δ log-prob| {_fmt(max(mx) if mx else None)}", "KL ≤ 1e-3",
                        "n/a" if not mm else ("ok" if max(mm) <= 1e-3 else "warn")))

    by_version: dict[str, list[int]] = {}
    for m in metrics:
        for key, row in (_get(m, "failures.by_env_version") or {}).items():
            acc = by_version.setdefault(key, [0, 0])
            acc[0] += int(row["episodes"])
            acc[1] += int(row["infra_failures"])
    rates = {k: v[1] / max(1, v[0]) for k, v in by_version.items()}
    text = "; ".join(f"{k}: {v[1]}/{v[0]} ({rates[k]:.1%})" for k, v in sorted(by_version.items())) or "no episodes"
    checks.append(Check("environment reliability", f"infra failures {text}", "≤ 1% per env version",
                        "n/a" if not rates else ("ok" if max(rates.values()) <= 0.01 else "warn")))

    pub = [float(x) for m in metrics if (x := _get(m, "publish.total_s")) is not None]
    trips = [bool(x) for m in metrics if (x := _get(m, "mismatch.round_trip_ok")) is not None]
    served = all(str(_get(m, "publish.served_version")) == str(m.get("version")) for m in metrics)
    checks.append(Check("weight publication", f"{_fmt(percentile(pub, 50) if pub else None)} s p50, {_fmt(max(pub) if pub else None)} s max; "
                        f"version round trip {sum(trips)}/{len(trips)} steps" + ("" if served else "; served version differed"),
                        "round trip ok every step", "n/a" if not trips else ("ok" if all(trips) and served else "warn")))

    if ev and ev.get("half_width") is not None:
        hw = float(ev["half_width"])
        need = ev.get("episodes_for_half_width_0.05")
        checks.append(Check("evaluation precision", f"reward {ev['mean']:.3f}, 95% CI ±{hw:.3f} at n={ev['scored']}"
                            + (f"; ~{need} episodes for ±0.05" if need else ""), "half-width ≤ 0.05", "ok" if hw <= 0.05 else "warn"))
    else:
        checks.append(Check("evaluation precision", "no evaluation in this run (eval.episodes: 0)", "half-width ≤ 0.05", "n/a"))
    return checks
