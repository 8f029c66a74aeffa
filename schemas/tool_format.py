"""Tool calls as text: how tools are shown to a model whose chat template has none, and how its calls are
read back from what it writes.

The format is the one Hermes-style templates use (Qwen2.5, Hermes, SmolLM3): the tools as JSON inside
<tools></tools> in the system message, and each call as a JSON object {"name": ..., "arguments": {...}}
inside <tool_call></tool_call>. A template that renders tools itself gets them as they are and no system
text. Where a call is required (tool_choice "required" or a named function), decoding is constrained by
call_schema, so the whole answer is one such JSON object, without the tags.

The replica renders with it (plain_messages) and the gateway reads with it (ToolStream): one contract.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from schemas.openai_tools import CallRecord, FunctionSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def tools_prompt(functions: list[FunctionSpec], required: str | bool) -> str:
    """The system text that shows functions to a model; required is a function's name, True (any one) or
    False (the model chooses)."""
    listed = "\n".join(
        json.dumps({"type": "function", "function": f.model_dump(exclude_none=True)}, ensure_ascii=False)
        for f in functions
    )
    must = ""
    if required is True:
        must = "You must call at least one function.\n"
    elif required:
        must = f"You must call the function {required}.\n"
    return (
        "You may call one or more functions to answer. The functions, as JSON schemas:\n"
        f"<tools>\n{listed}\n</tools>\n"
        f"{must}"
        "For each call, write a JSON object with the function's name and its arguments inside tags:\n"
        f'{OPEN}\n{{"name": <function-name>, "arguments": <arguments-object>}}\n{CLOSE}'
    )


def call_text(call: CallRecord) -> str:
    """An earlier call as the model would have written it."""
    arguments = arguments_value(call.arguments)
    return f"{OPEN}\n{json.dumps({'name': call.name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def plain_messages(
    messages: list[dict[str, Any]], functions: list[FunctionSpec], required: str | bool
) -> list[dict[str, Any]]:
    """Messages for a template without tools: the tools' system text first (joined to a leading system
    message), and each earlier call written into its assistant message's content."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") or []
        content = "\n".join([m["content"], *(call_text(c) for c in calls)]) if calls else m["content"]
        out.append({"role": m["role"], "content": content.strip("\n") if calls else content})
    if functions:
        text = tools_prompt(functions, required)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def call_schema(functions: list[FunctionSpec], name: str | None = None) -> dict[str, Any]:
    """The JSON schema of one call to the named function, or to any of functions: what a required call's
    decoding is constrained to."""

    def one(f: FunctionSpec) -> dict[str, Any]:
        arguments = f.parameters or {"type": "object", "properties": {}, "additionalProperties": False}
        return {
            "type": "object",
            "properties": {"name": {"const": f.name}, "arguments": arguments},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    chosen = [one(f) for f in functions if name is None or f.name == name]
    return chosen[0] if len(chosen) == 1 else {"anyOf": chosen}


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


def parse_call(text: str, names: frozenset[str]) -> ParsedCall | None:
    """A call written as {"name": ..., "arguments": {...}} naming one of names, else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    arguments = arguments_value(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))


Piece = str | ParsedCall  # content text, or a whole call


class ToolStream:
    """Splits a model's streamed text into content and calls (see the module doc).

    whole: the answer is one call object (a required call); otherwise calls are tagged blocks among the
    content, and text that may begin a tag is held back until it is known. A block that does not parse as
    a call of one of names stays content, tags and all, as does an unfinished one.
    """

    def __init__(self, names: frozenset[str], whole: bool = False) -> None:
        self.names = names
        self.whole = whole
        self._held = ""  # text not yet given out: a possible tag start, a block, or (whole) everything
        self._in_block = False

    def feed(self, text: str) -> list[Piece]:
        self._held += text
        if self.whole:
            return []
        pieces: list[Piece] = []
        while True:
            if self._in_block:
                end = self._held.find(CLOSE)
                if end < 0:
                    return pieces
                block, self._held = self._held[: end + len(CLOSE)], self._held[end + len(CLOSE) :]
                self._in_block = False
                call = parse_call(block[len(OPEN) : -len(CLOSE)].strip(), self.names)
                pieces.append(call if call is not None else block)
                continue
            start = self._held.find(OPEN)
            if start >= 0:
                if start:
                    pieces.append(self._held[:start])
                self._held, self._in_block = self._held[start:], True
                continue
            keep = _tag_prefix_len(self._held)
            if len(self._held) > keep:
                pieces.append(self._held[: len(self._held) - keep])
                self._held = self._held[len(self._held) - keep :]
            return pieces

    def close(self) -> list[Piece]:
        """What is still held, at the end of the answer."""
        held, self._held = self._held, ""
        if self.whole:
            call = parse_call(held.strip(), self.names)
            if call is not None:
                return [call]
        return [held] if held else []


def _tag_prefix_len(text: str) -> int:
    """The length of the longest end of text that begins OPEN."""
    for n in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def arguments_value(arguments: str) -> Any:
    """A call's arguments as a value (templates take them so); text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
