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
* **learning signal**: whether the run could learn, step by step: the share of GRPO groups
  whose rewards differ (only those have an advantage), the share of episodes whose actions
  parsed, the sampled tokens' entropy, and whether the reward moved. fail: the last
  ``STALL_STEPS`` steps had no group with a signal (no gradient, so no way back), with the likely
  cause named; warn: the last steps had none, fewer than a quarter of the groups had one, the
  actions stopped parsing, or the reward did not move; ok otherwise.
* **evaluation precision**: 95% CI half-width of the final eval reward at its sample size.
  ok ≤ 0.05, warn ≤ 0.10, fail above.

Each check is a function of numbers (``grade_*``), so its thresholds are pinned by unit tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envkit.stats import percentile
from rl_runner.metrics import StepMetrics
from rl_runner.report import load_run

__all__ = ["Check", "environment_reliability", "grade", "grade_alignment", "grade_batch", "grade_eval",
           "grade_freshness", "grade_publication", "grade_reliability", "grade_signal", "run_checks", "signal_cause"]

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


def _steps(steps: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``; "none" for none."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "none"


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


STALL_STEPS = 5  # steps in a row without a gradient that fail a run


def signal_cause(rewards: Sequence[float | None], valid: Sequence[float | None],
                 entropy: Sequence[float | None]) -> str:
    """Why steps had no group with differing rewards, from those steps' figures (and the first
    step's parse share): the likeliest cause first, with what to change."""
    r = [x for x in rewards if x is not None]
    v = [x for x in valid if x is not None]
    e = [x for x in entropy if x is not None]
    if v and min(v[-3:]) < 0.5:
        return ("the model's actions stopped parsing (format collapse): the updates broke the tool-call format; "
                "lower trainer.lr or raise trainer.kl_coef")
    if r and max(r) == 0.0:
        return ("no episode was rewarded: the policy never reaches the reward (warm the model up further or "
                "give it an easier task; check the environment with `envkit validate`)")
    if r and min(r) == 1.0:
        return "every episode was rewarded: nothing is left to learn on these tasks"
    if e and e[-1] < 0.05:
        return f"the policy is near-deterministic (entropy {e[-1]:.3f} per token): raise sampling.temperature"
    return "each group's episodes scored alike: raise group_size for this success rate"


def collapse(rewards: Sequence[float | None]) -> str:
    """The reward rose and then fell back (to a third of its peak or less over the last two
    steps, from a peak of at least 0.3): updates too large for the policy, not an environment
    that gives nothing. Empty when it did not happen."""
    r = [(i, x) for i, x in enumerate(rewards) if x is not None]
    if len(r) < 4:
        return ""
    at, peak = max(r, key=lambda p: p[1])
    last = sum(x for _, x in r[-2:]) / 2
    if peak < 0.3 or last > peak / 3 or at >= r[-2][0]:
        return ""
    return (f"the reward rose to {peak:.2f} (step {at + 1}) and fell back to {last:.2f}: updates too large for "
            "this policy; lower trainer.lr, add trainer.lr_warmup, or raise trainer.kl_coef")


def grade_signal(with_signal: list[float | None], rewards: list[float | None], valid: list[float | None],
                 entropy: list[float | None]) -> tuple[str, str]:
    """(status, cause) from per-step figures: ``with_signal`` the share of a step's groups whose
    rewards differ, ``rewards`` its mean reward, ``valid`` its share of parsed actions,
    ``entropy`` its sampled tokens' mean -log p. See the module docstring for the thresholds."""
    steps = [i for i, x in enumerate(with_signal) if x is not None]
    if not steps:
        return "n/a", ""
    stall = 0
    for i in reversed(steps):
        if with_signal[i]:
            break
        stall += 1
    window = steps[-max(stall, 1):] if stall else steps
    cause = signal_cause([rewards[i] for i in window], [valid[i] for i in window], [entropy[i] for i in window])
    fell = collapse(rewards)
    ent = [x for x in entropy if x is not None]
    if len(ent) >= 2 and ent[-1] > 2 * ent[0] + 0.5:  # the policy spread out instead of sharpening
        fell = (f"the policy's entropy rose from {ent[0]:.2f} to {ent[-1]:.2f} per token: "
                "updates too large blew it up; lower trainer.lr or add trainer.lr_warmup")
    if fell and (stall or not [x for x in valid if x is not None and x < 0.5]):
        cause = fell
    if stall >= STALL_STEPS:
        return "fail", cause
    share = sum(float(with_signal[i] or 0.0) for i in steps) / len(steps)
    r = [x for x in rewards if x is not None]
    v = [x for x in valid if x is not None]
    moved = len(r) < 6 or abs(sum(r[-3:]) / 3 - sum(r[:3]) / 3) >= 0.02
    if fell:
        return "warn", fell
    if stall >= 2 or share < 0.25 or (v and v[-1] < 0.8) or not moved:
        return "warn", cause if (stall or share < 0.25) else (
            signal_cause(r[-3:], v[-3:], entropy[-3:]) if not moved else "the share of parsed actions fell below 0.8")
    return "ok", ""


def environment_reliability(metrics: list[StepMetrics]) -> dict[str, tuple[int, int]]:
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
    checks.append(Check("policy freshness",
                        f"staleness KL p90 up to {_fmt(worst)} (bound {bound:g}), max lag {max(lags, default=0)}; "
                        f"{rejected}/{total} samples ({share:.0%}) refused as stale",
                        f"KL p90 ≤ {bound:g} and ≤ 10% refused (fail beyond 2× / 30%)",
                        grade_freshness(worst, share, bound)))

    mm = [float(m.mismatch.kl) for m in metrics if m.mismatch.kl is not None]
    mx = [float(m.mismatch.max_abs) for m in metrics if m.mismatch.max_abs is not None]
    checks.append(Check("numerical alignment", f"KL {_fmt(min(mm) if mm else None)}–{_fmt(max(mm) if mm else None)}, "
                        f"max |Δ log-prob| {_fmt(max(mx) if mx else None)}", "KL ≤ 1e-3 (fail > 1e-2)",
                        grade_alignment(max(mm) if mm else None)))

    by_version = environment_reliability(metrics)
    rates = {k: failed / max(1, n) for k, (n, failed) in by_version.items()}
    text = "; ".join(f"{k}: {failed}/{n} ({rates[k]:.1%})"
                     for k, (n, failed) in sorted(by_version.items())) or "no episodes"
    checks.append(Check("environment reliability",
                        f"first attempts failed (infra or verifier, retried ones included) {text}",
                        "≤ 1% per env version (fail > 5%)", grade_reliability(max(rates.values()) if rates else None)))

    pub = [float(m.publish.total_s) for m in metrics if m.publish.total_s is not None]
    trips = [m.mismatch.round_trip_ok for m in metrics if m.mismatch.round_trip_ok is not None]
    served = all(str(m.publish.served_version) == str(m.version) for m in metrics)
    checks.append(Check("weight publication",
                        f"{_fmt(percentile(pub, 50) if pub else None)} s p50, {_fmt(max(pub) if pub else None)} s max; "
                        f"version round trip {sum(trips)}/{len(trips)} steps"
                        + ("" if served else "; served version differed"),
                        "round trip ok every step", grade_publication(trips, served)))

    sig = [m.signal for m in metrics]
    shares = [x.groups_with_signal / x.groups if x.groups and x.groups_with_signal is not None else
              (0.0 if x.groups == 0 else None) for x in sig]
    rewards = [m.reward.mean for m in metrics]
    status, cause = grade_signal(shares, rewards, [x.valid_actions for x in sig], [x.entropy for x in sig])
    known = [i for i, x in enumerate(shares) if x is not None]
    if known:
        total = sum(sig[i].groups or 0 for i in known)
        with_s = sum(sig[i].groups_with_signal or 0 for i in known)
        none = [metrics[i].step for i in known if not shares[i]]
        first, last = known[0], known[-1]
        text = (f"{with_s}/{total} groups with a signal ({with_s / max(1, total):.0%}); steps without one: "
                f"{_steps(none)}; reward {_fmt(rewards[first])} → {_fmt(rewards[last])}; actions parsed "
                f"{_fmt(sig[first].valid_actions, '.0%')} → {_fmt(sig[last].valid_actions, '.0%')}; entropy "
                f"{_fmt(sig[first].entropy)} → {_fmt(sig[last].entropy)} per token"
                + (f". Likely cause: {cause}" if cause else ""))
    else:
        text = "not recorded (a run written before envkit recorded it)"
    checks.append(Check("learning signal", text,
                        f"a signal in the last {STALL_STEPS} steps (fail), in ≥ 25% of groups, "
                        "actions parsed ≥ 80%, reward moving and not fallen to ⅓ of its peak", status))

    if ev and ev.get("half_width") is not None:
        hw = float(ev["half_width"])
        need = ev.get("episodes_for_half_width_0.05")
        checks.append(Check("evaluation precision", f"reward {ev['mean']:.3f}, 95% CI ±{hw:.3f} at n={ev['scored']}"
                            + (f"; ~{need} episodes for ±0.05" if need else ""), "half-width ≤ 0.05 (fail > 0.10)",
                            grade_eval(hw)))
    else:
        checks.append(Check("evaluation precision", "no evaluation in this run (eval.episodes: 0)",
                            "half-width ≤ 0.05", "n/a"))
    return checks
