"""`envkit model tiny DIR`: a tiny Qwen2-shaped causal LM with a locally trained tokenizer.

No download: the tokenizer (byte-level BPE) is trained here on a small built-in corpus and
the weights are a seeded random initialisation, saved with ``save_pretrained`` (safetensors,
float32). Head dimension 64 (vLLM's CPU attention rejects 16). The same seed gives the same
files. Good for tests and demos of the whole loop, not for solving tasks.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "TinySpec", "write_tiny_model"]

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


def write_tiny_model(out_dir: str | Path, spec: TinySpec | None = None) -> dict[str, Any]:
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
        tie_word_embeddings=True, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    info = {"spec": asdict(spec), "vocab_size": len(tokenizer), "parameters": sum(p.numel() for p in model.parameters()),
            "head_dim": spec.hidden_size // spec.num_attention_heads}
    (out / "envkit-tiny.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info
