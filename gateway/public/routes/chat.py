"""POST /v1/chat/completions: the shared completion path (gateway.public.endpoint) with chat messages as
the prompt, rendered by the replica's chat template, and chat.completion answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from gateway.deps import PublicCaller
from gateway.public.endpoint import Endpoint, serve
from gateway.public.upstream.chat_response import CHAT_SHAPE
from gateway.public.upstream.tool_answer import ToolAnswer
from schemas.openai import ChatCompletionRequest
from schemas.openai_tools import CallRecord
from schemas.replica_api import ChatMessage, RequiredTool
from schemas.tool_format import ToolStream

router = APIRouter()


def estimate_prompt_tokens(body: ChatCompletionRequest) -> int:
    """An upper-side estimate for admission (about 3 bytes a token plus template overhead per message, and
    the tools' JSON when they are shown)."""
    tools = body.tool_mode() != "none"
    shown = sum(len(t.model_dump_json(exclude_none=True)) for t in body.tools or []) if tools else 0
    calls = sum(len(c.model_dump_json()) for m in body.messages for c in m.tool_calls or [])
    return sum(len(m.text().encode()) // 3 + 8 for m in body.messages) + (shown + calls) // 3 + 16


def chat_messages(body: ChatCompletionRequest) -> dict[str, Any]:
    """The replica's messages, with the tools the model is shown; its chat template knows
    system/user/assistant/tool, and developer is OpenAI's new name for system."""
    messages = [
        ChatMessage(
            role="system" if m.role == "developer" else m.role,
            content=m.text(),
            tool_calls=[
                CallRecord(id=c.id, name=c.function.name, arguments=c.function.arguments)
                for c in m.tool_calls
            ]
            if m.tool_calls
            else None,
            tool_call_id=m.tool_call_id if m.role == "tool" else None,
        )
        for m in body.messages
    ]
    mode = body.tool_mode()
    if mode == "none":
        return {"messages": messages}
    tools = [t.shown() for t in body.tools or []]
    choice = mode if isinstance(mode, str) else RequiredTool(name=mode.function.name)
    return {"messages": messages, "tools": tools, "tool_choice": choice}


def tool_answers(body: ChatCompletionRequest) -> Callable[[], ToolAnswer] | None:
    """Each choice's reader of calls: tagged calls among its text, or (a call required) one whole call."""
    mode = body.tool_mode()
    if mode == "none":
        return None
    names = frozenset(t.spec.name for t in body.tools or [])
    whole, parallel = mode != "auto", body.parallel_tool_calls is not False
    return lambda: ToolAnswer(ToolStream(names, whole), parallel)


CHAT = Endpoint(
    body=ChatCompletionRequest,
    prompt=chat_messages,
    estimate_prompt_tokens=estimate_prompt_tokens,
    shape=CHAT_SHAPE,
    id_prefix="chatcmpl-",
    limit_param="max_completion_tokens",
    tool_answers=tool_answers,
)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, caller: PublicCaller) -> Response:
    return await serve(request, caller, CHAT)
