"""Multi-turn rollouts: the tool-call format, the agent loop, the trajectory record, retries."""
