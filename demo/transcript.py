"""One chat per demo alias through the public API at temperature 0, printed as a transcript."""

from __future__ import annotations

import httpx

# Not one of the training prompts: the transcript shows what each adapter does on a new question.
TRANSCRIPT_PROMPT = "My package arrived damaged. What should I do?"
MAX_TOKENS = 192  # room for a list's lead-in, two items and the sign-off


def ask(public_url: str, key: str, alias: str, prompt: str, max_tokens: int = MAX_TOKENS) -> tuple[str, str]:
    """(x-adapter-id, answer) of one non-streamed greedy chat with the alias."""
    resp = httpx.post(
        f"{public_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": alias,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        timeout=120,
    )
    resp.raise_for_status()
    return resp.headers.get("x-adapter-id", "?"), resp.json()["choices"][0]["message"]["content"]


def transcript(public_url: str, keys: dict[str, str], prompt: str = TRANSCRIPT_PROMPT) -> str:
    """The prompt, then each alias's answer (keys: alias -> its tenant's API key); a failed chat says why."""
    lines = [f"transcript (temperature 0)\n> {prompt}"]
    for alias, key in keys.items():
        try:
            adapter_id, answer = ask(public_url, key, alias, prompt)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            lines.append(f"\n[{alias}] failed: {exc}")
            continue
        lines.append(f"\n[{alias} -> {adapter_id}]\n{answer.strip()}")
    return "\n".join(lines)
