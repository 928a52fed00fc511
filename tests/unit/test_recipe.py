"""Recipe files: strict validation with every problem at once, key=value overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("yaml")

from envkit.errors import UserError  # noqa: E402
from rl_runner.recipes.config import load_recipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_bundled_recipe_loads_and_overrides_apply():
    r = load_recipe(ROOT / "rl_runner/recipes/shellcmd.yaml",
                    ["steps=5", "mode=async", "trainer.lr=3e-3", "async.kl_max=0.1"])
    assert (r.steps, r.mode, r.trainer.lr, r.async_.kl_max) == (5, "async", 3e-3, 0.1)
    assert r.envs[0].tasks == ["system-info"]
    assert r.batch_size == 64


def test_every_problem_is_reported_at_once(tmp_path: Path):
    bad = tmp_path / "r.yaml"
    bad.write_text("model: m\nenvs: []\nmode: fast\nsteps: 0\ntrainer: {lr: -1, is_mode: maybe}\nbogus: 1\n")
    with pytest.raises(UserError) as e:
        load_recipe(bad)
    text = str(e.value)
    for field in ("envs", "mode", "steps", "trainer.lr", "trainer.is_mode", "bogus"):
        assert field in text, (field, text)
    assert "docs/train.md" in text


@pytest.mark.parametrize("content,override,message", [
    ("model: [unclosed\n", None, "not valid YAML"),
    ("- a\n- b\n", None, "must be a mapping"),
    ("model: m\nenvs: [e]\n", "steps", "is not key=value"),
    ("model: m\nenvs: [e]\nsteps: 3\n", "steps.x=1", "is not a section"),
])
def test_bad_files_and_overrides_say_what_to_do(tmp_path: Path, content, override, message):
    f = tmp_path / "r.yaml"
    f.write_text(content)
    with pytest.raises(UserError, match=message):
        load_recipe(f, [override] if override else [])


def test_missing_recipe(tmp_path: Path):
    with pytest.raises(UserError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")


def test_a_tied_model_is_refused_only_with_servers_the_run_did_not_start(tmp_path: Path):
    from rl_runner.recipes.config import Recipe
    from rl_runner.recipes.grpo import _check_model

    (tmp_path / "config.json").write_text('{"tie_word_embeddings": true}')
    recipe = Recipe(model=tmp_path, envs=[{"ref": "environments/shellcmd"}])
    _check_model(recipe, cpu=True)  # the run serves it untied (Trainer.export)
    _check_model(recipe, cpu=False)
    running = Recipe(model=tmp_path, envs=[{"ref": "environments/shellcmd"}], policy_url="http://127.0.0.1:8000")
    with pytest.raises(UserError, match="untied") as e:
        _check_model(running, cpu=True)
    assert "drop policy_url" in e.value.hint
    with pytest.raises(UserError, match="not a model folder"):
        _check_model(Recipe(model=tmp_path / "nope", envs=[{"ref": "x"}]), cpu=True)
