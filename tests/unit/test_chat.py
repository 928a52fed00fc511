"""The chat format (rl_runner.rollout.chat): prompts from the tokenizer's template, tool calls in
the model family's format, observations appended as the template renders a tool message, and
the token stream of an episode equal to the template's rendering of its conversation."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from rl_runner.policy.tiny import TinySpec, tokenizer_for  # noqa: E402
from rl_runner.rollout.chat import ChatFormat, ChatFormatError, ToolCall, UnparseableAction  # noqa: E402

from ..conftest import ROOT  # noqa: E402


@functools.cache
def tokenizer(template: str):
    return tokenizer_for(TinySpec(template=template))


def _episode(fmt: ChatFormat, tools: list[str]) -> tuple[list[int], object, list[ToolCall | None]]:
    """Three model turns (two tool calls answered by observations, then the answer), the model's
    tokens being what the tokenizer makes of each reply's text, plus its end-of-turn token."""
    conv = fmt.start("Find the code word and answer with it.", tools)
    replies = [fmt.format_call("bash", {"command": "ls"}), fmt.format_call("bash", {"command": "./codeword"}),
               fmt.format_call("answer", {"text": "maple"})]
    observations = ["exit 0\ncodeword\nREADME.md\n", "exit 0\ncode word: maple\n"]
    stream = list(conv.prompt_ids)
    calls = []
    for i, text in enumerate(replies):
        ids = fmt.encode(text) + [fmt.stop_ids[0]]
        stream += ids
        calls.append(fmt.parse(fmt.reply_text(ids), tools))
        if i < len(observations):
            stream += conv.observe(ids, observations[i])
        else:
            conv.finish(ids)
    return stream, conv, calls


@pytest.mark.parametrize("template, expected_format", [("chatml", "envkit"), ("hermes", "hermes")])
def test_a_three_turn_episodes_tokens_are_the_templates_rendering_of_its_conversation(template, expected_format):
    fmt = ChatFormat(tokenizer(template))
    assert fmt.name == expected_format  # auto: by what the template mentions
    stream, conv, calls = _episode(fmt, ["bash"])
    assert calls == [ToolCall("bash", {"command": "ls"}), ToolCall("bash", {"command": "./codeword"}),
                     ToolCall("answer", {"text": "maple"})]
    rendered = fmt.encode(conv.rendered())  # type: ignore[attr-defined]
    # Equal, but for the text the template writes after the last end-of-turn token, which no
    # runner appends (nothing follows the last reply): the documented difference.
    assert rendered[:len(stream)] == stream
    assert fmt.tokenizer.decode(rendered[len(stream):]) == "\n"
    text = fmt.tokenizer.decode(stream)
    assert "code word: maple" in text and text.count("code word: maple") == 1  # each observation once
    if template == "hermes":  # the tools reached the template as schemas, the observation as a tool response
        assert '"name": "bash"' in text and "<tool_response>\nexit 0\ncode word: maple\n\n</tool_response>" in text
    else:  # no tools in the template: envkit's <tool> format is explained in the system turn
        assert "<tool>" in text.split("Find the code word")[0]


def test_a_reply_cut_at_the_token_limit_gets_the_templates_end_of_turn():
    fmt = ChatFormat(tokenizer("chatml"))
    conv = fmt.start("Go.", ["bash"])
    cut = fmt.encode('<tool>{"name": "bash", "arguments": {"command": "ls"}}</tool>')  # no end-of-turn token
    appended = conv.observe(cut, "exit 0\n")
    assert fmt.tokenizer.decode(appended).startswith("<|im_end|>\n<|im_start|>tool\nexit 0\n")
    ended = fmt.start("Go.", ["bash"]).observe(cut + [fmt.stop_ids[0]], "exit 0\n")
    assert fmt.tokenizer.decode(ended).startswith("\n<|im_start|>tool\n")  # the model ended its turn itself


@pytest.mark.parametrize("template", ["chatml", "hermes"])
def test_calls_that_cannot_run_are_unparseable(template):
    fmt = ChatFormat(tokenizer(template))
    open_tag, close_tag = ("<tool>", "</tool>") if fmt.name == "envkit" else ("<tool_call>", "</tool_call>")
    for text, why in ((f'{open_tag}{{"name": "bash", "arguments": {{"command": }}{close_tag}', "JSON|parse"),
                      (f'{open_tag}{{"name": "rm_rf", "arguments": {{}}}}{close_tag}', "unknown tool"),
                      (f'{open_tag}{{"name": "bash", "arguments": {{}}}}{close_tag}', "needs command"),
                      (f'{open_tag}{{"name": "http", "arguments": {{"method": "GET", "path": "/"}}}}{close_tag}',
                       "unknown tool")):
        with pytest.raises(UnparseableAction, match=why):
            fmt.parse(text, ["bash"])
    assert fmt.parse("I am done.", ["bash"]) is None  # no call: the model is done
    if fmt.name == "hermes":
        two = fmt.format_call("bash", {"command": "ls"}) + fmt.format_call("bash", {"command": "pwd"})
        with pytest.raises(UnparseableAction, match="2 tool calls"):
            fmt.parse(two, ["bash"])


def test_bad_settings_fail_at_start_naming_what_to_change():
    tok = tokenizer_for(TinySpec())
    with pytest.raises(ChatFormatError, match="not known") as e:
        ChatFormat(tok, "xml")
    assert "tool_format" in e.value.hint
    tok.chat_template = None
    with pytest.raises(ChatFormatError, match="no chat template"):
        ChatFormat(tok, model="my-model")
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}"
                         "{% endif %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ChatFormatError, match="cannot render a tool message"):
        ChatFormat(tok)
    tok.chat_template = "{% for m in messages %}{% if m['role'] != 'tool' %}{{ m['content'] }}|{% endif %}{% endfor %}"
    with pytest.raises(ChatFormatError, match="does not show a tool message"):
        ChatFormat(tok)


def test_no_module_but_the_chat_format_names_a_special_token():
    special = re.compile(r"<\|im_(start|end)\|>|<\|endoftext\|>|</?tool_call>|</?tool_response>|<\|python_tag\|>")
    offenders = [str(p.relative_to(ROOT)) for pkg in ("envkit", "rl_runner", "registry_server")
                 for p in (ROOT / pkg).rglob("*.py")
                 if p != ROOT / "rl_runner" / "rollout" / "chat.py" and special.search(p.read_text())]
    assert offenders == []


def test_tool_schemas_are_openai_function_schemas_with_their_required_arguments():
    from envkit.tools import TOOL_ARGUMENTS, tool_schemas

    schemas = tool_schemas(["http", "bash"])
    assert [s["function"]["name"] for s in schemas] == ["http", "bash", "answer"]
    for s in schemas:
        fn = s["function"]
        assert s["type"] == "function" and fn["parameters"]["type"] == "object"
        assert fn["parameters"]["required"] == list(TOOL_ARGUMENTS[fn["name"]])
        assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
    schemas[0]["function"]["name"] = "changed"
    assert tool_schemas(["http"])[0]["function"]["name"] == "http"  # copies, not the module's own


def test_the_tokenizer_knows_the_hermes_tokens_as_special(tmp_path: Path):
    tok = tokenizer("hermes")
    ids = tok.encode("<tool_call>", add_special_tokens=False)
    assert len(ids) == 1 and ids[0] in tok.all_special_ids
