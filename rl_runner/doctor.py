"""`envkit doctor RUN_DIR`: the readiness checks a team should pass before scaling, each
measured from a run (``envkit train`` writes everything they need) and graded ok / warn / fail
against stated thresholds.

* **batch readiness**: share of the run's wall time the trainer waited for batches (TTB
  p50/p90 shown). ok ≤ 50%, warn ≤ 80%, fail above.
* **policy freshness**: per-sample staleness KL (k3) p90 at its worst step, against the
  admission bound ``kl_max`` (0.05 in sync mode), and the share of samples refused as stale.
  ok: KL ≤ bound and ≤ 10% refused; warn: KL ≤ 2× bound and ≤ 30% refused; fail beyond.
* **numerical alignment**: vLLM vs trainer at equal versions, KL at its worst step (max abs
  log-prob difference shown). ok ≤ 1e-3, warn ≤ 1e-2, fail above.
* **environment reliability**: *first-attempt* infra and verifier failures per environment
  version, retried ones included (a retry that succeeded still cost a sandbox and a wait).
  ok ≤ 1% for every version, warn ≤ 5%, fail above.
* **weight publication**: publication time p50/max; every probe token reports the version just
  published. ok every step; warn when a step served another version; fail when a round trip failed.
* **evaluation precision**: 95% CI half-width of the final eval reward at its sample size.
  ok ≤ 0.05, warn ≤ 0.10, fail above.

Each check is a function of numbers (``grade_*``), so its thresholds are pinned by unit tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envkit.bench import percentile
from rl_runner.metrics import StepRecord
from rl_runner.report import load_run

__all__ = ["Check", "environment_reliability", "grade", "grade_alignment", "grade_batch", "grade_eval", "grade_freshness",
           "grade_publication", "grade_reliability", "run_checks"]

SYNC_KL_BOUND = 0.05


@dataclass
class Check:
    name: str
    measured: str
    threshold: str
    status: str  # ok | warn | fail | n/a

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "–" if x is None else format(x, spec)


def grade(value: float | None, ok: float, warn: float) -> str:
    """ok when ``value`` ≤ ok, warn when ≤ warn, else fail; n/a when nothing was measured."""
    if value is None:
        return "n/a"
    return "ok" if value <= ok else ("warn" if value <= warn else "fail")


def grade_batch(wait_share: float | None) -> str:
    return grade(wait_share, 0.5, 0.8)


def grade_freshness(kl_p90: float | None, refused_share: float, bound: float) -> str:
    if kl_p90 is None:
        return "n/a"
    kl, refused = grade(kl_p90, bound, 2 * bound), grade(refused_share, 0.10, 0.30)
    return max(kl, refused, key=("ok", "warn", "fail").index)


def grade_alignment(kl: float | None) -> str:
    return grade(kl, 1e-3, 1e-2)


def grade_reliability(worst_rate: float | None) -> str:
    return grade(worst_rate, 0.01, 0.05)


def grade_publication(round_trips: list[bool], served_ok: bool) -> str:
    if not round_trips:
        return "n/a"
    if not all(round_trips):
        return "fail"
    return "ok" if served_ok else "warn"


def grade_eval(half_width: float | None) -> str:
    return grade(half_width, 0.05, 0.10)


def environment_reliability(metrics: list[StepRecord]) -> dict[str, tuple[int, int]]:
    """env version -> (episodes, episodes whose first attempt failed as infra or verifier).
    Runs written before first attempts were counted give their excluded infra failures."""
    out: dict[str, list[int]] = {}
    for m in metrics:
        for key, row in m.failures.by_env_version.items():
            acc = out.setdefault(key, [0, 0])
            acc[0] += row.episodes
            acc[1] += row.first_attempt_failures if row.first_attempt_failures is not None else row.infra_failures
    return {k: (v[0], v[1]) for k, v in out.items()}


def run_checks(run_dir: Path) -> list[Check]:
    metrics, ev = load_run(run_dir)
    checks = []

    ttb = [float(m.ttb_s) for m in metrics if m.ttb_s is not None]
    busy = sum(float(m.train.train_s or 0) + float(m.publish.total_s or 0) for m in metrics)
    wait = sum(ttb) / max(1e-9, sum(ttb) + busy)
    checks.append(Check("batch readiness", f"TTB p50 {_fmt(percentile(ttb, 50))} s, p90 {_fmt(percentile(ttb, 90))} s; "
                        f"trainer waited {wait:.0%} of the time", "wait share ≤ 50% (fail > 80%)", grade_batch(wait)))

    stale = [m.staleness for m in metrics]
    kl_p90 = [float(s.kl.p90) for s in stale if s.kl.p90 is not None]
    bound = next((float(s.kl_max) for s in stale if s.kl_max is not None), SYNC_KL_BOUND)
    lags = [int(k) for s in stale for k in s.lag]
    rejected = sum(s.rejected or 0 for s in stale)
    worst = max(kl_p90) if kl_p90 else None
    total = sum((s.admitted or 0) + (s.rejected or 0) for s in stale)
    share = rejected / max(1, total)
    checks.append(Check("policy freshness", f"staleness KL p90 up to {_fmt(worst)} (bound {bound:g}), max lag {max(lags, default=0)}; "
                        f"{rejected}/{total} samples ({share:.0%}) refused as stale",
                        f"KL p90 ≤ {bound:g} and ≤ 10% refused (fail beyond 2× / 30%)", grade_freshness(worst, share, bound)))

    mm = [float(m.mismatch.kl) for m in metrics if m.mismatch.kl is not None]
    mx = [float(m.mismatch.max_abs) for m in metrics if m.mismatch.max_abs is not None]
    checks.append(Check("numerical alignment", f"KL {_fmt(min(mm) if mm else None)}–{_fmt(max(mm) if mm else None)}, "
                        f"max |Δ log-prob| {_fmt(max(mx) if mx else None)}", "KL ≤ 1e-3 (fail > 1e-2)",
                        grade_alignment(max(mm) if mm else None)))

    by_version = environment_reliability(metrics)
    rates = {k: failed / max(1, n) for k, (n, failed) in by_version.items()}
    text = "; ".join(f"{k}: {failed}/{n} ({rates[k]:.1%})" for k, (n, failed) in sorted(by_version.items())) or "no episodes"
    checks.append(Check("environment reliability", f"first attempts failed (infra or verifier, retried ones included) {text}",
                        "≤ 1% per env version (fail > 5%)", grade_reliability(max(rates.values()) if rates else None)))

    pub = [float(m.publish.total_s) for m in metrics if m.publish.total_s is not None]
    trips = [m.mismatch.round_trip_ok for m in metrics if m.mismatch.round_trip_ok is not None]
    served = all(str(m.publish.served_version) == str(m.version) for m in metrics)
    checks.append(Check("weight publication", f"{_fmt(percentile(pub, 50) if pub else None)} s p50, {_fmt(max(pub) if pub else None)} s max; "
                        f"version round trip {sum(trips)}/{len(trips)} steps" + ("" if served else "; served version differed"),
                        "round trip ok every step", grade_publication(trips, served)))

    if ev and ev.get("half_width") is not None:
        hw = float(ev["half_width"])
        need = ev.get("episodes_for_half_width_0.05")
        checks.append(Check("evaluation precision", f"reward {ev['mean']:.3f}, 95% CI ±{hw:.3f} at n={ev['scored']}"
                            + (f"; ~{need} episodes for ±0.05" if need else ""), "half-width ≤ 0.05 (fail > 0.10)", grade_eval(hw)))
    else:
        checks.append(Check("evaluation precision", "no evaluation in this run (eval.episodes: 0)", "half-width ≤ 0.05", "n/a"))
    return checks
