"""The agent loop: tokenise once, generate, parse one tool call, act in the sandbox, append
the observation's tokens, repeat; then verify. Infra failures raise (the runner retries on a
fresh sandbox); model failures end the episode and keep the verifier's reward."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from envkit.errors import FailureCategory, InfraFailure, ModelFailure, format_outcome
from envkit.runtime import Episode
from rl_runner.distributed.context import EpisodeContext
from rl_runner.policy.client import SamplingParams
from rl_runner.rollout.chat import ChatFormat, ToolCall, UnparseableAction
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["ABORTED", "OBSERVATION_CAP", "agent_episode", "load_chat_format", "mark_aborted"]

ABORTED = format_outcome(FailureCategory.ABORTED, "straggler")  # the batch assembler cancelled the episode; not a model or infra outcome

OBSERVATION_CAP = 1500  # characters of one observation shown to the model


def _observe(episode: Episode, call: ToolCall) -> str:
    return episode.act(call.name, call.arguments)[:OBSERVATION_CAP]


def agent_episode(ctx: EpisodeContext, *, task_id: str, seed: int, group_id: str, sampling: SamplingParams) -> Trajectory:
    """One episode of the model-driven agent (an episode function of the rollout seam,
    :mod:`rl_runner.distributed.rollouts`): the sandbox comes from ``ctx.sandboxes`` (a
    reusing pool gets it back after a clean episode, see :mod:`rl_runner.rollout.reuse`), the
    chat format is ``ctx.extra`` (a Ray worker's ``setup`` loaded it), every turn is routed to
    one vLLM replica by ``ctx.session`` (:mod:`rl_runner.policy.router`); prompts, tool calls
    and observations are in the model's own chat format (``ctx.extra``, a
    :class:`rl_runner.rollout.chat.ChatFormat`: the tokens appended after each reply are the
    template's tool message). ``ctx.cancel`` (set
    by the batch assembler for an aborted straggler) ends the episode at its next turn
    boundary, unverified and excluded."""
    runtime, policy, sandboxes, cancel, session = ctx.runtime, ctx.policy, ctx.sandboxes, ctx.cancel, ctx.session
    fmt: ChatFormat = ctx.extra
    task = runtime.env.task(task_id)
    spec = runtime.env.spec
    limits = spec.limits
    enabled: list[str] = list(spec.tools.enabled)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    sandbox = sandboxes.acquire()
    reusable = False
    timings["sandbox_acquire_s"] = round(time.monotonic() - t0, 4)
    # The counterfactual check's fresh sandbox: from the sandbox host on a Ray cluster.
    episode = runtime.episode(task, seed, sandbox, "policy", fresh=getattr(sandboxes, "create_fresh", None))
    traj = Trajectory(env_ref=runtime.env.ref, image_digest=runtime.build.image_id,
                      bundle_digest=runtime.build.bundle_digest, runtime=runtime.limits.runtime, task_id=task.id, seed=seed,
                      group_id=group_id)
    try:
        episode.reset()
        conversation = fmt.start(task.instruction, enabled)
        traj.prompt_token_ids = list(conversation.prompt_ids)
        context = list(traj.prompt_token_ids)
        failure: ModelFailure | None = None
        generation_s = 0.0
        for turn in range(limits.max_turns):
            if cancel.is_set():
                timings["generation_s"] = round(generation_s, 4)
                timings["episode_s"] = round(time.monotonic() - t0, 4)
                traj.timings = timings
                reusable = True
                return mark_aborted(traj)
            budget = limits.max_generated_tokens - traj.generated_tokens
            if budget <= 0:
                failure = ModelFailure("token_limit", f"the model generated {traj.generated_tokens} tokens, the spec allows "
                                                      f"{limits.max_generated_tokens}")
                break
            g0 = time.monotonic()
            gen = policy.generate(context, replace(sampling, max_tokens=min(sampling.max_tokens, budget),
                                                   stop_token_ids=fmt.stop_ids, seed=None if sampling.seed is None
                                                   else sampling.seed + 1000 * seed + turn), session=session)
            generation_s += time.monotonic() - g0
            traj.turns = turn + 1
            _append(traj, context, gen.token_ids, gen.logprobs, gen.weight_versions, model=True)
            text = fmt.reply_text(list(gen.token_ids))
            try:
                call = fmt.parse(text, enabled)
            except UnparseableAction as e:
                failure = ModelFailure("unparseable_action", str(e), text=text[:500])
                break
            if call is None:
                # The model is done; a final reply without a tool call is its answer
                # (unless it already gave one with the answer tool).
                if episode.answer_text is None and text.strip():
                    episode.answer(text)
                break
            try:
                observation = _observe(episode, call)
            except ModelFailure as e:  # e.g. no process can start (its own pids), or its sandbox stopped (root):
                failure = e            # the model's doing, so the episode is verified, never excluded
                break
            if call.name == "answer":
                break
            if episode.model_failure is not None:
                failure = episode.model_failure
                break
            obs_ids = conversation.observe(list(gen.token_ids), observation)
            _append(traj, context, obs_ids, [0.0] * len(obs_ids), [""] * len(obs_ids), model=False)
        else:
            failure = ModelFailure("turn_limit", f"the model used all {limits.max_turns} turns")
        timings["generation_s"] = round(generation_s, 4)
        verdict = episode.verify()
        traj.reward = verdict.reward
        traj.verifier = verifier_details(verdict.details)
        failure = episode.verify_failure or failure or episode.model_failure or episode.limit_failure
        if failure is not None:
            traj.outcome, traj.evidence = failure.outcome.label, failure.evidence
        timings.update({k: v for k, v in episode.timings.items() if k in ("reset_s", "tools_s", "verify_s", "counterfactual_s")})
        timings["episode_s"] = round(time.monotonic() - t0, 4)
        traj.timings = timings
        reusable = failure is None or failure.kind in ("unparseable_action", "turn_limit", "token_limit")
        return traj
    finally:
        episode.close()
        sandboxes.release(sandbox, reusable=reusable)


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
