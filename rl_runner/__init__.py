"""The envkit RL runner: the vLLM policy (policy/), multi-turn rollouts with failure attribution
(rollout/), batch assembly (batch/), the trainer (trainer/), weight publication, recipes and
metrics; docs/architecture.md maps every module."""
