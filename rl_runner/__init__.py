"""The envkit RL runner (vLLM policy, rollouts, batches, trainer). Not built yet: see the open runner issues."""
