"""The trainer: a transformers causal LM, AdamW, one optimizer step per batch.

Numerics are aligned with the rollout side first (vLLM's log-probs and the trainer's differ even
with identical weights; the recipe measures that mismatch every step, docs/train.md): the trainer runs in
the same dtype as vLLM (float32 on CPU) and computes log-probs *after the same sampling
transform* vLLM applied (``log_softmax(logits / temperature)``; top-p/top-k are not used by
the runner, so vLLM's processed log-probs are exactly that). Raw log-probs at a temperature
other than 1 would make every importance ratio wrong.

Checkpoints hold the model, the optimizer, the step, the data cursor and the RNG states;
``load_checkpoint`` resumes exactly (a test trains 4 steps, or 2 + resume + 2, and compares).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from envkit.errors import UserError
from rl_runner.trainer.losses import ISMode, k3, policy_loss

__all__ = ["Sample", "Trainer", "TrainerConfig", "check_checkpoint"]


def check_checkpoint(ckpt_dir: str | Path) -> Path:
    """``ckpt_dir`` as a path, if it is a folder the trainer wrote; else a clear error."""
    path = Path(ckpt_dir)
    if not (path / "trainer.json").is_file():
        raise UserError(f"`{path}` is not a trainer checkpoint (no trainer.json)",
                        "point at a folder written by the trainer (RUN_DIR/checkpoints/step-N)")
    return path

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TrainerConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    # Adam's epsilon: a gradient much smaller than it moves its weight in proportion, not by a
    # whole lr step (sparse rewards leave most weights with tiny, noisy gradients; docs/train.md)
    eps: float = 1e-8
    grad_clip: float = 1.0
    is_mode: ISMode = "tis"
    is_cap: float = 2.0
    temperature: float = 1.0
    dtype: str = "float32"
    micro_batch: int = 16  # sequences per forward pass
    seed: int = 0
    # β of a KL penalty towards the reference, the starting weights (a frozen copy; 0: no
    # copy is loaded); docs/train.md, "The loss". It anchors what the reward does not ask to change (a tool
    # call's format) where outcome-only advantages push every token of a failed trajectory down.
    kl_coef: float = 0.0
    # The learning rate rises linearly over the first ``lr_warmup`` optimizer updates (1/N, 2/N, …
    # of ``lr``): Adam's first updates move every weight by about the whole rate whatever its
    # gradient, which is what breaks a warmed-up model's tool-call format at a rate that is
    # safe later (docs/train.md). Counted in updates, not steps: a step without a gradient
    # does not update.
    lr_warmup: int = 0


@dataclass
class Sample:
    """One trajectory as the trainer sees it. ``completion`` holds model and observation
    tokens; ``mask`` marks the model's (the only ones with a loss); ``behaviour`` holds
    vLLM's log-probs for those tokens (0 elsewhere)."""

    prompt: list[int]
    completion: list[int]
    mask: list[int]
    behaviour: list[float]
    advantage: float = 0.0
    versions: list[str] = field(default_factory=list)


class Trainer:
    def __init__(self, model_dir: str | Path, config: TrainerConfig | None = None, *, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.config = config or TrainerConfig()
        if self.config.dtype not in _DTYPES:
            raise UserError(f"unknown dtype {self.config.dtype!r}", f"use one of {', '.join(_DTYPES)}")
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        torch.manual_seed(self.config.seed)
        random.seed(self.config.seed)
        loaded: Any = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=_DTYPES[self.config.dtype])
        self.model: Any = loaded.to(self.device)
        self.model.eval()  # no dropout: the trainer's log-probs must be the policy's
        self.reference: Any = None
        if self.config.kl_coef > 0:  # the starting weights, frozen (also on resume: model_dir is the run's start)
            frozen: Any = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=_DTYPES[self.config.dtype])
            self.reference = frozen.to(self.device).eval().requires_grad_(False)
        c = self.config
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=c.lr, weight_decay=c.weight_decay,
                                           betas=c.betas, eps=c.eps)
        self.step = 0
        self.updates = 0  # optimizer updates (steps with a gradient): the rate's warm-up counts these
        self.cursor: dict[str, Any] = {}

    # -- log-probs -----------------------------------------------------------------------

    def _forward(self, samples: list[Sample], model: Any = None) -> list[torch.Tensor]:
        """Log-probs of each sample's completion tokens under the current weights (or
        ``model``'s), after the sampling temperature. Differentiable; callers wrap it in
        no_grad when needed."""
        model = self.model if model is None else model
        out: list[torch.Tensor] = []
        T = self.config.temperature
        for i in range(0, len(samples), self.config.micro_batch):
            chunk = samples[i:i + self.config.micro_batch]
            width = max(len(s.prompt) + len(s.completion) for s in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            attn = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, s in enumerate(chunk):
                seq = s.prompt + s.completion
                ids[j, :len(seq)] = torch.tensor(seq)
                attn[j, :len(seq)] = 1
            logits = model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device)).logits.float()
            for j, s in enumerate(chunk):
                p, n = len(s.prompt), len(s.completion)
                lp = torch.log_softmax(logits[j, p - 1:p + n - 1] / T, dim=-1)
                out.append(lp.gather(1, torch.tensor(s.completion, device=self.device)[:, None])[:, 0])
        return out

    @torch.no_grad()
    def logprobs(self, samples: list[Sample], model: Any = None) -> list[torch.Tensor]:
        """Under the current weights, or ``model``'s (e.g. :attr:`reference`)."""
        return [t.cpu() for t in self._forward(samples, model)]

    @staticmethod
    def divergence(samples: list[Sample], current: list[torch.Tensor]) -> list[dict[str, float]]:
        """Per sample over its model tokens: k3 KL(behaviour || current), max |Δ log-prob|."""
        out = []
        for s, cur in zip(samples, current, strict=True):
            m = torch.tensor(s.mask, dtype=torch.bool)
            if not m.any():
                out.append({"kl": 0.0, "max_abs": 0.0, "tokens": 0})
                continue
            b = torch.tensor(s.behaviour, dtype=torch.float32)[m]
            c = cur.float()[m]
            out.append({"kl": float(k3(b, c).mean()), "max_abs": float((c - b).abs().max()), "tokens": int(m.sum())})
        return out

    # -- one step --------------------------------------------------------------------------

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step on ``samples`` (advantages already set). A batch whose every
        advantage is 0 (each group's rewards equal) has no gradient, and the optimizer is not
        stepped on it: Adam's momentum would keep moving the weights by earlier gradients
        (seen on environments/lookup, 0/1 rewards: zero-gradient steps after one update broke
        the warmed-up model's tool-call format within 5 steps). The step still counts. With
        ``kl_coef`` > 0 the loss adds ``kl_coef`` times the mean k3 of the model tokens: its
        value estimates KL(π || reference), its gradient is in expectation KL(reference || π)'s
        (docs/train.md); it is part of the step, and like the rest is not stepped when every
        advantage is 0."""
        t0 = time.monotonic()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        current = self._forward(samples)
        cur = torch.cat(current)
        beh = torch.cat([torch.tensor(s.behaviour, dtype=torch.float32) for s in samples]).to(cur.device)
        mask = torch.cat([torch.tensor(s.mask, dtype=torch.float32) for s in samples]).to(cur.device)
        adv = torch.cat([torch.full((len(s.completion),), float(s.advantage)) for s in samples]).to(cur.device)
        loss, stats = policy_loss(cur, beh, adv, mask, mode=self.config.is_mode, cap=self.config.is_cap)
        if self.reference is not None:
            with torch.no_grad():
                ref = torch.cat(self._forward(samples, self.reference))
            per_token = k3(cur, ref)  # log r = ref - cur; gradient (1 - ref/π)·∇log π
            kl_mean = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
            loss = loss + self.config.kl_coef * kl_mean
            stats["kl_ref"] = float(kl_mean.detach())
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        updated = bool(adv.any())
        if updated:
            self.updates += 1
            scale = min(1.0, self.updates / self.config.lr_warmup) if self.config.lr_warmup else 1.0
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.lr * scale
            self.optimizer.step()
        self.model.eval()
        self.step += 1
        return {"loss": float(loss.item()), "grad_norm": float(grad_norm), "model_tokens": int(mask.sum()),
                "train_s": round(time.monotonic() - t0, 4), "updated": updated, **stats}

    # -- weights out -----------------------------------------------------------------------

    @property
    def tied(self) -> bool:
        """The model ties its input embedding and output projection (one matrix)."""
        return bool(getattr(self.model.config, "tie_word_embeddings", False))

    def export(self, out_dir: str | Path) -> Path:
        """Write the current weights as a model folder (safetensors + config + tokenizer),
        atomically: a temporary sibling renamed into place. ``out_dir`` must not exist.

        A tied model is written untied, for vLLM to serve: ``lm_head.weight`` a copy of the
        input embedding and ``tie_word_embeddings`` false, the same function. (vLLM's
        in-place reload left a tied output projection stale on CPU: max |Δ log-prob| 0.11
        after one step; separate tensors reload like any other; docs/train.md.)"""
        out = Path(out_dir)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        if self.tied:
            self._export_untied(tmp)
        else:
            self.model.save_pretrained(tmp, safe_serialization=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            if (self.model_dir / name).is_file():
                shutil.copy2(self.model_dir / name, tmp / name)
        os.replace(tmp, out)
        return out

    def _export_untied(self, folder: Path) -> None:
        import copy

        from safetensors.torch import save_file

        folder.mkdir(parents=True)
        state = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
        embed = self.model.get_input_embeddings().weight.detach()
        state["lm_head.weight"] = embed.clone().contiguous()  # its own storage: safetensors keeps no shared tensors
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        config = copy.deepcopy(self.model.config)
        config.tie_word_embeddings = False
        config.save_pretrained(folder)
        if getattr(self.model, "generation_config", None) is not None:
            self.model.generation_config.save_pretrained(folder)

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, ckpt_dir: str | Path) -> Path:
        """Model, optimizer, step, data cursor and RNG states; written to a temporary folder
        and renamed, so a crash mid-write leaves the previous checkpoint intact."""
        from safetensors.torch import save_model

        out = Path(ckpt_dir)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(self.model, str(tmp / "model.safetensors"))  # stores tied (shared) tensors once
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
        (tmp / "trainer.json").write_text(json.dumps({"step": self.step, "updates": self.updates, "cursor": self.cursor,
                                                      "config": asdict(self.config)}, indent=2, sort_keys=True) + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        return out

    def load_checkpoint(self, ckpt_dir: str | Path) -> None:
        from safetensors.torch import load_model

        path = check_checkpoint(ckpt_dir)
        missing, unexpected = load_model(self.model, path / "model.safetensors", strict=False, device=str(self.device))
        if missing or unexpected:
            raise UserError(f"checkpoint `{path}` does not fit this model (missing {sorted(missing)[:3]}, "
                            f"unexpected {sorted(unexpected)[:3]})", "resume with the model the run started from")
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        rng = torch.load(path / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        meta = json.loads((path / "trainer.json").read_text())
        self.step = int(meta["step"])
        self.updates = int(meta.get("updates", self.step))  # older checkpoints: every step counted as an update
        self.cursor = dict(meta.get("cursor") or {})
