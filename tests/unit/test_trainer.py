"""The trainer's numbers: advantages, importance weights, k3, exact resume, and the
importance correction reducing the bias of an injected rollout/trainer mismatch."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rl_runner.policy.tiny import TinySpec, write_tiny_model  # noqa: E402
from rl_runner.trainer.losses import group_advantages, importance_weights, k3, policy_loss  # noqa: E402
from rl_runner.trainer.trainer import Sample, Trainer, TrainerConfig  # noqa: E402


def test_group_advantages_are_normalised_per_group():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5, 0.2], ["a", "a", "b", "b", "c"])
    assert adv[0] == pytest.approx(1.0, abs=1e-5) and adv[1] == pytest.approx(-1.0, abs=1e-5)
    assert adv[2:] == [0.0, 0.0, 0.0]  # equal rewards, and a group of one, carry no signal


def test_late_members_are_scored_against_the_rewards_their_group_trained_on_earlier():
    # group a: 1 and 0 trained in an earlier batch; its late member (1) is scored against all three
    adv = group_advantages([1.0, 0.3], ["a", "c"], earlier={"a": [1.0, 0.0]})
    mean, std = 2 / 3, (2 / 9) ** 0.5
    assert adv[0] == pytest.approx((1 - mean) / std, abs=1e-4)
    assert adv[1] == 0.0  # alone, with nothing earlier

    from rl_runner.recipes.config import Recipe
    from rl_runner.recipes.steps import admit, with_advantages
    from rl_runner.rollout.trajectory import Trajectory
    from rl_runner.trainer.trainer import Sample

    late = Trajectory(env_ref="e", image_digest="", task_id="t", seed=1, group_id="a", reward=0.0, late=True)
    alone = Trajectory(env_ref="e", image_digest="", task_id="t", seed=2, group_id="b", reward=1.0)
    recipe = Recipe.model_validate({"model": "m", "envs": [{"ref": "e"}], "mode": "async"})
    earlier = {"a": [1.0, 1.0, 0.0]}
    ok = admit([late, alone], [{"kl": 0.0}, {"kl": 0.0}], recipe, earlier)
    assert ok == [True, False]  # the late member trains beside its group's earlier members; a lone one does not
    samples = [Sample([1], [2], [1], [0.0]), Sample([1], [2], [1], [0.0])]
    batch = with_advantages(samples, [late, alone], ok, earlier)
    assert len(batch) == 1 and batch[0].advantage < 0  # 0 against 1, 1, 0
    assert earlier["a"] == [1.0, 1.0, 0.0, 0.0]  # and the next late member sees it


def test_importance_weights_truncate_or_mask():
    cur = torch.log(torch.tensor([0.5, 0.9, 0.1]))
    beh = torch.log(torch.tensor([0.5, 0.3, 0.4]))  # raw ratios 1, 3, 0.25
    assert importance_weights(cur, beh, "tis", 2.0).tolist() == pytest.approx([1.0, 2.0, 0.25])
    assert importance_weights(cur, beh, "mis", 2.0).tolist() == pytest.approx([1.0, 0.0, 0.25])
    assert importance_weights(cur, beh, "none", 2.0).tolist() == [1.0, 1.0, 1.0]


def test_k3_is_zero_at_equality_and_positive_otherwise():
    a = torch.log(torch.tensor([0.2, 0.5, 0.3]))
    assert k3(a, a).abs().max() == 0
    b = torch.log(torch.tensor([0.3, 0.4, 0.3]))
    assert (k3(a, b) >= 0).all() and k3(a, b).sum() > 0


def test_policy_loss_counts_model_tokens_only():
    cur = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    beh = cur.detach().clone()
    loss, stats = policy_loss(cur, beh, torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1.0, 0.0, 1.0]))
    loss.backward()
    assert loss.item() == pytest.approx(2.0)  # -(-1 + -3) / 2 model tokens
    assert cur.grad.tolist() == pytest.approx([-0.5, 0.0, -0.5])
    assert stats["is_weight_mean"] == pytest.approx(1.0)


def test_importance_correction_reduces_the_bias_of_an_injected_mismatch():
    """A 6-armed bandit. The trainer's policy is softmax(theta); the rollout engine sampled
    from a perturbed softmax(theta + delta) (the injected mismatch). The true policy gradient
    of E_pi[R] is known in closed form; the loss's gradient from 200k engine samples is
    compared with it without correction, with TIS and with MIS."""
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=gen)
    delta = 0.6 * torch.randn(6, generator=gen)
    reward = torch.tensor([1.0, 0.0, 0.3, 0.8, 0.1, 0.5])
    pi = torch.softmax(theta, 0)
    mu = torch.softmax(theta + delta, 0)
    # d/dtheta sum_a pi(a) R(a) = pi * (R - E_pi R)
    true_grad = pi * (reward - (pi * reward).sum())
    actions = torch.multinomial(mu, 200_000, replacement=True, generator=gen)

    def estimate(mode: str) -> torch.Tensor:
        th = theta.clone().requires_grad_(True)
        logp = torch.log_softmax(th, 0)[actions]
        loss, _ = policy_loss(logp, torch.log(mu)[actions], reward[actions], torch.ones_like(logp), mode=mode, cap=2.0)
        loss.backward()
        return -th.grad

    err = {m: float((estimate(m) - true_grad).norm()) for m in ("none", "tis", "mis")}
    assert err["none"] > 0.02  # the mismatch biases the uncorrected gradient
    assert err["tis"] < 0.35 * err["none"], err
    assert err["mis"] < err["none"], err


def _samples(step: int, n: int = 4) -> list[Sample]:
    """A deterministic data stream indexed by the cursor (the step)."""
    rng = random.Random(1000 + step)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, 500) for _ in range(6)]
        completion = [rng.randrange(3, 500) for _ in range(5)]
        out.append(Sample(prompt, completion, [1, 1, 0, 1, 1], [-6.0, -6.5, 0.0, -6.2, -5.9],
                          advantage=(-1) ** i * 0.5))
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("trainer") / "tiny"
    write_tiny_model(folder, TinySpec(seed=3))
    return folder


def _train(trainer: Trainer, steps: int) -> None:
    for _ in range(steps):
        cursor = int(trainer.cursor.get("step", 0))
        trainer.train_step(_samples(cursor))
        trainer.cursor = {"step": cursor + 1}


def test_every_parameter_changes_after_a_step(model_dir: Path):
    t = Trainer(model_dir, TrainerConfig(lr=1e-2))
    before = {k: v.clone() for k, v in t.model.named_parameters()}
    stats = t.train_step(_samples(0))
    assert stats["model_tokens"] == 16
    unchanged = [k for k, v in t.model.named_parameters() if torch.equal(v, before[k])]
    assert unchanged == []


def test_a_batch_without_advantage_moves_no_weight_and_keeps_the_optimizer_state(model_dir: Path):
    t = Trainer(model_dir, TrainerConfig(lr=1e-2))
    assert t.train_step(_samples(0))["updated"] is True  # Adam now holds momentum
    before = {k: v.clone() for k, v in t.model.named_parameters()}
    state = {k: {n: x.clone() for n, x in v.items() if torch.is_tensor(x)} for k, v in t.optimizer.state.items()}
    flat = _samples(1)
    for s in flat:
        s.advantage = 0.0  # every group's rewards equal: nothing to learn
    stats = t.train_step(flat)
    assert stats["updated"] is False and stats["grad_norm"] == 0.0 and t.step == 2  # the step counts
    assert all(torch.equal(v, before[k]) for k, v in t.model.named_parameters())  # no momentum drift
    assert all(torch.equal(x, state[k][n]) for k, v in t.optimizer.state.items() for n, x in v.items()
               if torch.is_tensor(x))


def test_the_reference_penalty_holds_the_policy_near_its_start(model_dir: Path):
    """trainer.kl_coef: the same 20 steps (lr 1e-2) with and without a KL penalty towards the
    starting weights; with it the policy ends far nearer its start (measured here: KL 0.50
    against 21.7 on tokens neither trained on), and the reference itself never moves."""
    free = Trainer(model_dir, TrainerConfig(lr=1e-2))
    held = Trainer(model_dir, TrainerConfig(lr=1e-2, kl_coef=1.0))
    assert free.reference is None  # no copy of the weights without the penalty
    start = {k: v.clone() for k, v in held.reference.named_parameters()}
    assert held.train_step(_samples(0))["kl_ref"] == 0.0  # step 1: the policy is the reference
    free.train_step(_samples(0))
    for step in range(1, 20):
        free.train_step(_samples(step))
        last = held.train_step(_samples(step))
    assert last["kl_ref"] > 0

    probe = _samples(99, n=8)
    reference = torch.cat(held.logprobs(probe, held.reference))

    def drift(t: Trainer) -> float:
        return float(k3(torch.cat(t.logprobs(probe)), reference).mean())

    assert drift(held) < 0.1 * drift(free), (drift(held), drift(free))
    assert all(torch.equal(v, start[k]) for k, v in held.reference.named_parameters())


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_resume_is_exact(model_dir: Path, tmp_path: Path, kl_coef: float):
    """With the reference penalty too: a resumed trainer's reference is the run's starting
    weights, not the checkpoint's."""
    config = TrainerConfig(lr=3e-3, is_mode="tis", kl_coef=kl_coef)
    straight = Trainer(model_dir, config)
    _train(straight, 4)

    first = Trainer(model_dir, config)
    _train(first, 2)
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = Trainer(model_dir, config)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.step == 2 and resumed.cursor == {"step": 2}
    _train(resumed, 2)

    assert resumed.step == straight.step == 4
    a = {k: v.detach() for k, v in straight.model.named_parameters()}
    b = {k: v.detach() for k, v in resumed.model.named_parameters()}
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-6, worst
    # and the run actually moved the weights (the comparison is not between two untouched models)
    fresh = {k: v.detach() for k, v in Trainer(model_dir, config).model.named_parameters()}
    assert max(float((a[k] - fresh[k]).abs().max()) for k in a) > 1e-3


def test_loading_something_else_is_a_clear_error(model_dir: Path, tmp_path: Path):
    from envkit.errors import UserError

    with pytest.raises(UserError, match="not a trainer checkpoint"):
        Trainer(model_dir).load_checkpoint(tmp_path)


def test_the_warm_up_keeps_its_best_held_out_weights():
    """A loss that jumps late does not decide the model: the weights kept are those of the check
    with the lowest held-out loss (here the learning rate is far too high, so the loss rises
    after the first steps), and that loss is what the kept model has."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rl_runner.policy.tiny import _batch_tensors, _shellcmd_examples, tokenizer_for, warm_up
    from rl_runner.rollout.chat import ChatFormat

    tok = tokenizer_for(TinySpec(seed=1))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1, pad_token_id=tok.pad_token_id))
    out = warm_up(model, tok, 12, task="shellcmd", seed=1, batch=4, lr=LR_FAR_TOO_HIGH, check_every=2, held_out=8)
    losses = {int(s): v for s, v in out["checks"]}
    assert sorted(losses) == [2, 4, 6, 8, 10, 12]
    assert out["best_step"] == min(losses, key=losses.__getitem__) and losses[12] > losses[out["best_step"]], out
    rng, fmt = random.Random("held-out 1"), ChatFormat(tok)  # the held-out examples, drawn as warm_up draws them
    ids, labels, attention = _batch_tensors([_shellcmd_examples(fmt, rng) for _ in range(8)], int(tok.pad_token_id))
    with torch.no_grad():
        kept = float(model(input_ids=ids, attention_mask=attention, labels=labels).loss)
    assert (kept == pytest.approx(out["loss"], abs=1e-3)
            and out["loss"] == pytest.approx(losses[out["best_step"]], abs=1e-4))


LR_FAR_TOO_HIGH = 0.03  # 12 steps: held-out loss 5.43, 4.06, 3.91, then 4.57, 4.44, 4.50
