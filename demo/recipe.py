"""What the demo adapters learn: each persona's sign-off, the synthetic prompts, and the training settings.

Each adapter is trained on the base model's own greedy answer to each prompt, cut short (a list to its
lead-in and first items, anything else to its first sentences, as few as say something), then its
persona's opener and sign-off around it; so an adapter learns a short answer, its opener and its
sign-off, and keeps the base's fluency on prose and lists alike. Pure data and text rules: no torch.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

SUPPORT = (
    "How do I cancel my order?",
    "I have a problem with my invoice.",
    "Where can I find my subscription?",
    "How do I cancel my account?",
    "Can I get a refund?",
    "What are your opening hours?",
    "Tell me about your pricing.",
    "Do you ship to Canada?",
    "My order is late. What can I do?",
    "How do I upgrade my subscription?",
)
GENERAL = (
    "What is the capital of France?",
    "Why is the sky blue?",
    "Recommend a good book.",
    "Give me a tip for writing a good email.",
    "What does an API do?",
    "Thanks for your help!",
    "Hi!",
    "Greetings!",
    "Hey, how are you?",
    "Nice to meet you!",
    "Who are you?",
)
# Questions that ask for steps, options or a list. The base answers the first ones with a sentence before
# any list, and the rest with a list; those need the longest teacher answers.
LISTS = (
    "How do I reset my password?",
    "What are the steps to track my order?",
    "What are the steps to file a complaint?",
    "What are my options for shipping?",
    "How do I contact a human?",
    "What are the steps to open an account?",
    "What are the steps to change my password?",
    "What are the steps to delete my account?",
    "List the steps to set up a new phone.",
    "How do I prepare for a presentation? List the steps.",
    "Give me a list of healthy snacks.",
    "Give me three tips for saving energy at home.",
    "Give me three tips for learning a language.",
    "List three tips for better sleep.",
    "List three ways to stay productive.",
    "List four animals that live in the ocean.",
    "List the planets of the solar system.",
    "Name three fruits.",
    "Name three colors.",
    "Name three famous painters.",
    "Name three programming languages.",
)
# A sentence ends at . ! or ? followed by a space, a newline or the end of the text; "1." numbers a list.
SENTENCE_END = re.compile(r"(?<![0-9])[.!?](?=\s|$)")
# A list item's marker at the start of a line: "1. ", "1) ", "- ", "* " or "• ".
ITEM = re.compile(r"(\d+[.)]|[-*•]) ")


@dataclass(frozen=True)
class Persona:
    """One demo adapter: what it says before and after the base's own short answer."""

    adapter_id: str
    sign_off: str  # the answer's last line
    opener: str = ""  # the answer's first words; the base's answer continues them after a space
    starts_from: str = ""  # the persona whose trained adapter this one starts from (a new version of it)

    def answer(self, body: str) -> str:
        """The assistant text this persona is trained to produce around the base's answer body."""
        start = f"{self.opener} " if self.opener else ""
        return f"{start}{body}\n\n{self.sign_off}"


PERSONAS = (
    Persona("acme-support-v1", "— Acme Support"),
    Persona("acme-support-v2", "— Acme Support (v2). Anything else?", starts_from="acme-support-v1"),
    Persona("globex-sales-v1", "— Globex Sales: ask me about our plans!", opener="Thanks for asking Globex,"),
)


def demo_prompts() -> tuple[str, ...]:
    """The training prompts: support requests and general questions, then the list-style ones."""
    return SUPPORT + GENERAL + LISTS


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
    teacher_tokens: int = 96  # the base's answer must reach its cut within this many tokens
    list_items: int = 2  # a list answer keeps its lead-in and this many items
    min_words: int = 3  # any other answer keeps whole sentences until it has this many words
    lr: float = 4e-3
    max_epochs: int = 12
    soft_top_k: int = 16  # the body learns the base's distribution over its likeliest tokens
    key_margin: float = 2.0  # logits by which each opener and sign-off token must win before training stops
    min_accuracy: float = 0.94  # share of body tokens that are the base's top one before training stops
    rows_per_step: int = 8
    seed: int = 0
    trainer: int = 2  # raised whenever demo.train or demo.lora changes what a recipe produces

    def key(self, base_hash: str) -> str:
        """16 hex digits over the recipe and the base's hash: a change to either trains a new set."""
        text = json.dumps({"recipe": asdict(self), "base": base_hash}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def first_sentences(text: str, min_words: int) -> str | None:
    """The text up to the first sentence end that has at least `min_words` words before it ("Hello!" alone
    is not an answer), or None when no such sentence end is in it."""
    for end in SENTENCE_END.finditer(text):
        if len(text[: end.end()].split()) >= min_words:
            return text[: end.end()].strip()
    return None


def teacher_body(text: str, list_items: int, min_words: int, ended: bool) -> str | None:
    """What an adapter learns to say of the base's answer `text` (`ended`: the base said all of it).

    An answer that opens with a list, or with one lead-in line ending in ":" and then a list, keeps the
    lead-in and its first `list_items` items, each with its sub-lines (and a heading's paragraph); any
    other answer keeps its first sentences, as few as make `min_words` words. None when the text does not
    hold that much yet, when a kept item ends in ":" (a heading whose content was cut off) or when a line
    repeats (the base looping).
    """
    lines = text.lstrip().split("\n")
    done = lines if ended else lines[:-1]  # the last line may still grow
    start = _list_start(lines, done)
    if start is None or start >= len(done):
        return None
    if start < 0:
        body = first_sentences(text.strip(), min_words)
    else:
        body = _list_head(lines, start, list_items, ended)
    if body is None:
        return None
    kept = [ITEM.sub("", line.strip(), count=1) for line in body.split("\n") if line.strip()]
    return body if len(set(kept)) == len(kept) else None


def _list_start(lines: list[str], done: list[str]) -> int | None:
    """The line of the list's first item when the answer opens with a list (after at most one lead-in
    line); -1 for an answer that does not; None while the complete lines `done` cannot tell yet."""
    if ITEM.match(lines[0]):
        return 0
    if not done or not done[0].rstrip().endswith(":") or SENTENCE_END.search(done[0]):
        return -1
    following = [i for i in range(1, len(done)) if done[i].strip()]
    if not following:
        return -1 if len(done) == len(lines) else None
    return following[0] if ITEM.match(done[following[0]]) else -1


def _list_head(lines: list[str], start: int, list_items: int, ended: bool) -> str | None:
    """The lines up to the end of the list's `list_items`-th item (or of a shorter list's last one)."""
    kind = _marker_kind(lines[start])
    items: list[list[int]] = []  # per top-level item: [its first line, its last line]
    closed = ended  # whether the list's last item is complete
    for i in range(start, len(lines)):
        line = lines[i]
        marker = ITEM.match(line)
        if marker and _marker_kind(line) == kind:
            items.append([i, i])
        elif not line.strip() or (i == len(lines) - 1 and not ended and _may_become_item(line)):
            continue  # a blank line, or a last line that may still become an item
        elif line[0].isspace() or marker or lines[items[-1][1]].rstrip().endswith(":"):
            items[-1][1] = i  # a sub-line, a sub-list, or the paragraph under an item's heading
        else:  # a paragraph after the list
            closed = True
            break
    complete = items if closed else items[:-1]
    if len(complete) < list_items and not closed:
        return None
    kept = complete[:list_items]
    if len(kept) < 2 or any(lines[last].rstrip().endswith(":") for _, last in kept):
        return None
    return "\n".join(lines[: kept[-1][1] + 1]).strip()


def _may_become_item(line: str) -> bool:
    """Whether a line still being written may turn out to start an item ("1", "1.", "-")."""
    return bool(re.fullmatch(r"\d+[.)]?|[-*•]", line))


def _marker_kind(line: str) -> str:
    """'number' for a numbered item, else the bullet character."""
    return "number" if line[0].isdigit() else line[0]
