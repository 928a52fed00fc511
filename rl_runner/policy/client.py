"""Token-in/token-out generation against vLLM's ``/inference/v1/generate``.

Token ids go in (the runner tokenises and applies the chat template once, so multi-turn
trajectories are never re-tokenised); sampled token ids, their log-probs (processed: after
the sampling transforms) and the weight-version spans come out. Transport failures and 5xx
answers are the infra failure ``inference_unavailable``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from envkit.errors import InfraFailure

__all__ = ["Generation", "PolicyClient", "SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # generate max_tokens whatever the model says (benchmarks, tests)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                               "logprobs": 0}
        if self.seed is not None:
            out["seed"] = self.seed
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.ignore_eos:
            out["ignore_eos"] = True
        return out


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[str]  # one per generated token
    finish_reason: str | None
    raw_spans: list[dict[str, Any]] = field(default_factory=list)
    cached_tokens: int | None = None  # prompt tokens found in vLLM's prefix cache (--enable-prompt-tokens-details)


class PolicyClient:
    def __init__(self, url: str, *, timeout: float = 300, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self.http.close()

    def generate(self, token_ids: list[int], params: SamplingParams, *, session: str | None = None) -> Generation:
        """``session`` is for routers (see :mod:`rl_runner.policy.router`); one server ignores it."""
        body = {"token_ids": token_ids, "sampling_params": params.to_json(), "output_mode": "tokens"}
        try:
            r = self.http.post("/inference/v1/generate", json=body)
        except httpx.TransportError as e:
            raise InfraFailure("inference_unavailable", f"the inference server at {self.url} does not answer",
                               error=f"{type(e).__name__}: {e}"[:300]) from None
        if r.status_code >= 500:
            raise InfraFailure("inference_unavailable", f"the inference server answered {r.status_code}",
                               body=r.text[:500])
        if r.status_code >= 400:
            raise ValueError(f"the inference server refused the request ({r.status_code}): {r.text[:500]}")
        data = r.json()
        choice = data["choices"][0]
        ids = list(choice.get("token_ids") or [])
        content = ((choice.get("logprobs") or {}).get("content")) or []
        logprobs = [float(c["logprob"]) for c in content]
        spans = choice.get("weight_versions") or []
        versions = [""] * len(ids)
        for span in spans:
            for i in range(int(span["start"]), min(int(span["end"]), len(ids))):
                versions[i] = str(span["version"])
        details = ((data.get("usage") or {}).get("prompt_tokens_details")) or {}
        cached = details.get("cached_tokens")
        return Generation(token_ids=ids, logprobs=logprobs, weight_versions=versions,
                          finish_reason=choice.get("finish_reason"), raw_spans=spans,
                          cached_tokens=int(cached) if cached is not None else None)
