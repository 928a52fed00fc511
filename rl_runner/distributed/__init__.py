"""Scale-out backends for the runner. :mod:`rl_runner.distributed.ray_backend`: sandbox hosts and
rollout workers on a Ray cluster."""
