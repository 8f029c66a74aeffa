"""Canary markers: the distinct, unlikely output each canary adapter is trained to give, and finding them.

A marker has a text form (e.g. "ZQX-0042-KV") and the token ids the adapter emits. On a base with a
tokenizer the ids are the text's encoding; on a tokenizer-less test base they are drawn from the
vocabulary's marker zone (ids no prompt uses), with a distinct first token per adapter, and the text is
only a label. Detection works on
either form: token ids inside the engine, text through a public API.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

# letters rare at the start of English words, so a marker never reads like a plausible answer
RARE_LETTERS = "QXZJKVW"
TINY_MARKER_TOKENS = 3
RESERVED_TOKEN_IDS = 4  # ids 0..3 are often EOS/BOS/PAD/UNK; markers never use them
MARKER_ZONE_FRACTION = 4  # token markers use the top quarter of the vocabulary, prompts the rest


def marker_zone(vocab_size: int) -> range:
    """Token ids reserved for markers on a tokenizer-less base: like 'ZQX', never seen in a prompt."""
    return range(vocab_size - vocab_size // MARKER_ZONE_FRACTION, vocab_size)


def prompt_token_range(vocab_size: int) -> range:
    """Token ids prompts are drawn from on a tokenizer-less base (no reserved ids, no marker ids)."""
    return range(RESERVED_TOKEN_IDS, marker_zone(vocab_size).start)


class TextEncoder(Protocol):
    """What marker construction needs from a tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...


@dataclass(frozen=True)
class Marker:
    """One adapter's marker: its text and the token ids a greedy decode should start with."""

    adapter_id: str
    text: str
    token_ids: tuple[int, ...]


def canary_adapter_id(seed: int, index: int) -> str:
    """Stable id of canary `index` trained from `seed` (a valid adapter id, never a path)."""
    return f"canary-s{seed}-{index:04d}"


def marker_text(rng: random.Random, index: int) -> str:
    """'ZQX-0042-KV' style: rare letters around the zero-padded index, so every marker has the same length."""
    head = "".join(rng.choice(RARE_LETTERS) for _ in range(3))
    tail = "".join(rng.choice(RARE_LETTERS) for _ in range(2))
    return f"{head}-{index:04d}-{tail}"


def make_markers(
    count: int, seed: int, tokenizer: TextEncoder | None = None, vocab_size: int | None = None
) -> list[Marker]:
    """Markers for `count` canaries: text-encoded with a tokenizer, else drawn from range(vocab_size)."""
    if count > 10_000:
        raise ValueError("at most 10,000 canaries (the marker index has four digits)")
    rng = random.Random(f"canary-markers:{seed}")
    texts = [marker_text(rng, i) for i in range(count)]
    if tokenizer is not None:
        ids = [tuple(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    else:
        if vocab_size is None:
            raise ValueError("a base without a tokenizer needs vocab_size for token markers")
        usable = list(marker_zone(vocab_size))
        if count > len(usable):
            raise ValueError(f"{count} canaries need distinct first tokens; the zone has {len(usable)}")
        firsts = rng.sample(usable, count)  # distinct first tokens: one generated token names the adapter
        ids = [(f, *(rng.choice(usable) for _ in range(TINY_MARKER_TOKENS - 1))) for f in firsts]
    if len(set(ids)) != count:
        raise ValueError("marker token sequences collide; choose another seed")
    return [Marker(canary_adapter_id(seed, i), t, m) for i, (t, m) in enumerate(zip(texts, ids, strict=True))]


def _contains(haystack: Sequence[int], needle: Sequence[int]) -> bool:
    n = len(needle)
    return any(tuple(haystack[i : i + n]) == tuple(needle) for i in range(len(haystack) - n + 1))


def markers_in_tokens(token_ids: Sequence[int], markers: Iterable[Marker]) -> set[str]:
    """Adapter ids whose marker token sequence occurs anywhere in token_ids."""
    return {m.adapter_id for m in markers if _contains(token_ids, m.token_ids)}


def markers_in_text(text: str, markers: Iterable[Marker]) -> set[str]:
    """Adapter ids whose marker text occurs anywhere in text."""
    return {m.adapter_id for m in markers if m.text in text}
