"""Tools reach the chat template: natively where the template renders them, in the text format elsewhere."""

from __future__ import annotations

import json

from replica.model.chat_prompt import template_inputs
from replica.model.tokenizer import compile_chat_template, renders_tools
from schemas.openai_tools import CallRecord, FunctionSpec
from schemas.replica_api import ChatMessage

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_AWARE = (
    "{% if tools %}TOOLS:{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}:"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}"
    "{% endfor %}{% else %}{{ m['content'] }}{% endif %}"
    "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}\n{% endfor %}"
)
WEATHER = FunctionSpec(
    name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}
)
CONVERSATION = [
    ChatMessage(role="user", content="Weather in Oslo?"),
    ChatMessage(
        role="assistant",
        content="",
        tool_calls=[CallRecord(id="call_1", name="get_weather", arguments='{"city":"Oslo"}')],
    ),
    ChatMessage(role="tool", content='{"temp": 3}', tool_call_id="call_1"),
]


def test_only_a_template_that_reads_tools_renders_them() -> None:
    assert renders_tools(TOOL_AWARE) and not renders_tools(CHATML) and not renders_tools(None)


def test_a_template_with_tools_gets_them_and_the_calls_natively() -> None:
    messages, tools = template_inputs(CONVERSATION, [WEATHER], False, native=True)
    text = compile_chat_template(TOOL_AWARE).render(messages=messages, tools=tools)
    listed = json.loads(text.splitlines()[0].removeprefix("TOOLS:"))
    assert listed == [{"type": "function", "function": WEATHER.model_dump(exclude_none=True)}]
    assert 'assistant:CALL get_weather {"city": "Oslo"}' in text and 'tool:{"temp": 3} (call_1)' in text


def test_a_template_without_tools_gets_the_text_format() -> None:
    messages, tools = template_inputs(CONVERSATION, [WEATHER], "get_weather", native=False)
    assert tools is None
    text = compile_chat_template(CHATML).render(messages=messages, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou may call one or more functions")
    assert "You must call the function get_weather." in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text


def test_a_request_without_tools_renders_as_before() -> None:
    plain = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi")]
    for native in (False, True):
        messages, tools = template_inputs(plain, None, False, native)
        assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        assert tools is None
