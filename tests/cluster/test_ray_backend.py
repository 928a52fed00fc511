"""The Ray backend on a real local Ray cluster (a head and a second node process on this
machine, each one sandbox host) with real Docker sandboxes of the repo environment.

The episode function here is a declared seam: it runs the environment's real reset and tool
path without a policy (these tests are about placement and failures, not generation), so no
vLLM server is needed. ``envkit bench rollout --backend ray`` (tests/policy) runs the real
workload with real vLLM replicas."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from envkit.agents import OracleAgent, run_episode
from envkit.base_image import find_base
from envkit.engine import connect
from envkit.errors import UserError
from envkit.harbor import import_harbor
from envkit.runtime import EnvRuntime
from envkit.spec import load_environment
from rl_runner.distributed.context import EpisodeContext
from rl_runner.rollout.trajectory import Trajectory

from ..conftest import PYFIX
from ..harbor_tasks import UNPULLABLE, write_harbor_tasks

ray = pytest.importorskip("ray")
from rl_runner.distributed.cluster import LocalRayCluster  # noqa: E402
from rl_runner.distributed.driver import RayRollouts  # noqa: E402
from rl_runner.distributed.host import RUN_LABEL  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def tool_episode(ctx: EpisodeContext, *, g: int, i: int, seconds: float) -> Trajectory:
    """Reset a sandbox to the task's seed and run one command that takes ``seconds``."""
    task = ctx.runtime.env.tasks[g % len(ctx.runtime.env.tasks)]
    traj = Trajectory(env_ref=ctx.runtime.env.ref, image_digest=ctx.runtime.build.image_id, task_id=task.id, seed=g,
                      group_id=f"{task.id}/{g}")
    sandbox = ctx.sandboxes.acquire()
    reusable = False
    try:
        episode = ctx.runtime.episode(task, g, sandbox, "probe")
        episode.reset()
        result = episode.step(f"sleep {seconds}; echo done-{g}-{i}")
        assert result.stdout.strip() == f"done-{g}-{i}", result
        traj.reward, traj.turns = 1.0, 1
        reusable = True
        return traj
    finally:
        ctx.sandboxes.release(sandbox, reusable=reusable)


def oracle_episode(ctx: EpisodeContext, *, task_id: str, seed: int) -> Trajectory:
    """The task's oracle (for a Harbor task: solve.sh, then tests/test.sh as the verifier)."""
    task = ctx.runtime.env.task(task_id)
    sandbox = ctx.sandboxes.acquire()
    try:
        result = run_episode(ctx.runtime, task, seed, OracleAgent(), sandbox)
    finally:
        ctx.sandboxes.release(sandbox, reusable=False)
    return Trajectory(env_ref=ctx.runtime.env.ref, image_digest=ctx.runtime.build.image_id, task_id=task_id, seed=seed,
                      group_id=task_id, reward=result.reward, outcome=result.outcome, evidence=result.evidence)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    # The test module is not installed on the nodes: ship its functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    c = LocalRayCluster(2).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def runtime() -> EnvRuntime:
    return EnvRuntime(load_environment(PYFIX))


def _run_all(rollouts: RayRollouts, runtime: EnvRuntime, n: int, seconds: float,
             during: Any = None) -> list[Trajectory]:
    def one(k: int) -> Trajectory:
        def describe() -> Trajectory:
            return Trajectory(env_ref=runtime.env.ref, image_digest=runtime.build.image_id, task_id="", seed=k,
                              group_id="")

        return rollouts.run(tool_episode, {"g": k, "i": 0, "seconds": seconds}, session=f"s{k}",
                            cancel=threading.Event(), describe=describe)

    with ThreadPoolExecutor(max_workers=n) as ex:
        futures = [ex.submit(one, k) for k in range(n)]
        if during is not None:
            during()
        return [f.result(timeout=600) for f in futures]


@pytest.mark.timeout(900)
def test_episodes_spread_over_both_hosts_and_pool_sandboxes_are_reused(cluster: LocalRayCluster, runtime: EnvRuntime):
    rollouts = RayRollouts(runtime, [], address=cluster.address).start()
    try:
        assert len(rollouts.hosts) == 2 and len({h.info["node"] for h in rollouts.hosts}) == 2
        rollouts.configure("pool", 4)
        first = _run_all(rollouts, runtime, 8, 0.5)
        second = _run_all(rollouts, runtime, 8, 0.5)
        trajs = first + second
        assert [t.outcome for t in trajs] == ["ok"] * 16 and all(t.reward == 1.0 and t.retries == 0 for t in trajs)
        nodes = {t.placement["sandbox_node"] for t in trajs}
        assert nodes == {h.info["node"] for h in rollouts.hosts}, "episodes ran on both sandbox hosts"
        stats = rollouts.sandbox_stats()
        assert stats["hosts"] == 2 and stats["reused"] > 0, stats
    finally:
        rollouts.close()
    assert connect().containers.list(all=True, filters={"label": f"{RUN_LABEL}={rollouts.run_id}"}) == []


@pytest.mark.timeout(900)
def test_a_killed_sandbox_host_fails_its_episodes_as_infra_and_they_are_retried_elsewhere(cluster: LocalRayCluster,
                                                                                        runtime: EnvRuntime):
    rollouts = RayRollouts(runtime, [], address=cluster.address).start()
    victim = rollouts.hosts[0]
    survivor = rollouts.hosts[1]
    try:
        rollouts.configure("pool", 8)

        def kill_mid_run() -> None:
            deadline = time.monotonic() + 120
            while victim.load < 2 and time.monotonic() < deadline:  # episodes are running on the victim
                time.sleep(0.05)
            time.sleep(2.0)
            ray.kill(victim.handle, no_restart=True)

        trajs = _run_all(rollouts, runtime, 8, 6.0, during=kill_mid_run)
        # every episode exactly once, all of them trained-on results
        assert sorted(t.seed for t in trajs) == list(range(8))
        assert [t.outcome for t in trajs] == ["ok"] * 8, [(t.outcome, t.evidence) for t in trajs]
        moved = [t for t in trajs if t.retries]
        assert moved, "the killed host was serving episodes"
        for t in moved:
            assert t.attempts == ["infra_failure:sandbox_host_lost"] and t.retries == 1, t.attempts
            assert t.placement["sandbox_host"] == survivor.info["host"]
        assert not victim.alive and survivor.alive
        # the dead host's containers were removed by the live one (they share this engine)
        left = connect().containers.list(all=True, filters={"label": f"{RUN_LABEL}={rollouts.run_id}"})
        assert all(c.labels.get("org.envkit.ray-host") == survivor.info["host"] for c in left)
        # later episodes go to the survivor only
        after = _run_all(rollouts, runtime, 2, 0.1)
        assert all(t.outcome == "ok" and t.placement["sandbox_host"] == survivor.info["host"] for t in after)
    finally:
        rollouts.close()
    assert connect().containers.list(all=True, filters={"label": f"{RUN_LABEL}={rollouts.run_id}"}) == []


@pytest.mark.timeout(300)
def test_a_node_without_the_image_is_a_clear_error(cluster: LocalRayCluster, runtime: EnvRuntime):
    # no engine has it
    missing = EnvRuntime(runtime.env, build_result=dataclasses.replace(runtime.build, image_id="sha256:" + "0" * 64))
    with pytest.raises(UserError, match="not in the Docker engine of node") as e:
        RayRollouts(missing, [], address=cluster.address).start()
    assert "envkit build" in e.value.hint


@pytest.mark.timeout(900)
def test_a_container_environment_runs_on_the_cluster(cluster: LocalRayCluster,
                                                     tmp_path_factory: pytest.TempPathFactory):
    """Harbor tasks (one image per task, a fresh container per reset, tests/ and solution/
    copied in from the worker's side) through sandbox hosts on both nodes."""
    root = tmp_path_factory.mktemp("ray-harbor")
    write_harbor_tasks(root / "src")
    tag = find_base(connect()).tag
    import_harbor([root / "src"], root / "env", name="harbor/raytest", base_map={image: tag for image in UNPULLABLE})
    runtime = EnvRuntime(load_environment(root / "env"))
    tasks = [t.id for t in runtime.env.tasks]
    rollouts = RayRollouts(runtime, [], address=cluster.address).start()
    try:
        rollouts.configure("fresh", 0)

        def one(k: int) -> Trajectory:
            def describe() -> Trajectory:
                return Trajectory(env_ref=runtime.env.ref, image_digest=runtime.build.image_id, task_id=tasks[k],
                                  seed=k, group_id="")

            return rollouts.run(oracle_episode, {"task_id": tasks[k], "seed": k}, session=f"h{k}",
                                cancel=threading.Event(), describe=describe)

        with ThreadPoolExecutor(max_workers=4) as ex:
            trajs = list(ex.map(one, range(len(tasks))))
        assert [(t.task_id, t.outcome, t.reward) for t in trajs] == [(k, "ok", 1.0) for k in tasks], \
            [(t.task_id, t.outcome, t.evidence) for t in trajs]
        assert all(t.retries == 0 for t in trajs)
        assert {t.placement["sandbox_node"] for t in trajs} == {h.info["node"] for h in rollouts.hosts}
    finally:
        rollouts.close()
    assert connect().containers.list(all=True, filters={"label": f"{RUN_LABEL}={rollouts.run_id}"}) == []


@pytest.mark.timeout(300)
def test_a_node_without_a_task_image_is_a_clear_error(cluster: LocalRayCluster,
                                                      tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ray-harbor-missing")
    write_harbor_tasks(root / "src")
    tag = find_base(connect()).tag
    import_harbor([root / "src"], root / "env", name="harbor/raytest", base_map={image: tag for image in UNPULLABLE})
    built = EnvRuntime(load_environment(root / "env"))
    images = {**built.build.task_images, built.env.tasks[3].id: "sha256:" + "0" * 64}  # one image no engine has
    runtime = EnvRuntime(built.env, build_result=dataclasses.replace(built.build, task_images=images))
    with pytest.raises(UserError, match="not in the Docker engine of node") as e:
        RayRollouts(runtime, [], address=cluster.address).start()
    assert "docker load" in e.value.hint
