"""What a chat request hands its model's template: the messages, and the tools where the template takes them.

A template that renders tools itself (Tokenizer.renders_tools) gets them, and the earlier calls, in Hugging
Face's message format. Any other template gets plain messages with the tools and calls written in
schemas.tool_format's text; a request without tools renders exactly as before tools existed.
"""

from __future__ import annotations

from typing import Any

from schemas.openai_tools import FunctionSpec
from schemas.replica_api import ChatMessage
from schemas.tool_format import arguments_value, plain_messages


def template_inputs(
    messages: list[ChatMessage], tools: list[FunctionSpec] | None, required: str | bool, native: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the template; tools is None unless native (the template renders tools)."""
    if native:
        listed = [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in tools or []]
        return [_hf_message(m) for m in messages], (listed or None)
    plain = [
        {"role": m.role, "content": m.content, **({"tool_calls": m.tool_calls} if m.tool_calls else {})}
        for m in messages
    ]
    return plain_messages(plain, tools or [], required), None


def _hf_message(m: ChatMessage) -> dict[str, Any]:
    """Hugging Face's form: calls as {type, function: {name, arguments (a value)}}, a tool's call id."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": arguments_value(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out
