"""The batch assembler: runs episodes in groups under a concurrency limit and hands the
trainer batches of ``groups_per_batch × group_size`` trajectories, in groups, by one of two
families of policy.

``naive`` is what a team gets from a plain semaphore: the batch's episodes are admitted when
the trainer asks for a batch, at most ``concurrency`` run at once, each starts a fresh
container, and the batch closes when every one of its trajectories is done, so it waits for
its slowest member while slots sit idle.

``optimized`` (the default) differs in five independent switches, each measured on its own by
``envkit bench rollout``'s ablation:

* ``warm_pool``: sandboxes come from a pool sized independently of inference, created ahead
  of demand and reused after clean episodes (see :mod:`rl_runner.rollout.reuse`).
* ``continuous``: an episode is admitted the moment a slot frees, whether or not the trainer
  is waiting for a batch, up to ``groups_per_batch × (1 + overprovision)`` groups admitted and
  not yet delivered.
* ``cutoff``: the batch is the first ``groups_per_batch`` groups to *complete*, in completion
  order, rather than a fixed list (with ``partial``, as many ready groups as it takes, below);
  groups still running are stragglers: ``carry`` (default) lets them finish and join a later
  batch as partial rollouts (their tokens keep the weight versions that produced them),
  ``abort`` cancels the ones older than the batch's newest group at their next turn boundary
  and reports them (``Batch.aborted``), never silently.
* ``affinity``: session-affine routing across vLLM replicas (:mod:`rl_runner.policy.router`).
* ``partial`` (with ``cutoff`` and ``carry``): a group is ready for a batch once
  ``ceil(partial × group_size)`` of its members (at least 2) are done, rather than all of them;
  its members still running are *late*: they keep running and join the next batch to close
  after they finish, marked ``late`` (the trainer scores them against every reward their
  group has delivered, :func:`rl_runner.trainer.losses.group_advantages`). A batch still holds
  the trajectories asked for: the late members finished since the last batch (up to that many;
  the rest wait for the next), then ready groups in completion order until the count reaches
  ``groups_per_batch × group_size`` (so it may hold more groups than ``groups_per_batch``, or
  none, and up to ``group_size - 1`` trajectories more than asked for; with whole groups it is
  exactly ``groups_per_batch`` groups). Nothing is dropped:
  the batches together hold every member of every group they admitted. Without it a group
  holding one long member holds its seven finished ones, and the admission limit counts the
  group until it is done; with it the heavy tail of episode lengths stops deciding when a
  batch closes.

The assembler only decides *when* episodes run and *which* trajectories form a batch; the
episode itself is a callable ``run_episode(group, member, cancel) -> Trajectory`` (the seam
the unit tests fake).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from envkit.occupancy import Occupancy
from rl_runner.metrics import pct
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["ABLATION", "NAIVE", "OPTIMIZED", "AssemblyPolicy", "Assembler", "Batch", "slot_time_split", "work_s"]


@dataclass(frozen=True)
class AssemblyPolicy:
    name: str = "optimized"
    warm_pool: bool = True
    continuous: bool = True
    cutoff: bool = True
    overprovision: float = 0.5  # groups admitted beyond one batch, as a fraction of the batch
    affinity: bool = True
    straggler: Literal["carry", "abort"] = "carry"
    partial: float = 0.75  # share of a group's members done before it is ready (1.0: all of them)

    def ready_members(self, group_size: int) -> int:
        """How many members of a group must be done before it can enter a batch."""
        if not (self.cutoff and self.straggler == "carry") or group_size <= 2:
            return group_size
        return min(group_size, max(2, math.ceil(self.partial * group_size - 1e-9)))


NAIVE = AssemblyPolicy("naive", warm_pool=False, continuous=False, cutoff=False, overprovision=0.0, affinity=False,
                       partial=1.0)
OPTIMIZED = AssemblyPolicy()
# What each optimization adds, one at a time, from naive to optimized (envkit bench rollout).
ABLATION = [
    NAIVE,
    replace(NAIVE, name="+ warm pool", warm_pool=True),
    replace(NAIVE, name="+ continuous admission", warm_pool=True, continuous=True, overprovision=1.0),
    replace(OPTIMIZED, name="+ over-provisioning, cutoff", affinity=False, partial=1.0),
    replace(OPTIMIZED, name="+ session affinity", partial=1.0),
    replace(OPTIMIZED, name="+ partial groups (optimized)"),
]


def work_s(t: Trajectory) -> float:
    """The time a trajectory kept a slot busy doing its own work (not waiting for a sandbox)."""
    if "work_s" in t.timings:
        return float(t.timings["work_s"])
    return max(0.0, t.timings.get("episode_s", 0.0) - t.timings.get("sandbox_acquire_s", 0.0))


@dataclass
class Batch:
    index: int
    groups: list[list[Trajectory]]
    t_open: float
    t_close: float
    aborted: list[Trajectory] = field(default_factory=list)  # stragglers cancelled since the last batch
    late: int = 0  # trajectories in ``groups`` whose group entered an earlier batch
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g]

    @property
    def ttb_s(self) -> float:
        return self.t_close - self.t_open


@dataclass
class _Group:
    index: int
    members: list[Trajectory | None]
    left: int
    cancel: threading.Event
    started: int = 0
    done: int = 0
    aborted: bool = False


class Assembler:
    def __init__(self, run_episode: Callable[[int, int, threading.Event], Trajectory], *, group_size: int,
                 groups_per_batch: int, concurrency: int, policy: AssemblyPolicy, first_group: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if group_size < 1 or groups_per_batch < 1 or concurrency < 1:
            raise ValueError("group_size, groups_per_batch and concurrency must be >= 1")
        self.run_episode = run_episode
        self.group_size, self.gpb, self.concurrency, self.policy = group_size, groups_per_batch, concurrency, policy
        self.limit = groups_per_batch + math.ceil(policy.overprovision * groups_per_batch)
        self.ready_at = policy.ready_members(group_size)
        self.clock = clock
        self.executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="episode")
        self.cv = threading.Condition()
        self.pending: deque[tuple[int, int]] = deque()
        self.groups: dict[int, _Group] = {}  # admitted and not yet delivered
        self.complete: list[int] = []  # ready (enough members done), undelivered groups in the order they became so
        self.delivered: dict[int, _Group] = {}  # delivered with members still running (partial groups)
        self.late: list[Trajectory] = []  # those members, finished since the last batch
        self.next_group = first_group
        self.base = first_group  # index order: the next batch's first group
        self.wanted = False
        self.stopping = False
        self.n_running = 0
        self.running = Occupancy(clock)  # episodes running: the slots in use
        self.started_at: dict[tuple[int, int], float] = {}  # episodes running: when each started
        self.errors: list[BaseException] = []
        self.aborted: list[Trajectory] = []
        self.batches = 0

    # -- admission -------------------------------------------------------------------------
    def start(self) -> Assembler:
        with self.cv:
            self._pump()
        return self

    def _pump(self) -> None:
        """Admit groups and start episodes as the policy allows (holding ``cv``)."""
        if self.stopping:
            return
        if self.policy.continuous or self.wanted:
            while len(self.groups) < self.limit:
                g = self.next_group
                self.next_group += 1
                self.groups[g] = _Group(g, [None] * self.group_size, self.group_size, threading.Event())
                self.pending.extend((g, i) for i in range(self.group_size))
        while self.n_running < self.concurrency and self.pending:
            g, i = self.pending.popleft()
            (self.groups.get(g) or self.delivered[g]).started += 1
            self.n_running += 1
            self.running.add(1)
            self.started_at[(g, i)] = self.clock()
            self.executor.submit(self._run, g, i)

    def _run(self, g: int, i: int) -> None:
        with self.cv:
            grp = self.groups.get(g) or self.delivered[g]
        try:
            traj: Trajectory | None = self.run_episode(g, i, grp.cancel)
            error = None
        except BaseException as e:  # noqa: BLE001 - a bug, not an episode outcome: raised in next_batch()
            traj, error = None, e
        with self.cv:
            self.n_running -= 1
            self.running.add(-1)
            self.started_at.pop((g, i), None)
            if error is not None:
                self.errors.append(error)
            elif g in self.delivered:  # a late member: its group is in an earlier batch
                assert traj is not None
                traj.late = True
                self.late.append(traj)
                grp.left -= 1
                if grp.left == 0:
                    del self.delivered[g]
            else:
                grp.members[i] = traj
                grp.left -= 1
                grp.done += 1
                if grp.aborted:
                    if grp.left == 0:
                        self.aborted.extend(_excluded(grp))
                        self.groups.pop(g, None)
                elif grp.done == self.ready_at:
                    self.complete.append(g)
            self._pump()
            self.cv.notify_all()

    # -- delivery --------------------------------------------------------------------------
    def _ready(self) -> list[int] | None:
        if self.policy.cutoff:
            # the batch's size is in trajectories (what the trainer asked for): late members
            # finished since the last batch, then ready groups in completion order, as many as
            # it takes; with whole groups that is exactly ``groups_per_batch`` of them. Late
            # members alone may fill it (no group then): only a batch empties ``late``
            want, chosen = self.gpb * self.group_size, []
            have = min(len(self.late), want)
            for g in self.complete:
                if have >= want:
                    break
                chosen.append(g)
                have += self.groups[g].done
            return chosen if have >= want else None
        wanted = set(range(self.base, self.base + self.gpb))
        return sorted(wanted) if wanted <= set(self.complete) else None

    def next_batch(self, timeout: float | None = None) -> Batch:
        asked = self.clock()
        deadline = None if timeout is None else asked + timeout
        with self.cv:
            self.wanted = True
            self._pump()
            while True:
                if self.errors:
                    raise self.errors.pop(0)
                chosen = self._ready()
                if chosen is not None:
                    break
                if self.stopping:
                    raise RuntimeError("the assembler is stopped")
                if deadline is not None and self.clock() > deadline:
                    raise TimeoutError(f"no batch within {timeout:g} s")
                self.cv.wait(1.0)
            t_open, t_close = asked, self.clock()  # the TTB window: the consumer's wait for this batch
            taken = set(chosen)
            self.complete = [g for g in self.complete if g not in taken]
            groups = []
            for g in chosen:
                grp = self.groups.pop(g)
                groups.append([m for m in grp.members if m is not None])
                if grp.left:
                    self.delivered[g] = grp
            want = self.gpb * self.group_size  # late members beyond a batch's worth wait for the next
            late, self.late = self.late[:want], self.late[want:]
            by_group: dict[str, list[Trajectory]] = {}
            for t in late:
                by_group.setdefault(t.group_id, []).append(t)
            groups.extend(by_group.values())
            if not self.policy.cutoff:
                self.base += self.gpb
            if self.policy.cutoff and self.policy.straggler == "abort":
                newest = max(chosen)
                for g, grp in list(self.groups.items()):
                    if g < newest and grp.left > 0 and not grp.aborted:
                        grp.aborted = True
                        grp.cancel.set()
                        self.pending = deque((pg, pi) for pg, pi in self.pending if pg != g)
                        grp.left -= self.group_size - grp.started  # never started: nothing to report
                        if grp.left == 0:
                            self.aborted.extend(_excluded(grp))
                            del self.groups[g]
            aborted, self.aborted = self.aborted, []
            carried = sum(1 for grp in self.groups.values() if grp.started and not grp.aborted)
            backlog = self._backlog(t_close)
            self.wanted = False
            self.batches += 1
            self._pump()
            self.cv.notify_all()
        batch = Batch(self.batches, groups, t_open, t_close, aborted, late=len(late))
        batch.stats = self.window_stats(batch, carried_groups=carried) | backlog
        self.running.forget_before(t_open)
        return batch

    def _backlog(self, now: float) -> dict[str, float]:
        """Slot-time spent on work no batch holds yet, at ``now`` (holding ``cv``): episodes
        still running (those of groups already delivered, the late members, apart) and
        finished members of groups not ready yet. A run that stops here never delivers it;
        a longer one delivers it in its next batches (:func:`slot_time_split`)."""
        late = sum(now - t for (g, _i), t in self.started_at.items() if g in self.delivered)
        running = sum(now - t for t in self.started_at.values())
        finished = sum(work_s(m) for grp in self.groups.values() if not grp.aborted
                       for m in grp.members if m is not None)
        return {"in_flight_s": round(running, 3), "in_flight_late_s": round(late, 3),
                "finished_undelivered_s": round(finished, 3)}

    def window_stats(self, batch: Batch, *, carried_groups: int = 0) -> dict[str, Any]:
        trajs = batch.trajectories
        times = [t.timings.get("episode_s", 0.0) for t in trajs]
        ttb = batch.ttb_s
        c = self.concurrency
        work = sum(work_s(t) for t in trajs)
        return {
            "ttb_s": round(ttb, 4),
            "trajectories": len(trajs),
            "trajectory_s": {"p50": pct(times, 50, digits=4), "p90": pct(times, 90, digits=4),
                             "p99": pct(times, 99, digits=4), "max": round(max(times), 4) if times else None},
            # the share of the window in which a slot sat idle: nothing admissible, the batch waited on stragglers
            "straggler_wait_share": (round(self.running.time_below(batch.t_open, batch.t_close, c) / ttb, 4)
                                     if ttb > 0 else None),
            "slot_idle_share": (round(1 - self.running.integral(batch.t_open, batch.t_close) / (c * ttb), 4)
                                if ttb > 0 else None),
            "work_s": round(work, 3),
            "ideal_s": round(work / c, 3),
            "carried_groups": carried_groups,
            "late_trajectories": batch.late,
            "aborted_episodes": len(batch.aborted),
        }

    def stop(self) -> dict[str, int]:
        """Stop admitting, cancel what runs (episodes end at their next turn boundary) and
        wait for it. Returns what was left undelivered."""
        with self.cv:
            self.stopping = True
            self.pending.clear()
            for grp in [*self.groups.values(), *self.delivered.values()]:
                grp.cancel.set()
            self.cv.notify_all()
        self.executor.shutdown(wait=True)
        with self.cv:
            left = {"groups": sum(1 for g in self.groups.values() if g.started),  # started, never delivered
                    "groups_not_started": sum(1 for g in self.groups.values() if not g.started),
                    "episodes_finished": sum(sum(m is not None for m in g.members) for g in self.groups.values()),
                    "late_undelivered": len(self.late),  # late members finished after the last batch
                    "aborted_unreported": len(self.aborted)}
        return left


def slot_time_split(batches: list[Batch], concurrency: int) -> dict[str, float | None]:
    """Where the slot-time of consecutive batches (``concurrency`` × their TTBs) went, as
    shares: the delivered trajectories' work (1 / TTB-over-ideal), episodes still running when
    the last batch closed (of which late members of delivered groups), finished members of
    groups not yet ready then, and the rest (slots idle, waits for a sandbox, aborted work)."""
    total = concurrency * sum(b.ttb_s for b in batches)
    if not batches or total <= 0:
        return {}
    last = batches[-1].stats
    parts = {"delivered": sum(work_s(t) for b in batches for t in b.trajectories),
             "in_flight_at_end": last.get("in_flight_s", 0.0),
             "of_which_late_members": last.get("in_flight_late_s", 0.0),
             "finished_undelivered_at_end": last.get("finished_undelivered_s", 0.0)}
    rest = total - parts["delivered"] - parts["in_flight_at_end"] - parts["finished_undelivered_at_end"]
    return {k: round(v / total, 4) for k, v in parts.items()} | {"other": round(rest / total, 4)}


def _excluded(grp: _Group) -> list[Trajectory]:
    """The members of an aborted group: none is trained on (the group is incomplete); members
    cancelled mid-episode say so in their outcome, finished ones keep theirs."""
    out = [m for m in grp.members if m is not None]
    for m in out:
        m.excluded = True
        m.exclude_reason = m.exclude_reason or "its group was aborted as a straggler"
    return out

