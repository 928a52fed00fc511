"""The policy against a real vLLM server (CPU build here) serving the tiny local model."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

from envkit.errors import InfraFailure
from rl_runner.policy.client import PolicyClient, SamplingParams
from rl_runner.policy.server import VLLMServer

pytestmark = pytest.mark.vllm


def prompt_ids(tiny: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return list(tok.encode(rendered, add_special_tokens=False))


def test_tiny_model_is_reproducible(tiny: Path, tmp_path: Path):
    from rl_runner.policy.tiny import write_tiny_model

    write_tiny_model(tmp_path / "again")
    digest = lambda p: hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()  # noqa: E731
    assert digest(tiny) == digest(tmp_path / "again")
    import json

    info = json.loads((tiny / "envkit-tiny.json").read_text())
    assert info["head_dim"] >= 64 and info["spec"]["num_hidden_layers"] == 2


def test_token_in_token_out(server: VLLMServer, tiny: Path):
    client = PolicyClient(server.url)
    ids = prompt_ids(tiny, "fix the failing test")
    gen = client.generate(ids, SamplingParams(max_tokens=12, temperature=0.7, seed=3))
    assert len(gen.token_ids) == 12 and len(gen.logprobs) == 12 and gen.finish_reason == "length"
    assert all(lp <= 0 for lp in gen.logprobs)
    assert len(gen.weight_versions) == 12 and all(v for v in gen.weight_versions)
    again = client.generate(ids, SamplingParams(max_tokens=12, temperature=0.7, seed=3))
    assert again.token_ids == gen.token_ids  # same seed, same sample
    client.close()


def test_processed_logprobs_match_the_trainer(server: VLLMServer, tiny: Path):
    """At temperature 0.5, vLLM's log-probs equal log_softmax(logits / T) from transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    client = PolicyClient(server.url)
    ids = prompt_ids(tiny, "close ticket 9")
    temperature = 0.5
    gen = client.generate(ids, SamplingParams(max_tokens=10, temperature=temperature, seed=11))
    model = AutoModelForCausalLM.from_pretrained(tiny, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids + gen.token_ids])).logits[0]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    ours = [logp[len(ids) - 1 + i, t].item() for i, t in enumerate(gen.token_ids)]
    worst = max(abs(a - b) for a, b in zip(ours, gen.logprobs, strict=True))
    assert worst < 1e-3, (worst, ours, gen.logprobs)
    raw = torch.log_softmax(logits.float(), dim=-1)
    assert not all(math.isclose(raw[len(ids) - 1 + i, t].item(), lp, abs_tol=1e-3)
                   for i, (t, lp) in enumerate(zip(gen.token_ids, gen.logprobs, strict=True)))
    client.close()


def test_unreachable_server_is_infra():
    with pytest.raises(InfraFailure) as info:
        PolicyClient("http://127.0.0.1:9", timeout=5).generate([1, 2, 3], SamplingParams(max_tokens=1))
    assert info.value.kind == "inference_unavailable"
