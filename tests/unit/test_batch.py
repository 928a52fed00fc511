"""Batch assembly with a fake episode (the declared seam: ``run_episode(group, member,
cancel)``), the occupancy arithmetic, the router, the workload's scripts and the sandbox
pools. Timing-free: stragglers wait on events the test releases, so every assertion is about
which trajectories land where, never about how fast."""

from __future__ import annotations

import random
import threading
import time

import pytest

from envkit.occupancy import Occupancy
from rl_runner.batch.assembler import ABLATION, NAIVE, OPTIMIZED, Assembler, AssemblyPolicy
from rl_runner.batch.workload import WorkloadParams, draw_script
from rl_runner.rollout.loop import ABORTED, mark_aborted
from rl_runner.rollout.trajectory import Trajectory


class FakeEpisodes:
    """Episodes that finish at once, except members of ``hold`` groups, which wait for
    ``release`` (or for cancellation). Records the most episodes ever running together."""

    def __init__(self, hold: set[int] | None = None, hold_members: set[tuple[int, int]] | None = None) -> None:
        self.hold = hold or set()
        self.hold_members = hold_members or set()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0
        self.started: list[tuple[int, int]] = []

    def __call__(self, g: int, i: int, cancel: threading.Event) -> Trajectory:
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.started.append((g, i))
        try:
            t = Trajectory(env_ref="e", image_digest="sha256:x", task_id="t", seed=g, group_id=f"g{g}")
            t.evidence = {"member": i}
            t.timings = {"episode_s": 0.01, "work_s": 0.01}
            if g in self.hold or (g, i) in self.hold_members:
                while not self.release.is_set():
                    if cancel.is_set():
                        return mark_aborted(t)
                    time.sleep(0.005)
            t.reward = 1.0
            return t
        finally:
            with self.lock:
                self.running -= 1


def _keys(trajs: list[Trajectory]) -> list[tuple[int, int]]:
    return [(t.seed, t.evidence["member"]) for t in trajs]


def test_naive_waits_for_its_slowest_member_and_admits_nothing_between_batches():
    eps = FakeEpisodes(hold={0})
    asm = Assembler(eps, group_size=2, groups_per_batch=3, concurrency=4, policy=NAIVE).start()
    time.sleep(0.05)
    assert eps.started == []  # nothing runs until the trainer asks
    done: list = []
    t = threading.Thread(target=lambda: done.append(asm.next_batch(timeout=30)))
    t.start()
    time.sleep(0.2)
    assert not done  # group 0 holds the batch
    eps.release.set()
    t.join(30)
    batch = done[0]
    assert sorted({tr.seed for tr in batch.trajectories}) == [0, 1, 2]
    assert len(batch.trajectories) == 6
    assert batch.stats["straggler_wait_share"] > 0  # slots sat idle while group 0 ran
    time.sleep(0.05)
    assert len(eps.started) == 6  # not continuous: nothing of the next batch started
    asm.stop()
    assert eps.max_running <= 4


def test_cutoff_carries_a_straggler_into_a_later_batch_without_loss_or_double_count():
    eps = FakeEpisodes(hold={0})
    policy = AssemblyPolicy("t", warm_pool=False, continuous=True, cutoff=True, overprovision=1.0, affinity=False)
    asm = Assembler(eps, group_size=2, groups_per_batch=2, concurrency=3, policy=policy).start()
    first = asm.next_batch(timeout=30)
    assert 0 not in {tr.seed for tr in first.trajectories}  # the straggler did not hold the batch
    assert first.stats["carried_groups"] >= 1
    eps.release.set()
    seen = _keys(first.trajectories)
    batches = [first]
    while 0 not in {t.seed for b in batches for t in b.trajectories}:
        batches.append(asm.next_batch(timeout=30))
        seen += _keys(batches[-1].trajectories)
    assert len(seen) == len(set(seen))  # nothing delivered twice
    assert all(len([k for k in seen if k[0] == g]) == 2 for g, _ in seen)  # only complete groups
    left = asm.stop()
    assert eps.max_running <= 3
    delivered_groups = {g for g, _ in seen}
    started_groups = {g for g, _ in eps.started}
    # every group that started is delivered, or reported as left over at stop
    assert len(started_groups - delivered_groups) == left["groups"]


def test_partial_groups_deliver_at_the_ready_share_and_late_members_follow_exactly_once():
    eps = FakeEpisodes(hold_members={(0, 2), (0, 3)})
    policy = AssemblyPolicy("t", warm_pool=False, continuous=True, cutoff=True, overprovision=1.0, affinity=False,
                            partial=0.5)
    asm = Assembler(eps, group_size=4, groups_per_batch=2, concurrency=4, policy=policy).start()
    assert asm.ready_at == 2
    first = asm.next_batch(timeout=30)
    seen = _keys(first.trajectories)
    assert first.late == 0 and not any(t.late for t in first.trajectories)
    assert all(len([k for k in seen if k[0] == g]) >= 2 for g, _ in seen)  # every group with at least 2 members
    # group 0 is ready with members 0 and 1 while 2 and 3 still run: it need not wait for them
    deadline = time.monotonic() + 10
    batches = [first]
    while (0, 0) not in seen and time.monotonic() < deadline:
        batches.append(asm.next_batch(timeout=30))
        seen += _keys(batches[-1].trajectories)
    assert (0, 0) in seen and (0, 1) in seen and (0, 2) not in seen
    eps.release.set()
    while not {(0, 2), (0, 3)} <= set(seen):
        batches.append(asm.next_batch(timeout=30))
        seen += _keys(batches[-1].trajectories)
    lates = [t for b in batches for t in b.trajectories if t.late]
    assert {(t.seed, t.evidence["member"]) for t in lates} >= {(0, 2), (0, 3)}
    # every batch holds the 8 trajectories asked for, late members counted, with no group more than it takes
    for b in batches:
        fresh = [grp for grp in b.groups if not grp[0].late]  # ready groups, in the order taken
        assert b.late + sum(map(len, fresh)) >= 8
        assert b.late + sum(map(len, fresh[:-1])) < 8
    with0 = next(b for b in batches if any(t.seed == 0 and not t.late for t in b.trajectories))
    assert len(with0.groups) >= 3  # group 0 brought 2 members, another group at most 4: more were needed
    assert sum(b.late for b in batches) == len(lates)
    assert len(seen) == len(set(seen))  # nothing delivered twice
    left = asm.stop()
    assert eps.max_running <= 4
    # every member of every delivered group was delivered, unless still running or finished after the last batch
    missing = {(g, i) for g, _ in seen for i in range(4)} - set(seen)
    assert len(missing) <= left["late_undelivered"] + 4


def test_late_members_alone_fill_a_batch_when_enough_have_finished():
    """Batches of 4 from groups that enter with 3 of 4: each batch takes two groups and leaves
    two late members running. Once eight have finished, the next batch is four of them and no
    group (a batch waiting for a group while late members pile up would never close), the one
    after the other four."""
    eps = FakeEpisodes(hold_members={(g, 3) for g in range(8)})
    policy = AssemblyPolicy("t", warm_pool=False, continuous=True, cutoff=True, overprovision=1.0, affinity=False,
                            partial=0.75)
    asm = Assembler(eps, group_size=4, groups_per_batch=1, concurrency=16, policy=policy).start()
    batches = [asm.next_batch(timeout=30) for _ in range(4)]
    assert sorted(t.seed for b in batches for t in b.trajectories) == sorted([g for g in range(8)] * 3)
    eps.release.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with asm.cv:
            if len(asm.late) == 8:
                break
        time.sleep(0.01)
    fifth, sixth = asm.next_batch(timeout=30), asm.next_batch(timeout=30)
    for b in (fifth, sixth):
        assert b.late == 4 and len(b.trajectories) == 4 and all(t.late for t in b.trajectories)
    batches += [fifth, sixth, asm.next_batch(timeout=30)]
    seen = _keys([t for b in batches for t in b.trajectories])
    assert len(seen) == len(set(seen))  # nothing delivered twice
    assert {(g, i) for g in range(8) for i in range(4)} <= set(seen)  # every member of the first 8 groups
    assert all(4 <= len(b.trajectories) <= 7 for b in batches)  # the 4 asked for, at most a group's 3 over
    asm.stop()


def test_abort_reports_cancelled_stragglers_and_never_trains_on_them():
    eps = FakeEpisodes(hold={0})
    policy = AssemblyPolicy("t", warm_pool=False, continuous=True, cutoff=True, overprovision=1.0, affinity=False,
                            straggler="abort")
    asm = Assembler(eps, group_size=2, groups_per_batch=2, concurrency=4, policy=policy).start()
    first = asm.next_batch(timeout=30)
    assert 0 not in {t.seed for t in first.trajectories}
    aborted: list[Trajectory] = list(first.aborted)
    delivered = list(first.trajectories)
    for _ in range(50):  # the cancelled episodes come back at their next check, a few ms later
        if 0 in {t.seed for t in aborted}:
            break
        time.sleep(0.02)
        b = asm.next_batch(timeout=30)
        aborted += b.aborted
        delivered += b.trajectories
    asm.stop()
    # group 0 was cancelled mid-episode; other groups overtaken by newer ones may be aborted too
    assert 0 in {t.seed for t in aborted}
    assert all(t.outcome == ABORTED and t.reward is None for t in aborted if t.seed == 0)
    assert all(t.excluded for t in aborted)
    assert not {t.seed for t in aborted} & {t.seed for t in delivered}


def test_continuous_admission_keeps_slots_busy_between_batches():
    eps = FakeEpisodes()
    policy = AssemblyPolicy("t", warm_pool=False, continuous=True, cutoff=True, overprovision=0.5, affinity=False)
    asm = Assembler(eps, group_size=2, groups_per_batch=2, concurrency=2, policy=policy).start()
    deadline = time.monotonic() + 10
    while len(eps.started) < 6 and time.monotonic() < deadline:  # 2 + 1 groups admitted before anyone asked
        time.sleep(0.01)
    assert len(eps.started) == 6
    b = asm.next_batch(timeout=30)
    assert len(b.trajectories) == 4
    asm.stop()


def test_an_episode_that_raises_surfaces_in_next_batch():
    def boom(g: int, i: int, cancel: threading.Event) -> Trajectory:
        raise RuntimeError("a bug in the episode code")

    asm = Assembler(boom, group_size=1, groups_per_batch=1, concurrency=1, policy=NAIVE).start()
    with pytest.raises(RuntimeError, match="a bug"):
        asm.next_batch(timeout=30)
    asm.stop()


def test_ablation_adds_one_switch_at_a_time_from_naive_to_optimized():
    assert ABLATION[0] == NAIVE
    assert ABLATION[-1].__dict__ | {"name": ""} == OPTIMIZED.__dict__ | {"name": ""}
    switches = ("warm_pool", "continuous", "cutoff", "affinity", "partial")
    for a, b in zip(ABLATION, ABLATION[1:], strict=False):
        assert sum(getattr(a, s) != getattr(b, s) for s in switches) == 1


def test_occupancy_integrals_with_a_fake_clock():
    now = [0.0]
    occ = Occupancy(clock=lambda: now[0])
    now[0] = 1.0
    occ.add(2)  # 2 from t=1
    now[0] = 3.0
    occ.add(-1)  # 1 from t=3
    now[0] = 4.0
    occ.add(-1)  # 0 from t=4
    assert occ.integral(0, 5) == pytest.approx(2 * 2 + 1 * 1)
    assert occ.time_below(0, 5, 1) == pytest.approx(1 + 1)  # [0,1) and [4,5)
    assert occ.time_below(0, 5, 2) == pytest.approx(1 + 1 + 1)
    assert occ.integral(2, 3.5) == pytest.approx(2 * 1 + 1 * 0.5)
    occ.forget_before(3.5)
    assert occ.integral(3.5, 5) == pytest.approx(0.5)


def test_router_pins_sessions_and_round_robins_without_affinity():
    from rl_runner.policy.client import Generation, SamplingParams
    from rl_runner.policy.router import Router

    class Replica:  # the seam: anything with generate()
        def __init__(self, name: str) -> None:
            self.url, self.calls = name, 0

        def generate(self, ids: list[int], params: SamplingParams, *, session: str | None = None) -> Generation:
            self.calls += 1
            return Generation([1], [0.0], ["0"], "length", cached_tokens=len(ids) // 2)

        def close(self) -> None:
            pass

    a, b = Replica("a"), Replica("b")
    r = Router([a, b], affinity=True)  # type: ignore[list-item]
    for _ in range(5):
        r.generate([1, 2, 3, 4], SamplingParams(), session="s1")
    assert sorted([a.calls, b.calls]) == [0, 5]
    r.generate([1, 2], SamplingParams(), session="s2")  # a new session goes to the idle replica
    assert a.calls >= 1 and b.calls >= 1
    assert r.cache_stats()["prefix_hit_rate"] == pytest.approx((5 * 2 + 1) / (5 * 4 + 2))
    rr = Router([a, b], affinity=False)  # type: ignore[list-item]
    a.calls = b.calls = 0
    for _ in range(4):
        rr.generate([1], SamplingParams(), session="s1")
    assert (a.calls, b.calls) == (2, 2)
    t0 = time.monotonic()
    assert rr.idle_share(t0, t0 + 1) == pytest.approx(1.0)


def test_workload_scripts_are_reproducible_and_heavy_tailed():
    p = WorkloadParams()
    s1 = [draw_script(p, random.Random(f"0:{g}")) for g in range(256)]
    s2 = [draw_script(p, random.Random(f"0:{g}")) for g in range(256)]
    assert s1 == s2
    tools = sorted(s.tool_s for s in s1)
    median = tools[len(tools) // 2]
    assert tools[-1] > 5 * median  # the tail the assembler has to beat
    assert all(1 <= len(s.turns) <= p.turns_max for s in s1)
    half = [draw_script(WorkloadParams(time_scale=0.5), random.Random(f"0:{g}")) for g in range(5)]
    assert [h.verify_s for h in half] == pytest.approx([s.verify_s * 0.5 for s in s1[:5]], abs=2e-3)


class _Box:
    def __init__(self, n: int) -> None:
        self.n, self.destroyed = n, False

    def alive(self) -> bool:
        return not self.destroyed

    def destroy(self) -> None:
        self.destroyed = True


class _Backend:  # the declared seam: anything with create()
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def create(self) -> _Box:
        with self.lock:
            self.count += 1
            return _Box(self.count)


def test_reusing_pool_prefills_reuses_clean_sandboxes_and_replaces_broken_ones():
    from rl_runner.rollout.reuse import sandbox_pool, sandbox_stats

    backend = _Backend()
    pool = sandbox_pool(backend, 3, max_create_per_s=1000)
    deadline = time.monotonic() + 10
    while backend.count < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert backend.count == 3  # created ahead of demand, and no more
    for _ in range(4):  # three ready ones, then the first again: clean sandboxes come back
        pool.release(pool.acquire(), reusable=True)
    assert pool.stats.reused == 1 and backend.count == 3
    pool.release(pool.acquire(), reusable=False)  # broken: destroyed in the background, and replaced
    deadline = time.monotonic() + 10
    while backend.count < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.count == 4 and pool.stats.destroyed >= 1
    held = [pool.acquire() for _ in range(3)]
    with pytest.raises(Exception, match="no sandbox became ready"):
        pool.acquire(timeout=0.2)  # sized independently of demand: a 4th waits
    for sb in held:
        pool.release(sb, reusable=True)
    assert sandbox_stats(pool)["kind"] == "pool"
    pool.close()
    assert all(sb.destroyed for sb in held)
    assert pool.alive.value == 0 and pool.held.value == 0


def test_fresh_sandboxes_are_created_per_episode_and_never_reused():
    from rl_runner.rollout.reuse import FreshSandboxes, sandbox_stats

    fresh = FreshSandboxes(_Backend())
    c = fresh.acquire()
    assert fresh.held.value == 1 and fresh.alive.value == 1
    fresh.release(c, reusable=True)  # never reused: destroyed on the episode's clock
    assert c.destroyed and fresh.alive.value == 0 and fresh.held.value == 0
    assert sandbox_stats(fresh) == {"kind": "fresh", "size": 0, "created": 1, "reused": 0, "destroyed": 1,
                                    "create_failures": 0}


def test_the_replay_runs_the_assembler_alone_on_the_workloads_drawn_durations():
    from rl_runner.batch.rollout_bench import replay_policy

    params = WorkloadParams()
    rows = [replay_policy(p, trajectories=16, group_size=4, concurrency=8, batches=2, seed=3, params=params,
                          scale=0.004)
            for p in (NAIVE, OPTIMIZED)]
    for r in rows:
        assert r["replay"] and len(r["ttb_per_batch_s"]) == 2
        assert r["ttb_over_ideal"] >= 0.9  # no batch beats its work spread over every slot (timer slack aside)
    # the first naive batch is its 16 scripts (groups 0-3), so it lasts at least its longest one
    longest = max(draw_script(params, random.Random(f"3:{g}:{i}")).tool_s for g in range(4) for i in range(4))
    assert rows[0]["ttb_per_batch_s"][0] >= longest * 0.95


def test_the_slot_time_split_counts_what_is_still_running_when_the_last_batch_closes():
    from rl_runner.batch.assembler import slot_time_split

    now = [0.0]
    go = {0: threading.Event(), 1: threading.Event()}
    started: list[tuple[int, int]] = []

    def episode(g: int, i: int, cancel: threading.Event) -> Trajectory:
        started.append((g, i))
        while not (go[g].wait(0.005) or cancel.is_set()):
            pass
        t = Trajectory(env_ref="e", image_digest="sha256:x", task_id="t", seed=g, group_id=f"g{g}")
        t.timings = {"episode_s": 10.0, "work_s": 10.0}
        t.reward = 1.0
        return mark_aborted(t) if cancel.is_set() and not go[g].is_set() else t

    # groups of 2, one a batch, 3 slots: both members of group 0 and the first of group 1 start at t=0
    asm = Assembler(episode, group_size=2, groups_per_batch=1, concurrency=3, policy=OPTIMIZED, clock=lambda: now[0])
    got = []
    try:
        asm.start()
        waiter = threading.Thread(target=lambda: got.append(asm.next_batch()))
        waiter.start()
        deadline = time.monotonic() + 10
        while (len(started) < 3 or not asm.wanted) and time.monotonic() < deadline:
            time.sleep(0.005)
        now[0] = 10.0
        go[0].set()  # group 0 done at t=10; group 1's first member has run 10 s and goes on
        waiter.join(10)
    finally:
        go[1].set()
        asm.stop()
    assert len(got) == 1 and got[0].ttb_s == 10.0
    assert got[0].stats["in_flight_s"] == 10.0 and got[0].stats["finished_undelivered_s"] == 0.0
    # 3 slots x 10 s: group 0's 20 s delivered, 10 s still running
    assert slot_time_split(got, 3) == {"delivered": 0.6667, "in_flight_at_end": 0.3333, "of_which_late_members": 0.0,
                                       "finished_undelivered_at_end": 0.0, "other": 0.0}
