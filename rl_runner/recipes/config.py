"""The recipe file: one readable YAML document, validated strictly (every problem at once,
each with its fix), with ``key=value`` overrides from the command line.

    envkit train rl_runner/recipes/shellcmd.yaml steps=20 mode=async trainer.lr=3e-3
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from envkit.errors import UserError

__all__ = ["BatchSection", "EnvEntry", "Recipe", "load_recipe"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvEntry(_Strict):
    ref: str = Field(min_length=1)  # a folder or ns/name@version (local or registry)
    tasks: list[str] | None = None  # task ids to train on (default: all)


class SamplingSection(_Strict):
    temperature: float = Field(default=1.0, gt=0, le=5)
    max_tokens: int = Field(default=64, ge=1, le=32768)  # per model turn


class TrainerSection(_Strict):
    lr: float = Field(default=1e-3, gt=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    eps: float = Field(default=1e-8, gt=0, le=1)  # Adam's epsilon
    grad_clip: float = Field(default=1.0, gt=0)
    is_mode: Literal["tis", "mis", "none"] = "tis"
    is_cap: float = Field(default=2.0, gt=1)
    micro_batch: int = Field(default=16, ge=1, le=4096)
    kl_coef: float = Field(default=0.0, ge=0, le=100)  # β of a KL penalty towards the starting weights; 0: none
    lr_warmup: int = Field(default=0, ge=0, le=100_000)  # updates over which lr rises linearly from lr/N to lr; 0: none


class AsyncSection(_Strict):
    kl_max: float = Field(default=0.05, gt=0)  # admit a sample when its staleness KL is at most this
    max_in_flight_groups: int = Field(default=0, ge=0)  # 0: 2 x groups_per_step


class BatchSection(_Strict):
    """How batches are assembled (docs/train.md, "Batch assembly"; rl_runner/batch/assembler.py)."""

    policy: Literal["optimized", "naive"] = "optimized"  # naive: fresh sandbox per episode, wait for every member
    # Groups admitted beyond one batch, as a fraction of it; the batch is then the first groups to
    # complete and stragglers carry over. Default: 0 in sync mode (every sample on-policy), and
    # async.max_in_flight_groups in async mode.
    overprovision: float | None = Field(default=None, ge=0, le=16)
    straggler: Literal["carry", "abort"] = "carry"
    # Async mode with carried stragglers: a group enters a batch once this share of its members is
    # done; the rest join later batches (scored against their whole group). 1.0: whole groups only.
    # Sync mode always waits for whole groups (every sample on-policy).
    partial: float = Field(default=0.75, gt=0, le=1)
    # warm sandboxes per environment; 0: its share of concurrency + 25%
    pool_size: int = Field(default=0, ge=0, le=100_000)


class RaySection(_Strict):
    """``backend: ray`` (docs/cluster.md): sandbox hosts and rollout workers on a Ray cluster."""

    address: str | None = None  # HOST:PORT of a running cluster; none: start a local one of `nodes` node processes
    nodes: int = Field(default=2, ge=1, le=64)
    workers: int = Field(default=0, ge=0, le=4096)  # rollout worker actors; 0: one per node


class EvalSection(_Strict):
    episodes: int = Field(default=64, ge=0, le=100_000)
    temperature: float = Field(default=1.0, gt=0, le=5)
    before: bool = False  # also evaluate the starting weights (eval-before.json), for a before/after comparison


class Recipe(_Strict):
    model: Path  # model folder: the starting weights (e.g. `envkit model tiny DIR --warmup-steps 300`)
    envs: list[EnvEntry] = Field(min_length=1)
    run_dir: Path | None = None  # default runs/train-<time>
    mode: Literal["sync", "async"] = "sync"
    steps: int = Field(default=20, ge=1, le=1_000_000)
    groups_per_step: int = Field(default=8, ge=1, le=100_000)
    group_size: int = Field(default=8, ge=2, le=1024)
    concurrency: int = Field(default=8, ge=1, le=4096)
    retries: int = Field(default=2, ge=0, le=10)
    seed: int = 0
    dtype: Literal["float32", "bfloat16"] = "float32"  # trainer and vLLM alike
    # how the model writes tool calls (rl_runner.rollout.chat): auto picks by its chat template
    tool_format: Literal["auto", "envkit", "hermes", "llama3_json"] = "auto"
    # running vLLM server(s) (started with envkit's flags) instead of starting them
    policy_url: str | list[str] | None = None
    replicas: int = Field(default=1, ge=1, le=16)  # vLLM servers started for the run (generation routed over all)
    # cores for the run's vLLM replicas and for its sandboxes: INFERENCE/SANDBOXES ("0/1"), auto, none
    # (rl_runner.partition)
    cpu_partition: str = "auto"
    checkpoint_every: int = Field(default=10, ge=0)  # 0: only at the end
    resume: Path | None = None  # a checkpoint folder to resume from
    probe_prompts: int = Field(default=4, ge=0, le=64)  # mismatch probe after each publication
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    async_: AsyncSection = Field(default_factory=AsyncSection, alias="async")
    batch: BatchSection = Field(default_factory=BatchSection)
    backend: Literal["local", "ray"] = "local"  # where episodes run: this machine's Docker, or a Ray cluster
    ray: RaySection = Field(default_factory=RaySection)
    eval: EvalSection = Field(default_factory=EvalSection)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("envs", mode="before")
    @classmethod
    def _envs(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"ref": e} if isinstance(e, str) else e for e in v]
        return v

    @model_validator(mode="after")
    def _servers(self) -> Recipe:
        if self.policy_url is not None and self.replicas != 1:
            raise ValueError("replicas starts vLLM servers, policy_url names running ones: give one or the other "
                             "(policy_url takes a list of URLs)")
        if isinstance(self.policy_url, list) and not self.policy_url:
            raise ValueError("policy_url is an empty list: name at least one server, or leave it out")
        return self

    @property
    def policy_urls(self) -> list[str]:
        """The running servers named by ``policy_url`` (none: the run starts ``replicas``)."""
        if self.policy_url is None:
            return []
        return [self.policy_url] if isinstance(self.policy_url, str) else list(self.policy_url)

    @property
    def batch_size(self) -> int:
        return self.groups_per_step * self.group_size


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = doc
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise UserError(f"override `{dotted}`: `{k}` is not a section", "override a leaf, e.g. trainer.lr=3e-3")
        node = nxt
    node[keys[-1]] = value


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    src = Path(path)
    if not src.is_file():
        raise UserError(f"recipe `{src}` does not exist",
                        "give a recipe YAML file, e.g. rl_runner/recipes/shellcmd.yaml")
    try:
        doc = yaml.safe_load(src.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"recipe `{src}` is not valid YAML: {e}", "fix the YAML syntax at the line shown") from None
    if not isinstance(doc, dict):
        raise UserError(f"recipe `{src}` must be a mapping of settings", "write `key: value` lines, see docs/train.md")
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"override `{item}` is not key=value", "write e.g. steps=20 or trainer.lr=3e-3")
        _set(doc, key.strip(), yaml.safe_load(raw))
    try:
        recipe = Recipe.model_validate(doc)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top)"
            lines.append(f"  {where}: {err['msg']}")
        raise UserError(f"recipe `{src}` has {len(lines)} problem(s):\n" + "\n".join(lines),
                        "fix the fields above; docs/train.md lists every setting") from None
    return recipe  # relative paths are relative to the working directory, like the CLI's
