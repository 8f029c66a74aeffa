"""Prompts none of the demo adapters trained on, list-style ones included, and what a good answer to one is:
the persona's sign-off once, as its last line, after a real answer that neither loops nor signs twice."""

from __future__ import annotations

from demo.recipe import PERSONAS
from demo.transcript import TRANSCRIPT_PROMPT

HELD_OUT_PROMPTS = (
    TRANSCRIPT_PROMPT,
    "What are the steps to update my billing address?",
    "List three ways to speed up a slow laptop.",
    "How do I set up two-factor authentication?",
    "What payment methods do you accept?",
    "Give me some tips for a job interview.",
    "Hello!",
    "How do I change my delivery address?",
)
LIST_PROMPTS = HELD_OUT_PROMPTS[1:3]  # the base answers these with a numbered list
SIGN_OFFS = {p.adapter_id: p.sign_off for p in PERSONAS}
# Words of the sign-offs that an answer's body never holds: a body that does has signed off in the middle.
SIGN_OFF_WORDS = ("Acme Support", "Globex Sales", "Anything else?", "ask me about our plans")


def answer_problems(adapter_id: str, answer: str) -> list[str]:
    """What is wrong with `adapter_id`'s answer (empty when nothing is)."""
    sign_off = SIGN_OFFS[adapter_id]
    lines = answer.strip().splitlines()
    body = "\n".join(lines[:-1]).strip()
    said = [line.strip() for line in lines if line.strip()]
    problems = []
    if not lines or lines[-1].strip() != sign_off:
        problems.append("the last line is not its sign-off")
    if answer.count(sign_off) != 1:
        problems.append(f"its sign-off appears {answer.count(sign_off)} times")
    if len(body.split()) < 3:
        problems.append("no answer before the sign-off")
    if any(line.startswith("—") for line in said[:-1]):
        problems.append("a line before the last starts with a dash")
    if any(word in body for word in SIGN_OFF_WORDS):
        problems.append("the body holds words of a sign-off")
    if len(set(said)) != len(said):
        problems.append("a line repeats")
    return problems
