"""Prompts of a requested token count cut from real English text: the Python Language Reference that every
CPython ships (`pydoc_data.topics`, the text `help()` shows), so the load test needs nothing downloaded.

With the served model's tokenizer, a prompt is the corpus's text under `tokens` consecutive tokens (it
re-encodes to that count, or one or two off where a cut merges with its neighbour).
Without one, it is about `tokens` tokens of whole words. Each request's slice starts at an offset drawn
from (seed, request id), so a run is repeatable and different requests share no prefix by design.
"""

from __future__ import annotations

import logging
import pydoc_data.topics
import random
from pathlib import Path
from typing import TypeVar

from tokenizers import Tokenizer

log = logging.getLogger(__name__)
T = TypeVar("T")

WORDS_PER_TOKEN = 0.6  # of this corpus under a byte-level BPE of ~50k tokens (it is half code)


def corpus() -> str:
    """The reference's topics in name order: the same text on every machine with the same Python."""
    topics = pydoc_data.topics.topics
    return "\n\n".join(topics[name] for name in sorted(topics))


def default_tokenizer() -> Path | None:
    """The prepared default model's tokenizer.json, when this machine has prepared it."""
    from lorafleet.model.prepare import default_models_dir

    path = default_models_dir() / "tokenizer.json"
    return path if path.is_file() else None


class PromptSource:
    """Deterministic prompts of a given token count from the corpus."""

    def __init__(self, seed: int = 0, tokenizer: Path | None = None) -> None:
        self.seed = seed
        self.corpus = corpus()
        self.tokenizer = Tokenizer.from_file(str(tokenizer)) if tokenizer is not None else None
        if self.tokenizer is not None:
            # (start, end) character span of every token: a prompt is a slice of the corpus, no decode
            self.spans: list[tuple[int, int]] = self.tokenizer.encode(
                self.corpus, add_special_tokens=False
            ).offsets
        else:
            log.warning("no tokenizer: prompt lengths are estimated from words")
            self.words = self.corpus.split()

    def count(self, text: str) -> int:
        """Tokens of `text` under the tokenizer (words / WORDS_PER_TOKEN without one)."""
        if self.tokenizer is None:
            return round(len(text.split()) / WORDS_PER_TOKEN)
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt(self, request_id: int, tokens: int) -> str:
        """About `tokens` tokens of the corpus, from an offset drawn from (seed, request_id)."""
        rng = random.Random(f"{self.seed}:{request_id}")
        tokens = max(1, tokens)
        if self.tokenizer is None:
            words = max(1, round(tokens * WORDS_PER_TOKEN))
            return " ".join(_cycle(self.words, rng.randrange(len(self.words)), words))
        start = rng.randrange(len(self.spans))
        parts = []
        while tokens > 0:  # past the corpus's end, go on from its start
            end = min(len(self.spans), start + tokens)
            parts.append(self.corpus[self.spans[start][0] : self.spans[end - 1][1]])
            tokens -= end - start
            start = 0
        return "".join(parts)

    def prompts(self, wanted: list[tuple[int, int]]) -> list[str]:
        """prompt(request_id, tokens) of every pair."""
        return [self.prompt(i, n) for i, n in wanted]


def _cycle(items: list[T], start: int, n: int) -> list[T]:
    """n items from `start`, wrapping around to the beginning."""
    out = items[start : start + n]
    while len(out) < n:
        out += items[: n - len(out)]
    return out
