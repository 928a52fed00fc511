"""The one tool-call format the model writes, and its parser.

A model turn ends with at most one tool call, written as JSON inside tags::

    <tool>{"name": "bash", "arguments": {"command": "pytest -q"}}</tool>

Tools: ``bash {command}``, ``http {method, path, body?}``, ``browser {action, ...}``,
``answer {text}`` (ends the episode). A turn with no ``<tool>`` block ends the episode (the
model says it is done). A block that is not valid JSON, names an unknown or disabled tool,
or lacks an argument is an *unparseable action*: a model failure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from envkit.runtime import TOOL_ARGUMENTS

__all__ = ["ToolCall", "UnparseableAction", "parse_action", "system_prompt"]

_BLOCK = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)
_REQUIRED = TOOL_ARGUMENTS


class UnparseableAction(ValueError):
    pass


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def parse_action(text: str, enabled: list[str]) -> ToolCall | None:
    m = _BLOCK.search(text)
    if m is None:
        if "<tool>" in text:
            raise UnparseableAction("a <tool> block is not closed with </tool>")
        return None
    try:
        data = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        raise UnparseableAction(f"the tool call is not valid JSON: {e.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(data.get("arguments", {}), dict):
        raise UnparseableAction('the tool call must be {"name": "...", "arguments": {...}}')
    name, args = data["name"], data.get("arguments", {})
    allowed = [t for t in enabled if t in _REQUIRED] + ["answer"]
    if name not in allowed:
        raise UnparseableAction(f"unknown tool {name!r}; available: {', '.join(allowed)}")
    missing = [a for a in _REQUIRED[name] if a not in args]
    if missing:
        raise UnparseableAction(f"tool {name} needs {', '.join(missing)}")
    return ToolCall(name, args)


def system_prompt(enabled: list[str]) -> str:
    tools = {
        "bash": '"bash": {"command": "..."} runs a shell command in /workspace',
        "http": '"http": {"method": "GET", "path": "/...", "body": {...}} calls the service',
        "browser": '"browser": {"action": "goto|click|type|select|submit|read|back", "id": 1, "path": "/", "text": "..."}',
    }
    lines = [tools[t] for t in enabled if t in tools] + ['"answer": {"text": "..."} gives your final answer and ends']
    return ("You solve tasks in a sandbox. Each turn, call one tool as "
            '<tool>{"name": NAME, "arguments": {...}}</tool>. Tools:\n' + "\n".join(lines) +
            "\nWrite no tool call when you are done.")
