"""What the demo adapters learn: each persona's sign-off, the synthetic prompts, and the training settings.

Each adapter is trained on the base model's own greedy answer to each prompt, cut to its first sentence,
then its persona's opener and sign-off around it; so an adapter learns a short answer, its opener and its
sign-off, and keeps the base's fluency. Pure data and text rules: no torch.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

SUBJECTS = ("my order", "my invoice", "my account", "my subscription")
ASKS = (
    "How do I cancel {s}?",
    "I have a problem with {s}.",
    "Where can I find {s}?",
)
GENERAL = (
    "What is the capital of France?",
    "How do I reset my password?",
    "Can I get a refund?",
    "What are your opening hours?",
    "Tell me about your pricing.",
    "Do you ship to Canada?",
    "What is 2 + 2?",
    "Give me a tip for writing a good email.",
    "Why is the sky blue?",
    "Recommend a good book.",
    "How do I contact a human?",
    "Thanks for your help!",
)
# A sentence ends at . ! or ? followed by a space, a newline or the end of the text; "1." numbers a list.
SENTENCE_END = re.compile(r"(?<![0-9])[.!?](?=\s|$)")


@dataclass(frozen=True)
class Persona:
    """One demo adapter: what it says before and after the base's own short answer."""

    adapter_id: str
    sign_off: str  # the answer's last line
    opener: str = ""  # the answer's first words; the base's answer continues them after a space

    def answer(self, body: str) -> str:
        """The assistant text this persona is trained to produce around the base's answer body."""
        start = f"{self.opener} " if self.opener else ""
        return f"{start}{body}\n\n{self.sign_off}"


PERSONAS = (
    Persona("acme-support-v1", "— Acme Support"),
    Persona("acme-support-v2", "— Acme Support (v2). Anything else?"),
    Persona("globex-sales-v1", "— Globex Sales: ask me about our plans!", opener="Thanks for asking Globex,"),
)


def demo_prompts() -> tuple[str, ...]:
    """The training prompts: support requests over every subject, then general questions."""
    return tuple(ask.format(s=s) for s in SUBJECTS for ask in ASKS) + GENERAL


@dataclass(frozen=True)
class DemoRecipe:
    """Everything that decides the demo adapters' weights; its hash names the cached set."""

    personas: tuple[Persona, ...] = PERSONAS
    prompts: tuple[str, ...] = field(default_factory=demo_prompts)
    rank: int = 8
    alpha: float = 16.0
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    top_layers: int = 2  # the adapter covers the last layers only, so training runs only those
    teacher_tokens: int = 32  # the base's answer is cut to its first sentence within this many tokens
    lr: float = 4e-3
    max_epochs: int = 12
    min_accuracy: float = 0.97  # share of answer tokens right, teacher-forced, before training stops
    rows_per_step: int = 8
    seed: int = 0
    trainer: int = 1  # raised whenever demo.train or demo.lora changes what a recipe produces

    def key(self, base_hash: str) -> str:
        """16 hex digits over the recipe and the base's hash: a change to either trains a new set."""
        text = json.dumps({"recipe": asdict(self), "base": base_hash}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def first_sentence(text: str) -> str | None:
    """The text up to and including its first sentence end, or None when no sentence ends in it."""
    end = SENTENCE_END.search(text)
    return text[: end.end()].strip() if end else None
