"""Stop strings for streaming: how much generated text is safe to emit, and whether a stop matched."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopScan:
    """Result of scanning the text generated so far.

    safe_len: the prefix text[:safe_len] may be emitted; it never contains (part of) a stop string.
    matched: the stop string that ended generation, or None. When set, text[:safe_len] is the final
             output (the stop string itself is not part of it, as in OpenAI's API).
    """

    safe_len: int
    matched: str | None = None


def scan_stop_strings(text: str, stops: Sequence[str], start: int = 0) -> StopScan:
    """Find the earliest stop string in text, or else hold back a suffix that could still become one.

    `start` is where a new match may begin (e.g. emitted length minus the longest stop); matches that
    begin earlier were already ruled out by the caller's previous scan.
    """
    stops = [s for s in stops if s]
    if not stops:
        return StopScan(len(text))
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop, start)
        if at != -1 and (best is None or at < best[0]):
            best = (at, stop)
    if best is not None:
        return StopScan(best[0], best[1])
    return StopScan(len(text) - held_back(text, stops))


def held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
