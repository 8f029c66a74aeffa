"""POST /v1/chat/completions: the shared completion path (gateway.public.endpoint) with chat messages as
the prompt, rendered by the replica's chat template, and chat.completion answers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from gateway.deps import PublicCaller
from gateway.public.endpoint import Endpoint, serve
from gateway.public.upstream.chat_response import CHAT_SHAPE
from schemas.openai import ChatCompletionRequest
from schemas.replica_api import ChatMessage

router = APIRouter()


def estimate_prompt_tokens(body: ChatCompletionRequest) -> int:
    """An upper-side estimate for admission (about 3 bytes a token plus template overhead per message)."""
    return sum(len(m.text().encode()) // 3 + 8 for m in body.messages) + 16


def chat_messages(body: ChatCompletionRequest) -> dict[str, Any]:
    """The replica's messages; its chat template knows system/user/assistant/tool, and developer is OpenAI's
    new name for system."""
    messages = [
        ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text())
        for m in body.messages
    ]
    return {"messages": messages}


CHAT = Endpoint(
    body=ChatCompletionRequest,
    prompt=chat_messages,
    estimate_prompt_tokens=estimate_prompt_tokens,
    shape=CHAT_SHAPE,
    id_prefix="chatcmpl-",
    limit_param="max_completion_tokens",
)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, caller: PublicCaller) -> Response:
    return await serve(request, caller, CHAT)
