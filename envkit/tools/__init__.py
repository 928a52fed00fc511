"""The agent's tools: their names and required arguments (:data:`TOOL_ARGUMENTS`; ``answer``
is always offered), and the ones that run on the host (:mod:`envkit.tools.browser`:
Playwright driving Debian's Chromium)."""

__all__ = ["TOOL_ARGUMENTS"]

TOOL_ARGUMENTS: dict[str, tuple[str, ...]] = {"bash": ("command",), "http": ("method", "path"), "browser": ("action",),
                                              "answer": ("text",)}
