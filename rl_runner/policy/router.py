"""Routing generation requests across vLLM replicas.

``affinity=True`` (session-affine): a session (one episode) is pinned to one replica at its
first request, the replica with the fewest requests in flight then; every later turn of that
episode goes to the same replica, so the episode's growing prefix is found in that replica's
prefix cache. ``affinity=False``: round robin per request, what a plain load balancer does.

The router also measures what batch assembly needs to know about inference: requests in
flight per replica over time (so a window's *inference idle share*, the time an engine had
nothing to do) and prompt tokens served from the prefix cache (vLLM reports them when started
with ``--enable-prompt-tokens-details``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from typing import Any

from envkit.occupancy import Occupancy
from rl_runner.policy.client import Generation, PolicyClient, SamplingParams

__all__ = ["Router"]


class Router:
    def __init__(self, clients: list[PolicyClient], *, affinity: bool = True, max_sessions: int = 100_000,
                 record: bool = False) -> None:
        self.clients = clients
        self.affinity = affinity
        self.max_sessions = max_sessions
        self.in_flight = [Occupancy() for _ in clients]
        self.lock = threading.Lock()
        self.sessions: OrderedDict[str, int] = OrderedDict()
        self.rr = itertools.count()
        self.prompt_tokens = [0] * len(clients)
        self.cached_tokens = [0] * len(clients)
        self.requests = [0] * len(clients)
        # record=True (a rollout worker in another process): each request's (replica, wall-clock
        # start, end, prompt tokens, cached tokens), per session, for the driver's router to absorb.
        self.record = record
        self.events: dict[str | None, list[tuple[int, float, float, int, int]]] = {}

    @property
    def url(self) -> str:
        return self.clients[0].url

    def _pick(self, session: str | None) -> int:
        n = len(self.clients)
        if n == 0:
            raise RuntimeError("this router has no policy replicas (it was made for episodes that do not generate)")
        if n == 1:
            return 0
        with self.lock:
            if not self.affinity or session is None:
                return next(self.rr) % n
            if session in self.sessions:
                self.sessions.move_to_end(session)
                return self.sessions[session]
            k = min(range(n), key=lambda i: (self.in_flight[i].value, self.requests[i]))
            self.sessions[session] = k
            if len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
            return k

    def generate(self, token_ids: list[int], params: SamplingParams, *, session: str | None = None) -> Generation:
        k = self._pick(session)
        self.in_flight[k].add(1)
        t0 = time.time()
        try:
            gen = self.clients[k].generate(token_ids, params)
        finally:
            self.in_flight[k].add(-1)
        with self.lock:
            self.requests[k] += 1
            self.prompt_tokens[k] += len(token_ids)
            self.cached_tokens[k] += gen.cached_tokens or 0
            if self.record:
                self.events.setdefault(session, []).append((k, t0, time.time(), len(token_ids), gen.cached_tokens or 0))
        return gen

    def take_events(self, session: str | None) -> list[tuple[int, float, float, int, int]]:
        """The recorded requests of a session (and forget them)."""
        with self.lock:
            return self.events.pop(session, [])

    def absorb(self, events: list[tuple[int, float, float, int, int]], offset: float) -> None:
        """Count requests another process made (wall-clock times; ``offset`` = that process's
        wall − this process's monotonic clock) as if this router had made them."""
        with self.lock:
            for k, t0, t1, prompt, cached in events:
                self.in_flight[k].add_span(t0 - offset, t1 - offset)
                self.requests[k] += 1
                self.prompt_tokens[k] += prompt
                self.cached_tokens[k] += cached

    def end_session(self, session: str) -> None:
        with self.lock:
            self.sessions.pop(session, None)

    def idle_share(self, t0: float, t1: float) -> float | None:
        """Mean over replicas of the share of [t0, t1] with no request in flight."""
        if t1 <= t0 or not self.in_flight:
            return None
        return sum(o.time_below(t0, t1, 1) for o in self.in_flight) / (len(self.in_flight) * (t1 - t0))

    def cache_stats(self) -> dict[str, Any]:
        with self.lock:
            prompt, cached = sum(self.prompt_tokens), sum(self.cached_tokens)
            return {"replicas": len(self.clients), "affinity": self.affinity, "requests": list(self.requests),
                    "prompt_tokens": prompt, "cached_tokens": cached,
                    "prefix_hit_rate": round(cached / prompt, 4) if prompt else None}

    def close(self) -> None:
        for c in self.clients:
            c.close()
