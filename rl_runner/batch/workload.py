"""A Terminal-Bench-shaped rollout workload for measuring batch assembly with fixed weights.

Each trajectory follows a *script* drawn from a seeded generator: a number of turns, and per
turn a generation length and a tool execution of a given duration and output size, then a
verification phase. The script is played for real: every turn sends the growing context to a
real vLLM server (token ids in, ``ignore_eos`` so exactly the drawn number of tokens comes
out, with their log-probs and weight versions), runs a real command in a real sandbox of the
repo environment (``sleep`` for the drawn duration, then the drawn amount of output through
the environment's ordinary tool path: limits, timeouts, records), appends the observation to
the context, and ends with a verification command of drawn duration. What the model writes
does not steer the script: with fixed weights the point is *when* work happens, not what it
says. The same seed gives the same scripts, so naive and optimized assembly run identical
work.

Shapes (``WorkloadParams``; all log-normal, so heavy-tailed, clipped):

* turns per trajectory: median ``turns_median``, σ ``turns_sigma``, 1 … ``turns_max``;
* generated tokens per turn: median ``gen_median``, σ ``gen_sigma``, 4 … ``gen_max``;
* tool duration: a fast command (``ls``, ``cat``, ``grep``: median ``fast_median_s``) or, with
  probability ``slow_p``, a slow one (builds, test runs, installs: median ``slow_median_s``,
  σ ``slow_sigma``), clipped at ``tool_max_s``;
* tool output: median ``out_median`` bytes, clipped at the agent loop's observation cap;
* verification: median ``verify_median_s``.

The environment's own verifier (pytest) is not run: on 2 cores 32 concurrent pytest runs
saturated the CPU (measured verify p50 7 s), which would measure this machine's CPU rather than
batch assembly; its cost is modelled by the verification phase instead.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from envkit.errors import EpisodeFailure
from envkit.spec import Task
from rl_runner.distributed.context import EpisodeContext
from rl_runner.policy.client import SamplingParams
from rl_runner.rollout.loop import OBSERVATION_CAP, mark_aborted
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["Script", "Turn", "WorkloadParams", "draw_script", "scripted_episode"]


@dataclass(frozen=True)
class WorkloadParams:
    turns_median: float = 2.5
    turns_sigma: float = 0.8
    turns_max: int = 16
    gen_median: float = 32.0
    gen_sigma: float = 0.8
    gen_max: int = 256
    fast_median_s: float = 1.5
    fast_sigma: float = 0.8
    slow_p: float = 0.05
    slow_median_s: float = 15.0
    slow_sigma: float = 1.2
    tool_max_s: float = 300.0
    out_median: float = 120.0
    out_sigma: float = 1.0
    verify_median_s: float = 2.0
    verify_sigma: float = 0.5
    time_scale: float = 1.0  # multiplies every tool and verification duration (quick runs, tests)
    prompt_tokens: int = 128  # shared system prompt + instruction, per task
    max_context: int = 4000  # the context is capped below the server's max-model-len (4096)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Turn:
    gen_tokens: int
    tool_s: float
    out_bytes: int


@dataclass(frozen=True)
class Script:
    turns: list[Turn] = field(default_factory=list)
    verify_s: float = 0.0

    @property
    def tool_s(self) -> float:
        return sum(t.tool_s for t in self.turns) + self.verify_s


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def draw_script(params: WorkloadParams, rng: random.Random) -> Script:
    p = params
    n = min(p.turns_max, max(1, round(_lognormal(rng, p.turns_median, p.turns_sigma))))
    turns = []
    for _ in range(n):
        gen = min(p.gen_max, max(4, round(_lognormal(rng, p.gen_median, p.gen_sigma))))
        if rng.random() < p.slow_p:
            tool = _lognormal(rng, p.slow_median_s, p.slow_sigma)
        else:
            tool = _lognormal(rng, p.fast_median_s, p.fast_sigma)
        out = min(OBSERVATION_CAP, max(1, round(_lognormal(rng, p.out_median, p.out_sigma))))
        turns.append(Turn(gen, round(min(p.tool_max_s, tool) * p.time_scale, 3), out))
    verify = min(p.tool_max_s, _lognormal(rng, p.verify_median_s, p.verify_sigma))
    return Script(turns, round(verify * p.time_scale, 3))


def _prompt(task: Task, n: int) -> list[int]:
    """The task's prompt: the same ids for every episode of the task (a shared prefix)."""
    rng = random.Random(f"prompt:{task.id}")
    return [rng.randrange(10, 480) for _ in range(n)]


def _command(tool_s: float, out_bytes: int) -> str:
    return f"sleep {tool_s:.3f}; head -c {out_bytes} /dev/urandom | base64 -w 76 | head -c {out_bytes}"


def scripted_episode(ctx: EpisodeContext, *, g: int, i: int, seed: int, params: WorkloadParams) -> Trajectory:
    """Episode ``i`` of group ``g`` of the workload (an episode function of the rollout seam,
    :mod:`rl_runner.distributed.rollouts`, so either backend runs it): the group's task, the
    episode's drawn script played for real against ``ctx.policy`` and ``ctx.sandboxes``."""
    runtime, policy, sandboxes, cancel, session = ctx.runtime, ctx.policy, ctx.sandboxes, ctx.cancel, ctx.session
    tasks = runtime.env.tasks
    task = tasks[g % len(tasks)]
    script = draw_script(params, random.Random(f"{seed}:{g}:{i}"))
    seed, group_id = seed + g, f"{task.id}/{seed + g}"
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    traj = Trajectory(env_ref=runtime.env.ref, image_digest=runtime.build.image_id,
                      bundle_digest=runtime.build.bundle_digest, runtime=runtime.limits.runtime, task_id=task.id,
                      seed=seed, group_id=group_id)
    try:
        # the script's turns are its budget: every one is played, then its verification
        episode = runtime.start(task, seed, sandboxes, agent="bench", cancel=cancel, max_turns=len(script.turns) + 1)
    except EpisodeFailure as failure:
        failed = getattr(failure, "episode", None)  # the reset failed: the sandbox was acquired
        if failed is not None:
            timings["sandbox_acquire_s"] = failed.timings["sandbox_acquire_s"]
        return _excluded(traj, failure, timings, t0)
    timings["sandbox_acquire_s"] = episode.timings["sandbox_acquire_s"]
    with episode:
        try:
            context = _prompt(task, params.prompt_tokens)
            traj.prompt_token_ids = list(context)
            generation_s = 0.0
            scripted = 0.0  # the drawn durations of the commands played (what the work would take uncontended)
            for turn in script.turns:
                if episode.cancelled:  # before another generation: the sandbox back to the pool, unverified
                    timings["scripted_s"] = round(scripted, 4)
                    _finish(traj, timings, t0, generation_s, episode)
                    episode.abort()
                    return mark_aborted(traj)
                room = params.max_context - len(context)
                if room < 8:  # the context is full: the agent stops and verification runs
                    break
                g0 = time.monotonic()
                gen = policy.generate(context, SamplingParams(max_tokens=min(turn.gen_tokens, room), temperature=1.0,
                                                              ignore_eos=True),
                                      session=session)
                generation_s += time.monotonic() - g0
                traj.turns += 1
                context.extend(gen.token_ids)
                traj.completion_token_ids.extend(gen.token_ids)
                traj.logprobs.extend(gen.logprobs)
                traj.weight_versions.extend(gen.weight_versions)
                traj.loss_mask.extend([1] * len(gen.token_ids))
                observation = episode.act("bash", {"command": _command(turn.tool_s, turn.out_bytes)})
                scripted += turn.tool_s
                if observation.over:  # a model failure: the verification step below raises it (excluded)
                    break
                stdout = episode.steps[-1].stdout
                obs = [10 + b % 470 for b in stdout.encode()[::4]]  # ~ one token per 4 bytes, as a tokenizer would
                obs = obs[:max(0, params.max_context - len(context))]
                context.extend(obs)
                traj.completion_token_ids.extend(obs)
                traj.logprobs.extend([0.0] * len(obs))
                traj.weight_versions.extend([""] * len(obs))
                traj.loss_mask.extend([0] * len(obs))
            v0 = time.monotonic()
            episode.step(f"sleep {script.verify_s:.3f}")  # the verification phase (see the module's docstring)
            timings["verify_s"] = round(time.monotonic() - v0, 4)
            timings["scripted_s"] = round(scripted + script.verify_s, 4)
            _finish(traj, timings, t0, generation_s, episode)
            episode.finish(verify=False)  # the sandbox back to the pool when the script hit no limit
            traj.reward = 0.0
            return traj
        except EpisodeFailure as failure:
            return _excluded(traj, failure, timings, t0)


def _finish(traj: Trajectory, timings: dict[str, float], t0: float, generation_s: float, episode: Any) -> None:
    timings["generation_s"] = round(generation_s, 4)
    timings.update({k: v for k, v in episode.timings.items() if k in ("reset_s", "tools_s")})
    timings["episode_s"] = round(time.monotonic() - t0, 4)
    timings["work_s"] = round(timings["episode_s"] - timings.get("sandbox_acquire_s", 0.0), 4)
    traj.timings = timings


def _excluded(traj: Trajectory, failure: EpisodeFailure, timings: dict[str, float], t0: float) -> Trajectory:
    traj.outcome, traj.evidence = failure.outcome.label, failure.evidence
    traj.excluded, traj.exclude_reason, traj.reward = True, failure.outcome.label, None
    timings["episode_s"] = round(time.monotonic() - t0, 4)
    traj.timings = timings
    return traj
