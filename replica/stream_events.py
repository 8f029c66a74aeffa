"""The generate stream's events for each engine output, in the order schemas.replica_api fixes.

A token's logprobs give each token's bytes (Spell: the tokenizer's bytes of that one id) and their text,
with U+FFFD for the part of a multi-byte character a token holds alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from replica.engine.engine import StepOutput
from replica.engine.logprobs import TokenLogprobs
from schemas.api import ErrorDetail
from schemas.openai import FinishReason, PromptTokensDetails, TokenLogprob, TopLogprob, Usage
from schemas.replica_api import DoneEvent, ErrorEvent, TokenEvent

Spell = Callable[[int], bytes]  # a token id's bytes


def spell_id(token_id: int) -> bytes:
    """A token's name where the replica has no tokenizer (vLLM's spelling)."""
    return f"token_id:{token_id}".encode()


def token_logprob(token_id: int, logprobs: TokenLogprobs, spell: Spell) -> TokenLogprob:
    """OpenAI's entry for one generated token from the sampler's logprobs."""

    def top(tid: int, value: float) -> TopLogprob:
        raw = spell(tid)
        return TopLogprob(token=raw.decode(errors="replace"), logprob=value, bytes=list(raw))

    raw = spell(token_id)
    return TokenLogprob(
        token=raw.decode(errors="replace"),
        logprob=logprobs.logprob,
        bytes=list(raw),
        top_logprobs=[top(tid, value) for tid, value in logprobs.top],
    )


def _token(out: StepOutput, index: int, spell: Spell) -> TokenEvent:
    assert out.token_id is not None
    lp = token_logprob(out.token_id, out.logprobs, spell) if out.logprobs is not None else None
    return TokenEvent(token_id=out.token_id, text=out.text, index=index, logprobs=lp)


# A failed output's finish_reason -> the error line's code (an engine failure is generation_failed).
FAILURE_CODES: dict[str, str] = {"drain": "replica_draining"}


def stream_events(
    out: StepOutput, index: int = 0, spell: Spell = spell_id
) -> tuple[TokenEvent | DoneEvent | ErrorEvent, ...]:
    """A running choice's token; a finished one's done line (after its last token on a "length"
    finish); a failed one's error line. index is the choice's."""
    if out.error is not None:
        code = FAILURE_CODES.get(out.finish_reason or "", "generation_failed")
        err = ErrorDetail(message=out.error, type="server_error", code=code)
        return (ErrorEvent(error=err),)
    if not out.finished:
        return (_token(out, index, spell),)  # the engine emits an unfinished output only for a new token
    usage = Usage(
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        total_tokens=out.prompt_tokens + out.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=out.cached_tokens),
    )
    if out.token_id is not None and out.finish_reason == "length":
        return _token(out, index, spell), DoneEvent(finish_reason="length", text="", usage=usage, index=index)
    # DoneEvent validates the engine's reason against the contract's FinishReason.
    reason = cast(FinishReason, out.finish_reason)
    return (DoneEvent(finish_reason=reason, text=out.text, usage=usage, index=index),)
