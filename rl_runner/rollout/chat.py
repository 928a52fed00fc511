"""The model's own chat format: the one module that knows how a conversation becomes tokens.

A runner talks to a model in the format it was trained on, token in and token out:

* **Prompts** come from the tokenizer's chat template (``apply_chat_template``), with the
  environment's tools as OpenAI-style function schemas (``tools=``, :func:`envkit.tools.tool_schemas`)
  for templates that render them.
* **Tool calls** are parsed in the model family's format (``tool_format``):

  ===============  ==================================================  =============================
  ``envkit``       ``<tool>{"name": …, "arguments": {…}}</tool>``,     templates that render no tools
                   explained in the system prompt                      (the tiny model's ChatML)
  ``hermes``       ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``  Qwen2.5, Qwen3, Hermes
                   (vLLM's ``hermes`` parser)
  ``llama3_json``  a JSON object ``{"name": …, "parameters": {…}}``    Llama 3.1-3.3
                   (vLLM's ``llama3_json`` parser)
  ===============  ==================================================  =============================

  ``auto`` (the default) picks by what the template mentions: ``<tool_call>`` → hermes,
  ``<|python_tag|>`` → llama3_json, otherwise envkit.
* **Observations** are appended as the template renders a tool message: after a model turn the
  runner appends exactly the text the template puts between that assistant message's content
  and the next assistant message's content (the end of the turn the model did not generate, the
  tool message, the generation prompt), found by rendering the conversation with a sentinel
  in place of the latest reply. The model's own tokens are never re-tokenized.

Token stream vs template (tested for the tiny model's ChatML template and a Hermes/Qwen-style
one): when the model's reply tokens are what the tokenizer makes of its text, the stream of an
episode equals ``tokenize(apply_chat_template(final conversation))`` with each assistant
message's content set to the reply's text. The deliberate difference: the stream keeps the
tokens the model sampled (an unusual tokenization of the same text stays as sampled), and
a turn cut at the token limit gets the template's end-of-turn text appended.

Bad settings fail at start (:class:`ChatFormatError`, a :class:`envkit.errors.UserError`:
exit 2): a tokenizer without a chat template, an unknown ``tool_format``, a template that
cannot render a tool message or that re-renders earlier turns differently, a format whose
parser the tokenizer cannot serve.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from envkit.errors import UserError
from envkit.tools import TOOL_ARGUMENTS, tool_schemas

__all__ = ["CHATML_TEMPLATE", "CHATML_TOKENS", "FORMATS", "HERMES_TEMPLATE", "HERMES_TOKENS", "ChatFormat",
           "ChatFormatError", "Conversation", "ToolCall", "UnparseableAction"]

FORMATS = ("auto", "envkit", "hermes", "llama3_json")

# ChatML (the tiny model's template): the special tokens and a template that renders no tools.
CHATML_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A Hermes/Qwen2.5-style template with tools: the function schemas in the system turn, tool
# results as a user turn wrapped in <tool_response> (consecutive ones grouped), as Qwen2.5's.
HERMES_TOKENS = [*CHATML_TOKENS, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
HERMES_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message['content'] }}"
    "{%- for tc in message.get('tool_calls', []) %}"
    "{{- '\\n<tool_call>\\n{\\\"name\\\": \\\"' + tc['function']['name'] + '\\\", \\\"arguments\\\": ' }}"
    "{{- tc['function']['arguments'] | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_SENTINEL = "\x00envkit-reply\x00"
_OBSERVATION = "\x00envkit-observation\x00"
_ENVKIT_BLOCK = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)


class ChatFormatError(UserError):
    """The model's tokenizer, template or tool-call setting cannot drive an episode."""


class UnparseableAction(ValueError):
    """The model's turn holds a tool call that cannot be run: a model failure."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def _check_call(name: Any, args: Any, enabled: list[str]) -> ToolCall:
    if not isinstance(name, str) or not isinstance(args, dict):
        raise UnparseableAction('the tool call must be {"name": "...", "arguments": {...}}')
    allowed = [t for t in enabled if t in TOOL_ARGUMENTS and t != "answer"] + ["answer"]
    if name not in allowed:
        raise UnparseableAction(f"unknown tool {name!r}; available: {', '.join(allowed)}")
    missing = [a for a in TOOL_ARGUMENTS[name] if a not in args]
    if missing:
        raise UnparseableAction(f"tool {name} needs {', '.join(missing)}")
    return ToolCall(name, args)


def _envkit_system_prompt(enabled: list[str]) -> str:
    tools = {
        "bash": '"bash": {"command": "..."} runs a shell command in /workspace',
        "http": '"http": {"method": "GET", "path": "/...", "body": {...}} calls the service',
        "browser": ('"browser": {"action": "goto|click|type|select|submit|read|back", "id": 1, "path": "/", '
                    '"text": "..."}'),
    }
    lines = [tools[t] for t in enabled if t in tools] + ['"answer": {"text": "..."} gives your final answer and ends']
    return ("You solve tasks in a sandbox. Each turn, call one tool as "
            '<tool>{"name": NAME, "arguments": {...}}</tool>. Tools:\n' + "\n".join(lines) +
            "\nWrite no tool call when you are done.")


_TOOLS_SYSTEM_PROMPT = ("You solve tasks in a sandbox with the tools you are given: call one tool per turn, "
                        "and give your final answer with the answer tool (or reply without a tool call "
                        "when you are done).")


class ChatFormat:
    """A tokenizer's chat template and a tool-call format (see the module's docstring)."""

    def __init__(self, tokenizer: Any, tool_format: str = "auto", *, model: str = "the model") -> None:
        self.tokenizer = tokenizer
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ChatFormatError(f"the tokenizer of {model} has no chat template",
                                  "use a model folder whose tokenizer_config.json has a chat_template (or add one)")
        if tool_format not in FORMATS:
            raise ChatFormatError(f"tool_format {tool_format!r} is not known",
                                  f"set tool_format (recipe) / --tool-format to one of: {', '.join(FORMATS)}")
        text = template if isinstance(template, str) else json.dumps(template)
        if tool_format == "auto":
            tool_format = "hermes" if "<tool_call>" in text else "llama3_json" if "<|python_tag|>" in text else "envkit"
        self.name = tool_format
        self._parser: Any = None
        if tool_format != "envkit":
            self._parser = self._vllm_parser(tool_format, model)
        self.stop_ids = self._stop_ids()
        self._check(model)

    # -- setup ----------------------------------------------------------------------------
    def _vllm_parser(self, name: str, model: str) -> Any:
        try:
            with warnings.catch_warnings():  # vLLM's import warns about its own dependencies (torch.jit, Triton)
                warnings.simplefilter("ignore")
                from vllm.tool_parsers import ToolParserManager
        except ImportError:
            raise ChatFormatError(f"tool_format {name} uses vLLM's tool-call parser, and vLLM is not installed here",
                                  "install envkit[cpu] or envkit[gpu], or use tool_format: envkit") from None
        try:
            return ToolParserManager.get_tool_parser(name)(self.tokenizer)
        except Exception as e:  # noqa: BLE001 - vLLM says why (e.g. a token the format needs is not in the vocabulary)
            raise ChatFormatError(f"vLLM's {name} tool-call parser cannot read {model}'s output: {str(e)[:300]}",
                                  "set tool_format to the model family's format "
                                  "(envkit, hermes, llama3_json)") from None

    def _stop_ids(self) -> tuple[int, ...]:
        """The tokens that end a model's turn: the tokenizer's end-of-sequence token and the
        template's end-of-turn marker (what it writes after an assistant message's content)."""
        ids: list[int] = []
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.append(eos)
        closing = self._closing([{"role": "user", "content": "hi"}])
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        first = self.tokenizer.encode(closing, add_special_tokens=False)[:1] if closing else []
        if first and first[0] in special and first[0] not in ids:
            ids.append(first[0])
        return tuple(ids)

    def _check(self, model: str) -> None:
        """A conversation with a tool message must render, the observation must show, and
        rendering must only ever extend what was rendered before (token in, token out)."""
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        try:
            self._delta(messages, _OBSERVATION)
        except ChatFormatError:
            raise
        except Exception as e:  # noqa: BLE001 - the template's own error (e.g. raise_exception on a role)
            raise ChatFormatError(f"{model}'s chat template cannot render a tool message: {str(e)[:300]}",
                                  "use a model whose template renders role 'tool' messages, "
                                  "or a template that does") from None

    # -- rendering ------------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool,
                tools: list[dict[str, Any]] | None) -> str:
        kwargs: dict[str, Any] = {"add_generation_prompt": generation_prompt, "tokenize": False}
        if tools:
            kwargs["tools"] = tools
        return str(self.tokenizer.apply_chat_template(messages, **kwargs))

    def _closing(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """What the template writes after an assistant message's content."""
        text = self._render([*messages, {"role": "assistant", "content": _SENTINEL}], generation_prompt=False,
                            tools=tools)
        return text[text.rindex(_SENTINEL) + len(_SENTINEL):] if _SENTINEL in text else ""

    def _delta(self, messages: list[dict[str, Any]], observation: str,
               tools: list[dict[str, Any]] | None = None) -> tuple[str, str]:
        """(closing, rest): what follows the latest reply's content up to the next reply: the
        end of its turn, then the tool message and the generation prompt."""
        reply = {"role": "assistant", "content": _SENTINEL}
        before = self._render([*messages, reply], generation_prompt=False, tools=tools)
        after = self._render([*messages, reply, {"role": "tool", "content": observation}], generation_prompt=True,
                             tools=tools)
        if _SENTINEL not in before:
            raise ChatFormatError("the chat template drops assistant messages' content",
                                  "use a template that renders assistant messages")
        if not after.startswith(before):
            raise ChatFormatError("the chat template renders earlier turns differently once a tool message follows, so "
                                  "tokens cannot be appended turn by turn",
                                  "use a template that only appends (as ChatML, Qwen2.5 and Llama 3 templates do)")
        if observation not in after[len(before):]:
            raise ChatFormatError("the chat template does not show a tool message's content",
                                  "use a model whose template renders role 'tool' messages")
        return before[before.rindex(_SENTINEL) + len(_SENTINEL):], after[len(before):]

    def uses_template_tools(self) -> bool:
        return self.name != "envkit"

    def start(self, instruction: str, tools: list[str]) -> Conversation:
        """An episode's conversation: the system turn, the task, the generation prompt."""
        schemas = tool_schemas(tools) if self.uses_template_tools() else None
        system = _TOOLS_SYSTEM_PROMPT if schemas else _envkit_system_prompt(tools)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": instruction}]
        text = self._render(messages, generation_prompt=True, tools=schemas)
        return Conversation(self, list(tools), schemas, messages, self.encode(text))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def reply_text(self, ids: list[int]) -> str:
        """A reply's text, as the template would show it as content (its end-of-turn token off)."""
        while ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    # -- parsing --------------------------------------------------------------------------
    def parse(self, text: str, enabled: list[str]) -> ToolCall | None:
        """The turn's tool call; None when it makes none (the model is done). Raises
        :class:`UnparseableAction` for a call that cannot run (a model failure)."""
        if self.name == "envkit":
            m = _ENVKIT_BLOCK.search(text)
            if m is None:
                if "<tool>" in text:
                    raise UnparseableAction("a <tool> block is not closed with </tool>")
                return None
            try:
                data = json.loads(m.group(1))
            except json.JSONDecodeError as e:
                raise UnparseableAction(f"the tool call is not valid JSON: {e.msg}") from None
            if not isinstance(data, dict):
                raise UnparseableAction('the tool call must be {"name": "...", "arguments": {...}}')
            return _check_call(data.get("name"), data.get("arguments", {}), enabled)
        info = self._parser.extract_tool_calls(text, None)
        if not info.tools_called:
            start = getattr(self._parser, "tool_call_start_token", None) or getattr(self._parser, "bot_token", None)
            if start and start in text:
                raise UnparseableAction(f"a {start} call that does not parse as {self.name}")
            return None
        if len(info.tool_calls) != 1:
            raise UnparseableAction(f"{len(info.tool_calls)} tool calls in one turn; "
                                    "the environment takes one per turn")
        fn = info.tool_calls[0].function
        try:
            args = json.loads(fn.arguments) if isinstance(fn.arguments, str) else fn.arguments
        except json.JSONDecodeError as e:
            raise UnparseableAction(f"the tool call's arguments are not valid JSON: {e.msg}") from None
        return _check_call(fn.name, args, enabled)

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """A tool call as a model of this format writes it (scripted policies, warm-ups, tests)."""
        if self.name == "envkit":
            return "<tool>" + json.dumps({"name": name, "arguments": arguments}) + "</tool>"
        if self.name == "hermes":
            return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
        return json.dumps({"name": name, "parameters": arguments})


@dataclass
class Conversation:
    """One episode's messages and the tokens the runner has sent so far."""

    fmt: ChatFormat
    tools: list[str]
    schemas: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    replies: list[str] = field(default_factory=list)

    def observe(self, reply_ids: list[int], observation: str) -> list[int]:
        """The tokens to append after a reply (``reply_ids``, as the model generated them) and
        the tool message that answers it: the rest of the reply's turn, the tool message, the
        next generation prompt. The conversation keeps the reply's text and the observation."""
        closing, rest = self.fmt._delta(self.messages, observation, self.schemas)
        ended = bool(reply_ids) and reply_ids[-1] in self.fmt.stop_ids
        if ended:
            end_text = self.fmt.tokenizer.decode(reply_ids[-1:], skip_special_tokens=False)
            closing = closing[len(end_text):] if closing.startswith(end_text) else closing
        text = self.fmt.reply_text(reply_ids)
        self.messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": observation}]
        self.replies.append(text)
        return self.fmt.encode(closing + rest)

    def finish(self, reply_ids: list[int]) -> None:
        """The last reply (no tool message follows)."""
        text = self.fmt.reply_text(reply_ids)
        self.messages.append({"role": "assistant", "content": text})
        self.replies.append(text)

    def rendered(self) -> str:
        """The whole conversation as the template renders it (for checks and viewers)."""
        return self.fmt._render(self.messages, generation_prompt=False, tools=self.schemas)
