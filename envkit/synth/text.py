"""Task text without a model: what fails, how, and which public API the failing tests use;
never the patch or the changed line. Optionally rewritten by an OpenAI-compatible endpoint
(``--writer URL``), with the template kept whenever the endpoint fails or strays."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["instruction", "rewrite"]

MAX_TESTS_SHOWN = 3
# A default repr's memory address ("<Duration object at 0x7fa9024d6c10>"): different in every run,
# so the same seed would give different text
_ADDRESS = re.compile(r"\b0x[0-9a-f]{6,16}\b")


def _public(target: str) -> bool:
    return not any(part.startswith("_") for part in target.split("."))


def instruction(*, project: str, package_dir: str, test_cmd: str, failing: list[tuple[str, str]], apis: list[str],
                body_of: str | None = None, total: int | None = None) -> str:
    """The task's text. ``failing``: (test id, first lines of its failure); ``apis``: the public
    targets the failing tests call (from their recorded calls); ``body_of``: the function whose
    body was removed (for "implement this" tasks)."""
    shown = failing[:MAX_TESTS_SHOWN]
    total = max(total or 0, len(failing))
    lines = []
    if body_of:
        lines.append(f"`{body_of}` in {project} has no implementation: it raises NotImplementedError. "
                     "Implement it as its docstring, its callers and the tests describe.")
    else:
        api = [a for a in apis if _public(a)][:3]
        what = f" in `{'`, `'.join(api)}`" if api else ""
        lines.append(f"A bug{what} makes {total} of {project}'s own tests fail.")
    lines.append("")
    lines.append("Failing tests:" if len(failing) > 1 else "Failing test:")
    for test, message in shown:
        first = _ADDRESS.sub("0x…", re.sub(r"\s+", " ", message.strip()))[:220]
        lines.append(f"- `{test}`" + (f": {first}" if first else ""))
    if total > len(shown):
        lines.append(f"- and {total - len(shown)} more")
    if any("#" in test for test, _ in shown):
        lines.append("(`#` in a test's id stands for the number pytest gives a parameter it cannot name, which can "
                     "change from run to run; `pytest --collect-only -q` lists the ids.)")
    lines.append("")
    lines.append(f"Fix the library's code (under `{package_dir}`); the tests are right and must not be changed. Every "
                 f"other test must keep passing. The project is in /workspace (a git repository); run its tests with "
                 f"`{test_cmd}`.")
    return "\n".join(lines)


def rewrite(text: str, url: str, *, model: str | None = None, timeout_s: float = 60.0) -> tuple[str, str | None]:
    """``text`` rewritten as an issue report by the endpoint at ``url`` (``/v1/chat/completions``).
    Returns (text, error): the template itself when the endpoint fails, or when its text drops a
    failing test's name or is empty."""
    import httpx

    prompt = ("Rewrite this bug report as a short GitHub issue written by a user of the library. Keep every test name "
              "exactly as written. Do not guess at the cause or the fix.\n\n" + text)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 600, "temperature": 0.3}
    if model:
        body["model"] = model
    try:
        if not model:
            listed = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s).json()
            body["model"] = listed["data"][0]["id"]
        reply = httpx.post(url.rstrip("/") + "/v1/chat/completions", json=body, timeout=timeout_s)
        reply.raise_for_status()
        out = str(reply.json()["choices"][0]["message"]["content"]).strip()
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        return text, f"{type(e).__name__}: {str(e)[:200]}"
    tests = re.findall(r"`([^`]+::[^`]+)`", text)
    if not out or any(t not in out for t in tests[:MAX_TESTS_SHOWN]):
        return text, "the rewritten text dropped a test name"
    return out + "\n\nThe project is in /workspace (a git repository).", None
