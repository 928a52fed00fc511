"""Weight publication into a running vLLM through its RL endpoints (docs/train.md).

For version ``v``: the trainer writes ``ROOT/v{v:06d}`` (a new folder every time, renamed into
place when complete), the folder is checked against the served model's tensor names and
shapes (a failed reload is not rolled back by vLLM and can kill the engine), then::

    POST /pause?mode=keep                      in-flight requests are frozen, not dropped
    POST /collective_rpc  reload_weights       from the new folder
    POST /reset_prefix_cache?reset_running_requests=true
                                               no KV computed with old weights is reused:
                                               cached prefixes are dropped and frozen
                                               requests are preempted, so their KV is
                                               recomputed with the new weights on resume
    POST /update_weight_version {"new_version": "v"}
    POST /resume

With several vLLM replicas the folder is written and checked once, then every replica runs
that sequence at the same time (all of them pause, so no replica serves the old version while
another serves the new one for longer than the reload); each call's time is the slowest
replica's, and ``served_versions`` lists what each replica reports afterwards.

Every call's time is measured; ``publish`` returns them. Old folders beyond ``keep`` are
removed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from envkit.errors import InfraFailure

__all__ = ["PublishResult", "WeightPublisher", "safetensors_shapes"]


@dataclass
class PublishResult:
    version: str
    path: str
    write_s: float
    pause_s: float
    reload_s: float
    reset_cache_s: float
    resume_s: float
    total_s: float
    served_version: str  # what every replica reports, or "mixed" when they differ
    served_versions: list[str]  # per replica

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def safetensors_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from the safetensors headers of a model folder."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for name in fh.keys():
                shapes[name] = tuple(fh.get_slice(name).get_shape())
    return shapes


class WeightPublisher:
    def __init__(self, urls: str | list[str], root: str | Path, *, reference: str | Path, keep: int = 3,
                 timeout: float = 300) -> None:
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("WeightPublisher needs at least one vLLM URL")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.expected = safetensors_shapes(Path(reference))
        self.keep = keep
        self.clients = [httpx.Client(base_url=u, timeout=timeout) for u in self.urls]
        self.history: list[PublishResult] = []

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def _post(self, http: httpx.Client, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            r = http.post(path, **kwargs)
        except httpx.TransportError as e:
            raise InfraFailure("weight_publication_failed", f"vLLM at {http.base_url} does not answer {path}",
                               error=str(e)[:300]) from None
        if r.status_code != 200:
            raise InfraFailure("weight_publication_failed",
                               f"vLLM at {http.base_url} answered {r.status_code} to {path}", body=r.text[:500])
        try:
            data = r.json()
        except ValueError:
            data = {}
        return data if isinstance(data, dict) else {"result": data}

    def served_versions(self) -> list[str]:
        out = []
        for http in self.clients:
            r = http.get("/weight_info")
            r.raise_for_status()
            out.append(str(r.json().get("weight_version")))
        return out

    def served_version(self) -> str:
        """The version every replica serves, or "mixed"."""
        versions = set(self.served_versions())
        return versions.pop() if len(versions) == 1 else "mixed"

    def tag(self, version: str) -> None:
        """Name the weights the replicas serve now (e.g. "0" for the starting model)."""
        for http in self.clients:
            self._post(http, "/update_weight_version", json={"new_version": version})

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def check(self, folder: Path) -> None:
        got = safetensors_shapes(folder)
        if got != self.expected:
            missing = sorted(set(self.expected) - set(got))[:3]
            extra = sorted(set(got) - set(self.expected))[:3]
            wrong = sorted(k for k in set(got) & set(self.expected) if got[k] != self.expected[k])[:3]
            raise InfraFailure("weight_publication_failed",
                               f"refusing to load {folder}: it does not match the served model",
                               missing=missing, unexpected=extra, wrong_shape=wrong)

    def publish(self, write: Callable[[Path], Any], version: int, *, name: str | None = None) -> PublishResult:
        """``write(folder)`` writes the weights (e.g. ``trainer.export``); then every replica
        loads them. ``name`` overrides the folder name (a resumed run republishes its
        checkpoint's version)."""
        t0 = time.monotonic()
        folder = self.root / name if name else self.folder(version)
        if folder.exists():
            raise InfraFailure("weight_publication_failed", f"{folder} already exists; every version gets a new folder")
        write(folder)
        self.check(folder)
        t1 = time.monotonic()
        if len(self.clients) == 1:
            times = [self._load(self.clients[0], folder, version)]
        else:
            with ThreadPoolExecutor(max_workers=len(self.clients)) as pool:
                times = list(pool.map(lambda http: self._load(http, folder, version), self.clients))
        t2 = time.monotonic()
        served = self.served_versions()
        slowest = {k: round(max(t[k] for t in times), 4) for k in ("pause_s", "reload_s", "reset_cache_s", "resume_s")}
        result = PublishResult(version=str(version), path=str(folder), write_s=round(t1 - t0, 4), **slowest,
                               total_s=round(t2 - t0, 4),
                               served_version=served[0] if len(set(served)) == 1 else "mixed", served_versions=served)
        self.history.append(result)
        self._prune(version)
        return result

    def _load(self, http: httpx.Client, folder: Path, version: int) -> dict[str, float]:
        """One replica: pause (keep) → reload → reset the prefix cache → version → resume."""
        t1 = time.monotonic()
        self._post(http, "/pause", params={"mode": "keep"})
        t2 = time.monotonic()
        t3 = t4 = t2
        try:
            self._post(http, "/collective_rpc",
                       json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
            t3 = time.monotonic()
            data = self._post(http, "/reset_prefix_cache", params={"reset_running_requests": "true"})
            if data.get("success") is False:
                raise InfraFailure("weight_publication_failed",
                                   f"vLLM at {http.base_url} could not reset its prefix cache")
            t4 = time.monotonic()
            self._post(http, "/update_weight_version", json={"new_version": str(version)})
        finally:
            t5 = time.monotonic()
            self._post(http, "/resume")
        t6 = time.monotonic()
        return {"pause_s": t2 - t1, "reload_s": t3 - t2, "reset_cache_s": t4 - t3, "resume_s": t6 - t5}

    def _prune(self, version: int) -> None:
        for old in sorted(self.root.glob("v*")):
            try:
                n = int(old.name[1:])
            except ValueError:
                continue
            if n <= version - self.keep:
                shutil.rmtree(old, ignore_errors=True)
