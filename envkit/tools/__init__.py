"""The agent's tools: their names and required arguments (:data:`TOOL_ARGUMENTS`; ``answer``
is always offered), their OpenAI-style function schemas (:func:`tool_schemas`: what a runner
gives a model's chat template as ``tools=``, and what `envkit serve` publishes), and the ones
that run on the host (:mod:`envkit.tools.browser`: Playwright driving Debian's Chromium)."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["TOOL_ARGUMENTS", "TOOL_SCHEMAS", "tool_schemas"]

TOOL_ARGUMENTS: dict[str, tuple[str, ...]] = {"bash": ("command",), "http": ("method", "path"), "browser": ("action",),
                                              "answer": ("text",)}


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(TOOL_ARGUMENTS[name])}}}


TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "bash": _function("bash", "Run a shell command (bash) in the sandbox's working folder; returns its exit code and "
                      "output.", {"command": {"type": "string", "description": "The command line."}}),
    "http": _function("http", "Call the environment's service over HTTP; returns the status and the JSON body.", {
        "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
        "path": {"type": "string", "description": "The path and query, starting with /."},
        "body": {"type": "object", "description": "A JSON body (POST, PUT, PATCH)."}}),
    "browser": _function("browser", "Act on the service's web pages in a browser; returns a snapshot of the page "
                         "(its numbered elements).", {
        "action": {"type": "string", "enum": ["goto", "click", "type", "select", "submit", "read", "back"]},
        "path": {"type": "string", "description": "goto: the page's path, starting with /."},
        "id": {"type": "integer", "description": "click, type, select, submit: the element's number in the snapshot."},
        "field": {"type": "string", "description": "type, select: the form field's name (instead of id)."},
        "text": {"type": "string",
                 "description": "type: the text to enter; click: the element's name (instead of id)."},
        "value": {"type": "string", "description": "select: the option to choose."}}),
    "answer": _function("answer", "Give the final answer; ends the episode.",
                        {"text": {"type": "string", "description": "The answer."}}),
}


def tool_schemas(enabled: list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    """The function schemas of an environment's tools (``[tools] enabled``, in its order; tools
    with no schema skipped) and ``answer``, which every environment offers."""
    names = [t for t in enabled if t in TOOL_SCHEMAS and t != "answer"] + ["answer"]
    return [copy.deepcopy(TOOL_SCHEMAS[n]) for n in names]
