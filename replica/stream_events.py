"""The generate stream's events for each engine output, in the order schemas.replica_api fixes."""

from __future__ import annotations

from typing import cast

from replica.engine.engine import StepOutput
from schemas.api import ErrorDetail
from schemas.openai import FinishReason, PromptTokensDetails, Usage
from schemas.replica_api import DoneEvent, ErrorEvent, TokenEvent

# A failed output's finish_reason -> the error line's code (an engine failure is generation_failed).
FAILURE_CODES: dict[str, str] = {"drain": "replica_draining"}


def stream_events(out: StepOutput) -> tuple[TokenEvent | DoneEvent | ErrorEvent, ...]:
    """A running request's token; a finished one's done line (after its last token on a "length"
    finish); a failed one's error line."""
    if out.error is not None:
        code = FAILURE_CODES.get(out.finish_reason or "", "generation_failed")
        err = ErrorDetail(message=out.error, type="server_error", code=code)
        return (ErrorEvent(error=err),)
    if not out.finished:
        assert out.token_id is not None  # the engine emits an unfinished output only for a new token
        return (TokenEvent(token_id=out.token_id, text=out.text),)
    usage = Usage(
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        total_tokens=out.prompt_tokens + out.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=out.cached_tokens),
    )
    if out.token_id is not None and out.finish_reason == "length":
        last = TokenEvent(token_id=out.token_id, text=out.text)
        return last, DoneEvent(finish_reason="length", text="", usage=usage)
    # DoneEvent validates the engine's reason against the contract's FinishReason.
    return (DoneEvent(finish_reason=cast(FinishReason, out.finish_reason), text=out.text, usage=usage),)
