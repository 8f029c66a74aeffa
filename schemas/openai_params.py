"""The OpenAI parameters lorafleet has not implemented, and the OpenAI error a body that fails validation
gets.

UNSUPPORTED (chat completions) and COMPLETIONS_UNSUPPORTED (legacy completions) map each such parameter to
the values that leave a request's meaning unchanged (null always does); any other value is refused with a
400 naming it, never dropped. A key is the parameter's path in the body, with `[]` for "every item":
`messages[].audio` is a field of every message. Implementing a parameter removes its entry.

request_error turns pydantic's errors into the one ErrorDetail both the gateway and the replica answer, so
the same body gets the same 400 from either: `param` is OpenAI's path (`messages[0].content[1].type`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticCustomError

from schemas.api import ErrorDetail

UNSUPPORTED_PARAMETER = "unsupported_parameter"


@dataclass(frozen=True)
class NoOp:
    """Which values of an unimplemented parameter change nothing, and how an error names them."""

    accepts: Callable[[Any], bool]
    shown: str | None = None  # the accepted values as the error message writes them; None: only null


def _never(_value: object) -> bool:
    return False


UNSUPPORTED: dict[str, NoOp] = {
    "functions": NoOp(lambda v: v == [], "[]"),
    "function_call": NoOp(lambda v: v == "none", '"none"'),
    "audio": NoOp(_never),
    "modalities": NoOp(lambda v: v == ["text"], '["text"]'),
    "prediction": NoOp(_never),
    "web_search_options": NoOp(_never),
    "reasoning_effort": NoOp(_never),
    "verbosity": NoOp(_never),
    "messages[].function_call": NoOp(_never),
    "messages[].audio": NoOp(_never),
    "messages[].refusal": NoOp(_never),
    "messages[].content[].type": NoOp(lambda v: v == "text", '"text"'),
    "tools[].type": NoOp(lambda v: v == "function", '"function"'),
    "tools[].custom": NoOp(_never),
}

# POST /v1/completions: the prompt as one string only (no batch of prompts).
COMPLETIONS_UNSUPPORTED: dict[str, NoOp] = {
    "prompt": NoOp(lambda v: isinstance(v, str), "a string"),
    "echo": NoOp(lambda v: v is False, "false"),
    "suffix": NoOp(_never),
    "best_of": NoOp(lambda v: v == 1, "1"),
}

Table = Mapping[str, NoOp]


def unsupported_fields(prefix: str, table: Table = UNSUPPORTED) -> tuple[str, ...]:
    """The field names in table directly under prefix ("" for the body, "messages[]." for a message)."""
    return tuple(
        key[len(prefix) :] for key in table if key.startswith(prefix) and "." not in key[len(prefix) :]
    )


def describe_unsupported(prefix: str, table: Table = UNSUPPORTED) -> Callable[[dict[str, Any]], None]:
    """A model's json_schema_extra: the OpenAPI document says which values of each field under prefix are
    accepted, so what it describes is what the server takes."""

    def describe(schema: dict[str, Any]) -> None:
        for name in unsupported_fields(prefix, table):
            shown = table[prefix + name].shown
            accepted = f"only {shown} is accepted" if shown else "leave it out"
            schema["properties"][name]["description"] = f"Not supported by this server: {accepted}."

    return describe


def supported(key: str, value: Any, table: Table = UNSUPPORTED) -> Any:
    """value when table[key] takes it as a no-op; otherwise an unsupported_parameter error (a field
    validator's: pydantic adds the location)."""
    rule = table[key]
    if value is None or rule.accepts(value):
        return value
    raise PydanticCustomError(UNSUPPORTED_PARAMETER, "not supported by this server", {"shown": rule.shown})


# Where FastAPI says a value came from: the first element of its errors' locations.
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})
# Fields whose keys the caller chooses: a path ends at them, as OpenAI's does ("logit_bias").
_MAPS = frozenset({"logit_bias", "metadata"})
# Every field of the request bodies is a lower-case name; pydantic's union members in a location are not
# (`list[ContentPart]`, `constrained-str`, `ContentPart`), except these.
_FIELD = re.compile(r"[a-z_][a-z0-9_]*")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "bytes"})

_CODES = {
    "json_invalid": "invalid_json",
    UNSUPPORTED_PARAMETER: UNSUPPORTED_PARAMETER,
    "extra_forbidden": "unknown_parameter",
}
# Which error is reported when a body has several: the unimplemented, then the unknown, then the deepest;
# a union member's plain type mismatch ("Input should be a valid string") last among equals.
_RANK = {UNSUPPORTED_PARAMETER: 0, "extra_forbidden": 1}


def param_path(loc: Sequence[int | str], unknown: bool = False) -> str | None:
    """OpenAI's name for a location: `messages[0].content`; unknown keeps the last element (an unknown
    field's name, whatever its spelling)."""
    path = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif (unknown and i == len(loc) - 1) or (_FIELD.fullmatch(part) and part not in _TYPE_TAGS):
            path += f".{part}" if path else part
            if part in _MAPS:
                break
    return path or None


def _located(error: Mapping[str, Any], from_request: bool) -> tuple[Mapping[str, Any], str | None]:
    loc = tuple(error.get("loc", ()))
    if from_request and loc and loc[0] in _SOURCES:
        loc = loc[1:]
    return error, param_path(loc, unknown=error.get("type") == "extra_forbidden")


def request_error(errors: Sequence[Mapping[str, Any]], from_request: bool = False) -> ErrorDetail:
    """The 400's error object for a body's validation errors (pydantic's, or FastAPI's with from_request:
    their locations start with the source, "body")."""
    if not errors:
        return ErrorDetail(message="invalid request", type="invalid_request_error", code="invalid_parameter")
    located = [_located(e, from_request) for e in errors]

    def rank(item: tuple[Mapping[str, Any], str | None]) -> tuple[int, int, bool]:
        error, param = item
        depth = len(re.findall(r"[.\[]", param or "")) + bool(param)
        return _RANK.get(error["type"], 2), -depth, str(error["type"]).endswith("_type")

    error, param = min(located, key=rank)
    kind = error["type"]
    if kind == "json_invalid":
        message = "the request body is not valid JSON"
    elif kind == UNSUPPORTED_PARAMETER:
        shown = (error.get("ctx") or {}).get("shown")
        message = f"Unsupported parameter: '{param}' is not supported by this server" + (
            f"; it accepts only {shown}" if shown else ""
        )
    elif kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    else:
        message = f"{param or 'body'}: {error.get('msg', 'invalid value')}"
    return ErrorDetail(
        message=message, type="invalid_request_error", param=param, code=_CODES.get(kind, "invalid_parameter")
    )
