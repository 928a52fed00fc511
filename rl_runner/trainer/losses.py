"""The numbers of one training step, as plain functions of tensors.

* Group advantages (GRPO): ``(r - mean(group)) / (std(group) + eps)``; a group of one, or
  one whose rewards are all equal, contributes zero.
* Importance weights against the behaviour policy (the log-probs vLLM reported when it
  sampled): ``w = exp(logp_trainer - logp_behaviour)`` per token, detached. ``tis`` truncates
  at ``cap`` (``min(w, cap)``); ``mis`` masks tokens whose weight exceeds ``cap`` (weight 0)
  and keeps the others' ``w``; ``none`` uses 1.
* Policy loss: ``-sum(w * A * logp) / model_tokens`` over model tokens only, a token-level
  mean over the batch (one optimizer step per batch, so the ratio's gradient is the
  importance-weighted policy gradient).
* KL between behaviour ``mu`` and current ``pi`` from samples of ``mu``: the k3 estimator
  ``(r - 1) - log r`` with ``r = pi/mu``, non-negative, per token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch

__all__ = ["ISMode", "group_advantages", "importance_weights", "k3", "policy_loss"]

ISMode = Literal["tis", "mis", "none"]


def group_advantages(rewards: Sequence[float], groups: Sequence[str], eps: float = 1e-6,
                     earlier: Mapping[str, Sequence[float]] | None = None) -> list[float]:
    """Each reward's advantage within its group: (r - mean) / std over the group's rewards in
    this batch and, for a group some of whose members trained in earlier batches (a partial
    group's late members), over those rewards too (``earlier``). 0 for a group of one, or of
    equal rewards."""
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    earlier = earlier or {}
    for g, members in by_group.items():
        before = [float(r) for r in earlier.get(g, ())]
        if len(members) + len(before) < 2:
            continue
        values = torch.tensor([float(rewards[i]) for i in members] + before, dtype=torch.float64)
        std = float(values.std(unbiased=False))
        if std < eps:
            continue
        mean = float(values.mean())
        for i in members:
            out[i] = (float(rewards[i]) - mean) / (std + eps)
    return out


def importance_weights(current: torch.Tensor, behaviour: torch.Tensor, mode: ISMode, cap: float) -> torch.Tensor:
    """Per-token weights (detached) and nothing else; see the module docstring."""
    w = torch.exp((current.detach() - behaviour).clamp(max=20.0))
    if mode == "tis":
        return w.clamp(max=cap)
    if mode == "mis":
        return torch.where(w <= cap, w, torch.zeros_like(w))
    return torch.ones_like(w)


def policy_loss(current: torch.Tensor, behaviour: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                *, mode: ISMode = "tis", cap: float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    """``current``, ``behaviour``, ``mask``: [tokens] (flattened over the batch);
    ``advantages``: the sequence's advantage repeated per token. Returns the loss and the
    weights' statistics over model tokens."""
    m = mask.to(current.dtype)
    n = m.sum().clamp(min=1.0)
    w = importance_weights(current, behaviour, mode, cap)
    loss = -(w * advantages * current * m).sum() / n
    raw = torch.exp((current.detach() - behaviour).clamp(max=20.0))
    on = m > 0
    stats = {
        "is_weight_mean": float(w[on].mean()) if on.any() else 1.0,
        "is_raw_max": float(raw[on].max()) if on.any() else 1.0,
        "is_clipped_frac": float((raw[on] > cap).float().mean()) if on.any() else 0.0,
    }
    return loss, stats


def k3(behaviour: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(behaviour || current) for tokens sampled from behaviour."""
    log_r = (current - behaviour).clamp(min=-20.0, max=20.0)
    return (torch.exp(log_r) - 1.0 - log_r).clamp(min=0.0)  # >= 0; clamp float noise
