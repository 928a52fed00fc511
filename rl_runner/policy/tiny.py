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
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl_runner.rollout.chat import CHATML_TEMPLATE, CHATML_TOKENS, HERMES_TEMPLATE, HERMES_TOKENS, ChatFormat

__all__ = ["CODE_WORDS", "LOOKUP_KEYS", "OTHER_WORDS", "TEMPLATES", "WARMUPS", "WARMUP_COMMANDS", "TinySpec",
           "tokenizer_for", "warm_up", "write_tiny_model"]

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
LOOKUP_KEYS = ("code", "color", "animal", "fruit", "city", "planet", "metal", "tree", "river", "bird", "stone",
               "flower", "sport", "tool", "music", "ship")
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


def _lookup_dialogue(fmt: ChatFormat, request: str, key: str, shown: str) -> tuple[list[int], list[int]]:
    conv = fmt.start(request, ["bash"])
    call = fmt.encode(fmt.format_call("bash", {"command": f"./lookup {key}"})) + [fmt.stop_ids[0]]
    observation = conv.observe(call, f"exit 0\n{shown}\n")  # as the runner shows the bash result
    answer = fmt.encode(fmt.format_call("answer", {"text": shown})) + [fmt.stop_ids[0]]
    ids = conv.prompt_ids + call + observation + answer
    mask = [0] * len(conv.prompt_ids) + [1] * len(call) + [0] * len(observation) + [1] * len(answer)
    return ids, mask


def _lookup_examples(fmt: ChatFormat, rng: random.Random) -> tuple[list[int], list[int]]:
    # The word shown is any of the 40, whatever the key: in the environment only `code` (1 in 16
    # lookups) shows a code word, and a warm-up that showed them only there copied the other words
    # (118 of 125 rollouts) but answered `./lookup code` with some other code word (0 of 6)
    request, key, shown = rng.choice(_LOOKUP_REQUESTS), rng.choice(LOOKUP_KEYS), rng.choice(CODE_WORDS + OTHER_WORDS)
    return _lookup_dialogue(fmt, request, key, shown)


# shellcmd: 3e-3 left P(any listed command) at 0.09; lookup: see docs/train.md
WARMUP_LR = {"shellcmd": 1e-3, "lookup": 1.5e-3}
# lookup: the rate decays to 0 over the steps (half a cosine) with gradients clipped at norm 1; at a
# constant 1.5e-3 the held-out loss jumped between steps 1000 and 1250 (seed 0) and the copy was lost
WARMUP_DECAY = {"shellcmd": False, "lookup": True}


def _batch_tensors(rows: list[tuple[list[int], list[int]]], pad: int) -> tuple[Any, Any, Any]:
    """Padded input ids, labels (-100 where the mask is 0) and attention mask for a batch of examples."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids_t = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, mask) in enumerate(rows):
        ids_t[i, :len(ids)] = torch.tensor(ids)
        labels[i, :len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=True)])
        attention[i, :len(ids)] = 1
    return ids_t, labels, attention


def _answer_copied(model: Any, fmt: ChatFormat) -> float:
    """Lookup warm-up: the share of the 20 code words the model copies after ``./lookup code``
    showed them (greedy, teacher-forced: every token of the answer turn predicted), the one skill
    RL cannot teach on this environment (a reward needs it already)."""
    import torch

    hits = 0
    with torch.no_grad():
        for word in CODE_WORDS:
            ids, mask = _lookup_dialogue(fmt, _LOOKUP_REQUESTS[0], "code", word)
            start = max(i for i, m in enumerate(mask) if m == 0) + 1
            predicted = model(input_ids=torch.tensor([ids])).logits[0, start - 1:-1].argmax(-1)
            hits += int(predicted.tolist() == ids[start:])
    return hits / len(CODE_WORDS)


def warm_up(model: Any, tokenizer: Any, steps: int, *, task: str = "shellcmd", seed: int = 0, batch: int = 16,
            lr: float | None = None, check_every: int = 250, held_out: int = 64) -> dict[str, Any]:
    """Supervised warm-up (see the module docstring) on the model's own chat format.

    Every ``check_every`` steps (and at the end) the loss on ``held_out`` examples drawn apart from
    the training ones is measured, and the weights with the lowest one are what the model keeps:
    at a constant learning rate the loss can jump late and take a learnt skill with it (lookup,
    seed 0, lr 1.5e-3: the answer copied the observation in 61 of 64 held-out examples at step
    1000 and in 4 at step 1250, loss 0.07 -> 0.14), so the number of steps alone does not decide
    what the model can do. Returns ``{"loss"`` (the kept weights' held-out loss), ``"train_loss"``
    (the last batch's), ``"best_step"``, ``"checks"`` ([step, held-out loss] each) and, for
    lookup, ``"answer_copied"`` (see :func:`_answer_copied`)``}``."""
    import torch

    lr = lr or WARMUP_LR[task]
    rng = random.Random(seed)
    fmt = ChatFormat(tokenizer)
    make = _lookup_examples if task == "lookup" else _shellcmd_examples
    held_rng = random.Random(f"held-out {seed}")  # its own stream: the training examples are those of rng alone
    held = [make(fmt, held_rng) for _ in range(held_out)]
    pad = int(tokenizer.pad_token_id)
    held_batch = _batch_tensors(held, pad)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    decay = WARMUP_DECAY[task]
    schedule = (torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 0.5 * (1 + math.cos(math.pi * i / steps)))
                if decay else None)
    best: tuple[float, int, dict[str, Any]] | None = None
    checks: list[list[float]] = []
    train_loss = float("nan")

    def check(step: int) -> None:
        nonlocal best
        model.eval()
        with torch.no_grad():
            ids_t, labels, attention = held_batch
            value = float(model(input_ids=ids_t, attention_mask=attention, labels=labels).loss.item())
        model.train()
        checks.append([step, round(value, 4)])
        if best is None or value < best[0]:
            best = (value, step, {k: v.detach().clone() for k, v in model.state_dict().items()})

    model.train()
    for step in range(1, steps + 1):
        ids_t, labels, attention = _batch_tensors([make(fmt, rng) for _ in range(batch)], pad)
        loss = model(input_ids=ids_t, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        if decay:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        train_loss = float(loss.item())
        if step % check_every == 0 or step == steps:
            check(step)
    model.eval()
    out: dict[str, Any] = {"train_loss": train_loss, "checks": checks}
    if best is not None:
        model.load_state_dict(best[2])
        out.update(loss=best[0], best_step=best[1])
    if task == "lookup":
        out["answer_copied"] = _answer_copied(model, fmt)
    return out


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
    warmed = warm_up(model, tokenizer, warmup_steps, task=warmup, seed=spec.seed) if warmup_steps else {}
    model.save_pretrained(out, safe_serialization=True)
    info = {"spec": asdict(spec), "warmup_steps": warmup_steps, "warmup": warmup if warmup_steps else None,
            "warmup_loss": warmed.get("loss"), "warmup_best_step": warmed.get("best_step"),
            "warmup_checks": warmed.get("checks"), "warmup_answer_copied": warmed.get("answer_copied"),
            "vocab_size": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "head_dim": spec.hidden_size // spec.num_attention_heads}
    (out / "envkit-tiny.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info
