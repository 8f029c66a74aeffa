"""PEFT's module-name matching, on patterns limited to a regex subset whose matching cost is bounded.

PEFT matches a rank_pattern / alpha_pattern key with `re.match(rf"(.*\\.)?({key})$", name)` (the first key
in the mapping's order wins), a string target_modules / exclude_modules with `re.fullmatch`, and a list
entry by equality or as a dotted suffix of the name. The names here are PEFT's module paths on a Llama
(`model.layers.3.self_attn.q_proj`).

The patterns come from tenants, so they are held to a subset that Python's backtracking engine matches in
bounded time: name characters, `.`, the escapes `\\.` `\\d` `\\w` `\\-` `\\_`, character classes of those,
`^` first and `$` last, `|`, at most one group (not nested, not repeated), and at most one repetition
(`*`, `+` or `?` after a single atom). A config holds at most MAX_COMPLEX patterns that use a group, `|` or
a repetition. Anything else is refused as unsupported, never evaluated.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import TypeVar

from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode

V = TypeVar("V")
MAX_PATTERN_CHARS = 128
MAX_COMPLEX = 8  # patterns with a group, `|` or a repetition, per config
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_ESCAPES = frozenset(".dw-_")
_CLASS_CHARS = _NAME_CHARS | {"."}


def _class_end(pattern: str, start: int) -> int:
    """Index just past the character class opening at start; -1 when it leaves the subset."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    first = i
    while i < len(pattern) and pattern[i] != "]":
        if pattern[i] not in _CLASS_CHARS:
            return -1
        i += 1
    return i + 1 if i < len(pattern) and i > first else -1


def _subset_violation(pattern: str) -> str | None:
    """Why pattern leaves the served subset, or None."""
    i, repeats, groups, in_group, after_atom = 0, 0, 0, False, False
    while i < len(pattern):
        c = pattern[i]
        if c in _NAME_CHARS or c == ".":
            i, after_atom = i + 1, True
        elif c == "\\":
            if pattern[i + 1 : i + 2] not in _ESCAPES:
                return f"escape {pattern[i : i + 2]!r}"
            i, after_atom = i + 2, True
        elif c == "[":
            end = _class_end(pattern, i)
            if end < 0:
                return "character class"
            i, after_atom = end, True
        elif c == "(":
            if in_group or groups or pattern[i + 1 : i + 2] == "?":
                return "more than one group, a nested group or a (?...) construct"
            i, groups, in_group, after_atom = i + 1, groups + 1, True, False
        elif c == ")":
            if not in_group:
                return "unbalanced ')'"
            i, in_group, after_atom = i + 1, False, False
        elif c in "*+?":
            if not after_atom:
                return f"{c!r} after a group, an anchor or another repetition"
            i, repeats, after_atom = i + 1, repeats + 1, False
        elif c == "|":
            i, after_atom = i + 1, False
        elif (c == "^" and i == 0) or (c == "$" and i == len(pattern) - 1):
            i, after_atom = i + 1, False
        else:
            return f"{c!r}"
    if in_group:
        return "unbalanced '('"
    if repeats > 1:
        return "more than one repetition"
    return None


def is_complex(pattern: str) -> bool:
    """A pattern that uses a group, `|` or a repetition (the ones MAX_COMPLEX counts)."""
    return any(c in pattern for c in "(|*+?")


def check_pattern(pattern: object, field: str) -> str:
    """pattern, once it is a non-empty string in the served subset that compiles; AdapterRejected if not."""
    if not isinstance(pattern, str) or not pattern:
        raise AdapterRejected(
            RejectCode.INVALID_ADAPTER_CONFIG, f"{field}: {pattern!r} is not a pattern", field
        )
    if len(pattern) > MAX_PATTERN_CHARS:
        raise AdapterRejected(
            RejectCode.UNSUPPORTED_ADAPTER_FEATURE,
            f"{field}: a pattern of {len(pattern)} characters (at most {MAX_PATTERN_CHARS})",
            field,
        )
    why = _subset_violation(pattern)
    if why is not None:
        raise AdapterRejected(
            RejectCode.UNSUPPORTED_ADAPTER_FEATURE,
            f"{field}: pattern {pattern[:80]!r} uses regex syntax outside the served subset ({why})",
            field,
        )
    try:
        re.compile(pattern)
    except re.error as exc:
        raise AdapterRejected(
            RejectCode.INVALID_ADAPTER_CONFIG,
            f"{field}: pattern {pattern[:80]!r} is not a regex: {exc}",
            field,
        ) from exc
    return pattern


def key_regex(key: str) -> re.Pattern[str]:
    """PEFT's rank/alpha pattern rule for one key (checked by check_pattern first)."""
    return re.compile(rf"(.*\.)?({key})$")


def first_match(rules: Sequence[tuple[str, re.Pattern[str], V]], name: str) -> V | None:
    """The value of the first (key, regex, value) rule whose regex matches the module name, or None."""
    for _key, regex, value in rules:
        if regex.match(name):
            return value
    return None


def matches_module(spec: str | Sequence[str], name: str) -> bool:
    """PEFT's target_modules / exclude_modules rule: a string is a full regex, a list names suffixes."""
    if isinstance(spec, str):
        return re.fullmatch(spec, name) is not None
    return any(name == entry or name.endswith("." + entry) for entry in spec)


def layer_index(name: str, layers_pattern: Sequence[str]) -> int | None:
    """The decoder-layer index PEFT reads from a module name for layers_to_transform."""
    if not layers_pattern:
        m = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", name)
    else:
        m = None
        for pattern in layers_pattern:  # identifiers only (peft_config checks them)
            m = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", name)
            if m is not None:
                break
    return int(m["idx"]) if m is not None else None
