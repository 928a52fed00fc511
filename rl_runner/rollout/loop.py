"""The agent loop: tokenise once, generate, parse one tool call, act in the sandbox, append
the observation's tokens, repeat; then verify. Infra failures raise (the runner retries on a
fresh sandbox); model failures end the episode and keep the verifier's reward."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from envkit.errors import FailureCategory, InfraFailure, ModelFailure, format_outcome
from rl_runner.distributed.context import EpisodeContext
from rl_runner.policy.client import SamplingParams
from rl_runner.rollout.chat import ChatFormat, UnparseableAction
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["ABORTED", "OBSERVATION_CAP", "agent_episode", "load_chat_format", "mark_aborted"]

# the batch assembler cancelled the episode; not a model or infra outcome
ABORTED = format_outcome(FailureCategory.ABORTED, "straggler")

OBSERVATION_CAP = 1500  # characters of one observation shown to the model


def agent_episode(ctx: EpisodeContext, *, task_id: str, seed: int, group_id: str,
                  sampling: SamplingParams) -> Trajectory:
    """One episode of the model-driven agent (an episode function of the rollout seam,
    :mod:`rl_runner.distributed.rollouts`): the sandbox comes from ``ctx.sandboxes`` (a
    reusing pool gets it back after a clean episode, see :mod:`rl_runner.rollout.reuse`), the
    chat format is ``ctx.extra`` (a Ray worker's ``setup`` loaded it), every turn is routed to
    one vLLM replica by ``ctx.session`` (:mod:`rl_runner.policy.router`); prompts, tool calls
    and observations are in the model's own chat format (``ctx.extra``, a
    :class:`rl_runner.rollout.chat.ChatFormat`: the tokens appended after each reply are the
    template's tool message). The episode's lifecycle (budgets, verification, outcome,
    release) is :class:`envkit.runtime.Episode`'s; this loop decides only what the model says
    next. ``ctx.cancel`` (set by the batch assembler for an aborted straggler) ends the episode
    at its next turn boundary, unverified and excluded."""
    runtime, policy, cancel, session = ctx.runtime, ctx.policy, ctx.cancel, ctx.session
    fmt: ChatFormat = ctx.extra
    task = runtime.env.task(task_id)
    enabled: list[str] = list(runtime.env.spec.tools.enabled)
    t0 = time.monotonic()
    # The counterfactual check's fresh sandbox: from the sandbox host on a Ray cluster.
    with runtime.start(task, seed, ctx.sandboxes, agent="policy", fresh=getattr(ctx.sandboxes, "create_fresh", None),
                       cancel=cancel) as episode:
        traj = Trajectory(env_ref=runtime.env.ref, image_digest=runtime.build.image_id,
                          bundle_digest=runtime.build.bundle_digest, runtime=runtime.limits.runtime, task_id=task.id,
                          seed=seed, group_id=group_id)
        conversation = fmt.start(task.instruction, enabled)
        traj.prompt_token_ids = list(conversation.prompt_ids)
        context = list(traj.prompt_token_ids)
        generation_s = 0.0
        cancelled = False
        while True:
            if episode.cancelled:  # checked before each generation: an action already generated runs
                cancelled = True
                break
            budget = episode.tokens_left()
            if budget <= 0:
                break
            g0 = time.monotonic()
            gen = policy.generate(context, replace(sampling, max_tokens=min(sampling.max_tokens, budget),
                                                   stop_token_ids=fmt.stop_ids, seed=None if sampling.seed is None
                                                   else sampling.seed + 1000 * seed + traj.turns), session=session)
            generation_s += time.monotonic() - g0
            traj.turns += 1
            episode.generated(len(gen.token_ids))
            _append(traj, context, gen.token_ids, gen.logprobs, gen.weight_versions, model=True)
            text = fmt.reply_text(list(gen.token_ids))
            try:
                call = fmt.parse(text, enabled)
            except UnparseableAction as e:
                episode.end(ModelFailure("unparseable_action", str(e), text=text[:500]))
                break
            if call is None:
                # The model is done; a final reply without a tool call is its answer
                # (unless it already gave one with the answer tool).
                if episode.answer_text is None and text.strip():
                    episode.answer(text)
                break
            observation = episode.act(call.name, call.arguments)
            turn_limit = episode.model_failure is not None and episode.model_failure.kind == "turn_limit"
            if observation.over and not turn_limit:
                break
            obs_ids = conversation.observe(list(gen.token_ids), observation.text[:OBSERVATION_CAP])
            _append(traj, context, obs_ids, [0.0] * len(obs_ids), [""] * len(obs_ids), model=False)
            if observation.over:  # the last turn's observation is in the trajectory, as every other
                break
        timings = {"sandbox_acquire_s": episode.timings.get("sandbox_acquire_s", 0.0),
                   "generation_s": round(generation_s, 4)}
        if cancelled:
            timings["episode_s"] = round(time.monotonic() - t0, 4)
            traj.timings = timings
            episode.abort()  # the sandbox back to its pool, unverified
            return mark_aborted(traj)
        result = episode.finish(release=False)
        if episode.failure is not None:  # not the model's doing: the runner retries on a fresh sandbox
            raise episode.failure
        traj.reward = result.reward
        traj.verifier = verifier_details(result.verifier)
        if result.outcome != "ok":
            traj.outcome, traj.evidence = result.outcome, result.evidence
        timings.update({k: v for k, v in result.timings.items()
                        if k in ("reset_s", "tools_s", "verify_s", "counterfactual_s")})
        timings["episode_s"] = round(time.monotonic() - t0, 4)
        traj.timings = timings
        episode.release(reusable=episode.reusable)
        return traj


def verifier_details(details: dict[str, Any], limit: int = 8000) -> dict[str, Any]:
    """What the trajectory keeps of the verifier's details: all of them up to ``limit`` bytes of
    JSON, else their start, marked cut."""
    text = json.dumps(details, default=str, ensure_ascii=False)
    return dict(details) if len(text) <= limit else {"cut": True, "bytes": len(text), "start": text[:limit]}


def mark_aborted(traj: Trajectory) -> Trajectory:
    traj.outcome, traj.excluded, traj.reward = ABORTED, True, None
    traj.exclude_reason = "straggler aborted: its batch closed without it"
    return traj


def _append(traj: Trajectory, context: list[int], ids: list[int], logprobs: list[float], versions: list[str],
            *, model: bool) -> None:
    if model and not (len(logprobs) == len(versions) == len(ids)):
        raise InfraFailure("inference_bad_output", "the inference server returned misaligned tokens and log-probs",
                           tokens=len(ids), logprobs=len(logprobs), versions=len(versions))
    context.extend(ids)
    traj.completion_token_ids.extend(ids)
    traj.logprobs.extend(logprobs if model else [0.0] * len(ids))
    traj.weight_versions.extend(versions if model else [""] * len(ids))
    traj.loss_mask.extend([1 if model else 0] * len(ids))


def load_chat_format(model: str, tool_format: str = "auto") -> ChatFormat:
    """A rollout worker's ``setup``: the model's chat format (the folder must be readable there)."""
    from transformers import AutoTokenizer

    return ChatFormat(AutoTokenizer.from_pretrained(model), tool_format, model=model)
