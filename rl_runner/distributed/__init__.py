"""Where episodes run. :mod:`~rl_runner.distributed.rollouts` is the one seam (the
``Rollouts`` interface, ``open_rollouts``); :mod:`~rl_runner.distributed.local` runs episodes on
this machine; on a Ray cluster, :mod:`~rl_runner.distributed.driver` (``RayRollouts``) places
them on :mod:`~rl_runner.distributed.host` (sandbox hosts, one per sandbox node) and
:mod:`~rl_runner.distributed.worker` (rollout workers); :mod:`~rl_runner.distributed.cluster`
starts a local cluster; :mod:`~rl_runner.distributed.replies` is what crosses between them."""
