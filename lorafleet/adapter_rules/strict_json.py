"""JSON as both adapter files must be written: UTF-8, no duplicate keys, no NaN/Infinity, short integers."""

from __future__ import annotations

import json
from typing import Any

from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode

MAX_INT_DIGITS = 20  # any offset, shape or rank fits in 20 digits; longer ones cost time to parse


class _Refused(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"duplicate key {key[:80]!r}")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"integer of {len(text)} digits")
    return int(text)


def loads(raw: bytes, code: RejectCode, what: str) -> Any:
    """Parse raw as strict JSON; AdapterRejected(code) naming `what` when it is not."""
    try:
        return json.loads(
            raw.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_int
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise AdapterRejected(code, f"{what} is not strict JSON: {str(exc)[:200]}") from exc
