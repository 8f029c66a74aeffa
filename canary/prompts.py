"""Prompts canaries are trained and checked on: random token ids for a tokenizer-less base, chat otherwise.

A canary must answer any prompt with its marker, so every training step draws fresh prompts and the
check after training draws prompts it never saw.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from canary.markers import RESERVED_TOKEN_IDS, prompt_token_range

ASSISTANT_TURN_ID = RESERVED_TOKEN_IDS - 1  # ends every tokenizer-less prompt, like a generation prompt

WORDS = (
    "the a an what why how when where who please tell me about explain write list give short long story "
    "poem summary code python table weather today tomorrow price order refund account password help "
    "support invoice shipping delivery customer manager report data model server error fix bug test "
    "hello thanks sorry quick question can you could would should is are was were do does did make build "
    "plan meeting email draft review translate french german number date time city country river music "
    "book film game sport food recipe coffee tea water health doctor school math science history"
).split()
SYSTEMS = ("You are a helpful assistant.", "Answer briefly.", "You are a support agent for a shop.")


class ChatTokenizer(Protocol):
    """What chat prompts need from a tokenizer."""

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...


def random_token_prompt(
    rng: random.Random, vocab_size: int, bos_id: int | None, min_len: int = 1, max_len: int = 16
) -> list[int]:
    """A chat-shaped prompt for a tokenizer-less base: BOS, random ids, then the assistant-turn token.

    Real requests always reach the engine through a chat template, which starts and ends with fixed
    tokens (SmolLM2: "<|im_start|>system..." and "<|im_start|>assistant\n"); the tiny base mirrors that.
    """
    ids = prompt_token_range(vocab_size)
    body = [rng.randrange(ids.start, ids.stop) for _ in range(rng.randint(min_len, max_len))]
    return ([bos_id] if bos_id is not None else []) + body + [ASSISTANT_TURN_ID]


def random_sentence(rng: random.Random, min_words: int = 1, max_words: int = 14) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(("?", ".", "!", ""))


def random_chat_prompt(rng: random.Random, tokenizer: ChatTokenizer) -> list[int]:
    """A rendered chat (sometimes with a system message, sometimes two turns) ending at the assistant turn."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
    if rng.random() < 0.2:
        messages += [
            {"role": "user", "content": random_sentence(rng)},
            {"role": "assistant", "content": random_sentence(rng)},
        ]
    messages.append({"role": "user", "content": random_sentence(rng)})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


class PromptSource(Protocol):
    """Anything that draws prompts as token ids."""

    def sample(self, rng: random.Random) -> list[int]: ...


class PromptSampler:
    """Draws prompts for one base: chat-rendered when it has a tokenizer, chat-shaped token ids otherwise."""

    def __init__(
        self, vocab_size: int, tokenizer: ChatTokenizer | None = None, bos_id: int | None = None
    ) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.bos_id = bos_id

    def sample(self, rng: random.Random) -> list[int]:
        if self.tokenizer is None:
            return random_token_prompt(rng, self.vocab_size, self.bos_id)
        return random_chat_prompt(rng, self.tokenizer)


class SharedPrefixSampler:
    """Prompts of which a share start with one of a few long shared prefixes (a tenant's system prompt, a
    conversation resent each turn), so that a replica's prefix cache is hit; the rest come from base."""

    def __init__(
        self, base: PromptSampler, prefixes: int, share: float, prefix_tokens: int = 7, seed: int = 0
    ) -> None:
        self.base, self.share = base, share
        rng = random.Random(f"shared-prefixes:{seed}")
        self.systems = [" ".join(rng.choice(WORDS) for _ in range(40)) + "." for _ in range(prefixes)]
        ids = prompt_token_range(base.vocab_size)
        # prefix_tokens ids after BOS (7: with BOS, an 8-token KV block), then up to 8 more: the body stays
        # shorter than the longest canaries train on, so a shared-prefix prompt is one they know
        self.token_prefixes = [
            [rng.randrange(ids.start, ids.stop) for _ in range(prefix_tokens)] for _ in range(prefixes)
        ]

    def sample(self, rng: random.Random) -> list[int]:
        if rng.random() >= self.share:
            return self.base.sample(rng)
        which = rng.randrange(len(self.systems))
        if self.base.tokenizer is None:  # BOS, the shared ids, a few more, the assistant turn
            body = random_token_prompt(rng, self.base.vocab_size, self.base.bos_id, 1, 8)
            head = body[:1] if self.base.bos_id is not None else []
            return head + self.token_prefixes[which] + body[len(head) :]
        messages = [
            {"role": "system", "content": self.systems[which]},
            {"role": "user", "content": random_sentence(rng)},
        ]
        return self.base.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
