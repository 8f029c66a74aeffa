"""POST /v1/completions (OpenAI's legacy completions): the shared completion path (gateway.public.endpoint)
with one prompt string sent to the replica as raw text, no chat template, and text_completion answers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from gateway.deps import PublicCaller
from gateway.public.endpoint import Endpoint, serve
from gateway.public.upstream.chat_response import TEXT_SHAPE
from schemas.openai_completions import CompletionRequest

router = APIRouter()


def estimate_prompt_tokens(body: CompletionRequest) -> int:
    """An upper-side estimate for admission (about 3 bytes a token, plus the tokenizer's special tokens)."""
    return len(body.text().encode()) // 3 + 8


def raw_prompt(body: CompletionRequest) -> dict[str, Any]:
    return {"prompt": body.text()}


COMPLETIONS = Endpoint(
    body=CompletionRequest,
    prompt=raw_prompt,
    estimate_prompt_tokens=estimate_prompt_tokens,
    shape=TEXT_SHAPE,
    id_prefix="cmpl-",
    limit_param="max_tokens",
)


@router.post("/v1/completions")
async def completions(request: Request, caller: PublicCaller) -> Response:
    return await serve(request, caller, COMPLETIONS)
