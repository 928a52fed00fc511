"""envkit: reproducible RL environments for LLM agents."""

from typing import Any

from envkit.version import __version__

__all__ = ["__version__", "check_env", "make"]


def make(ref: str, **kwargs: Any) -> Any:
    """An environment with Gymnasium's ``reset`` / ``step`` (see :mod:`envkit.gym`)."""
    from envkit.gym import make as _make

    return _make(ref, **kwargs)


def check_env(env: Any, **kwargs: Any) -> dict[str, Any]:
    """Check an environment made by :func:`make` against the API's contract (:mod:`envkit.gym`)."""
    from envkit.gym import check_env as _check

    return _check(env, **kwargs)
