"""`envkit model tiny DIR`: a tiny Qwen2-shaped causal LM with a locally trained tokenizer.

No download: the tokenizer (byte-level BPE) is trained here on a small built-in corpus and
the weights are a seeded random initialisation, saved with ``save_pretrained`` (safetensors,
float32). Head dimension 64 (vLLM's CPU attention rejects 16). The same seed gives the same
files. Good for tests and demos of the whole loop, not for solving tasks.

``template``: the chat template and its special tokens (:mod:`rl_runner.rollout.chat`):
``chatml`` (no tools in the template: tool calls in envkit's ``<tool>`` format) or ``hermes``
(a Qwen2.5/Hermes-style template with tools and tool-call tags as special tokens).
``tie_word_embeddings``: one matrix for the input embedding and the output projection (the
common small-model layout; docs/train.md says how publication keeps it exact).

``warmup_steps > 0`` adds a short supervised warm-up (the "SFT" stage before RL), in the
model's own chat format, for one of two toy environments:

* ``shellcmd``: the model learns to answer with one shell command from ``WARMUP_COMMANDS``,
  chosen without regard to the request (the generic requests carry no hint): RL has to teach
  it *which* one (``environments/shellcmd``).
* ``lookup``: the model learns the two turns of ``environments/lookup``: look up one of its
  16 keys (``./lookup KEY``), chosen without regard to the task, then answer with what it
  printed. So it starts near 1/16 and RL has to teach it *which* key holds the code word; the
  word itself changes with every seed, so the answer has to come from the observation.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl_runner.rollout.chat import CHATML_TEMPLATE, CHATML_TOKENS, HERMES_TEMPLATE, HERMES_TOKENS, ChatFormat

__all__ = ["CODE_WORDS", "LOOKUP_KEYS", "OTHER_WORDS", "TEMPLATES", "WARMUPS", "WARMUP_COMMANDS", "TinySpec", "tokenizer_for",
           "warm_up", "write_tiny_model"]

TEMPLATES = {"chatml": (CHATML_TEMPLATE, CHATML_TOKENS), "hermes": (HERMES_TEMPLATE, HERMES_TOKENS)}
WARMUPS = ("shellcmd", "lookup")

WARMUP_COMMANDS = (
    "ls", "ls -la", "pwd", "whoami", "date", "uptime", "git status", "git log", "git diff --stat", "cat README.md",
    "python3 -m pytest -q", "echo hello", "uname -a", "df -h", "ps aux", "env", "id", "hostname", "true", "make test",
    "head README.md", "wc -l README.md", "tail -n 5 README.md", "du -sh .",
)
_WARMUP_REQUESTS = ("Run a command.", "Any command will do.", "Go.", "Your turn.", "Reply with a command.")
# environments/lookup's words and keys (its repo's `lookup` script and its verifier hold the same)
CODE_WORDS = ("amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris", "jade", "kelp", "lotus",
              "maple", "nectar", "onyx", "pearl", "quartz", "raven", "sable", "tulip")
OTHER_WORDS = ("red", "blue", "green", "gold", "silver", "black", "white", "pink", "gray", "brown", "orange", "violet",
               "lime", "navy", "teal", "plum", "rose", "sand", "snow", "coal")
LOOKUP_KEYS = ("code", "color", "animal", "fruit", "city", "planet", "metal", "tree", "river", "bird", "stone", "flower",
               "sport", "tool", "music", "ship")
_LOOKUP_REQUESTS = ("What is the code word? Look it up, then answer with it.",
                    "Find the code word and answer with it.",
                    "Answer with the code word (look it up first).")

_CORPUS = [
    "You are an agent in a sandbox. Use the tools to solve the task, then stop.",
    '<tool>{"name": "bash", "arguments": {"command": "ls -la"}}</tool>',
    '<tool>{"name": "http", "arguments": {"method": "GET", "path": "/orders?status=pending"}}</tool>',
    '<tool>{"name": "browser", "arguments": {"action": "click", "id": 3}}</tool>',
    '<tool>{"name": "answer", "arguments": {"text": "42"}}</tool>',
    '{"name": "bash", "arguments": {"command": "./codeword"}}',
    '{"type": "function", "function": {"name": "answer", "description": "Give the final answer", "parameters": {}}}',
    "def median(values):\n    ordered = sorted(values)\n    return ordered[len(ordered) // 2]\n",
    "git diff --stat; python3 -m pytest -q; cat README.md; sed -i 's/a/b/' kit/stats.py",
    "The refund was approved. The ticket is closed. Order 1030 was delivered.",
    "exit code 0 stdout stderr Traceback error warning passed failed",
    *(line for w in CODE_WORDS + OTHER_WORDS for line in (f"exit 0\n{w}\n", f'{{"text": "{w}"}}') * 3),
    *(f'{{"command": "./lookup {k}"}}' for k in LOOKUP_KEYS),
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
    template: str = "chatml"  # chatml | hermes
    tie_word_embeddings: bool = False


def tokenizer_for(spec: TinySpec) -> Any:
    """The tiny model's tokenizer: byte-level BPE trained on the corpus, with the template's
    special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    template, special = TEMPLATES[spec.template]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=special[2], pad_token=special[0],
                                   bos_token=None, unk_token=None, additional_special_tokens=special[3:] or None)
    fast.chat_template = template
    return fast


def _shellcmd_examples(fmt: ChatFormat, rng: random.Random) -> tuple[list[int], list[int]]:
    conv = fmt.start(rng.choice(_WARMUP_REQUESTS), [])
    reply = fmt.encode(rng.choice(WARMUP_COMMANDS)) + [fmt.stop_ids[0]]
    return conv.prompt_ids + reply, [0] * len(conv.prompt_ids) + [1] * len(reply)


def _lookup_examples(fmt: ChatFormat, rng: random.Random) -> tuple[list[int], list[int]]:
    conv = fmt.start(rng.choice(_LOOKUP_REQUESTS), ["bash"])
    key = rng.choice(LOOKUP_KEYS)
    shown = rng.choice(CODE_WORDS if key == "code" else OTHER_WORDS)
    call = fmt.encode(fmt.format_call("bash", {"command": f"./lookup {key}"})) + [fmt.stop_ids[0]]
    observation = conv.observe(call, f"exit 0\n{shown}\n")  # as the runner shows the bash result
    answer = fmt.encode(fmt.format_call("answer", {"text": shown})) + [fmt.stop_ids[0]]
    ids = conv.prompt_ids + call + observation + answer
    mask = [0] * len(conv.prompt_ids) + [1] * len(call) + [0] * len(observation) + [1] * len(answer)
    return ids, mask


WARMUP_LR = {"shellcmd": 1e-3, "lookup": 1.5e-3}  # shellcmd: 3e-3 left P(any listed command) at 0.09; lookup: see docs/train.md


def warm_up(model: Any, tokenizer: Any, steps: int, *, task: str = "shellcmd", seed: int = 0, batch: int = 16,
            lr: float | None = None) -> float:
    """Supervised warm-up (see the module docstring) on the model's own chat format; returns
    the last batch's loss."""
    import torch

    lr = lr or WARMUP_LR[task]
    rng = random.Random(seed)
    fmt = ChatFormat(tokenizer)
    make = _lookup_examples if task == "lookup" else _shellcmd_examples
    pad = int(tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        rows = [make(fmt, rng) for _ in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        ids_t = torch.full((batch, width), pad, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for i, (ids, mask) in enumerate(rows):
            ids_t[i, :len(ids)] = torch.tensor(ids)
            labels[i, :len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=True)])
            attention[i, :len(ids)] = 1
        loss = model(input_ids=ids_t, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = float(loss.item())
    model.eval()
    return loss_value


def write_tiny_model(out_dir: str | Path, spec: TinySpec | None = None, *, warmup_steps: int = 0,
                     warmup: str = "shellcmd") -> dict[str, Any]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    spec = spec or TinySpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_for(spec)
    tokenizer.save_pretrained(out)
    end = ChatFormat(tokenizer).stop_ids[0]
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings, eos_token_id=end, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    warmup_loss = warm_up(model, tokenizer, warmup_steps, task=warmup, seed=spec.seed) if warmup_steps else None
    model.save_pretrained(out, safe_serialization=True)
    info = {"spec": asdict(spec), "warmup_steps": warmup_steps, "warmup": warmup if warmup_steps else None,
            "warmup_loss": warmup_loss, "vocab_size": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "head_dim": spec.hidden_size // spec.num_attention_heads}
    (out / "envkit-tiny.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info
