"""A tool-enabled chat answer, read as it streams: content text and whole function calls.

The replica sends text; schemas.tool_format.ToolStream finds the calls in it. Each call gets its id here
(call_ and 24 hex digits) and its index in the answer. A call is given out whole, name and arguments in one
delta, which OpenAI's clients assemble like any other. An answer that made a call and stopped finishes
with "tool_calls"; one cut short by max_tokens keeps "length". With parallel_tool_calls false only the first
call is kept.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from schemas.openai import ChatFinishReason, FinishReason
from schemas.openai_tools import FunctionCall, ToolCall
from schemas.tool_format import Piece, ToolStream


@dataclass
class ToolAnswer:
    """One choice's answer: its ToolStream and the calls found so far."""

    stream: ToolStream
    parallel: bool = True
    calls: list[ToolCall] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """The content and the calls that this piece of text completes (a call's index in the answer is its
        place in self.calls)."""
        return self._sort(self.stream.feed(text))

    def close(self) -> tuple[str, list[ToolCall]]:
        """The content and calls still held when the answer ends."""
        return self._sort(self.stream.close())

    def finish_reason(self, reason: FinishReason) -> ChatFinishReason:
        return chat_finish(reason, self.calls)

    def _sort(self, pieces: list[Piece]) -> tuple[str, list[ToolCall]]:
        content, calls = [], []
        for piece in pieces:
            if isinstance(piece, str):
                content.append(piece)
            elif self.parallel or not self.calls:
                call = ToolCall(
                    id="call_" + secrets.token_hex(12),
                    function=FunctionCall(name=piece.name, arguments=piece.arguments),
                )
                self.calls.append(call)
                calls.append(call)
        return "".join(content), calls


def chat_finish(reason: FinishReason, calls: list[ToolCall] | None) -> ChatFinishReason:
    """A chat choice's finish_reason: tool_calls for an answer that made calls and stopped."""
    return "tool_calls" if calls and reason == "stop" else reason
