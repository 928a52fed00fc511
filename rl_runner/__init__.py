"""The envkit RL runner: vLLM policy (policy/), multi-turn rollouts with failure attribution
(rollout/). Batches, trainer and weight publication come with the next issues."""
