"""One generate request to a replica app, as the cold-load and load-failure tests send it."""

from __future__ import annotations

import json

import httpx

from schemas.replica_api import GenerateRequest

MAX_TOKENS = 3


async def generate(
    client: httpx.AsyncClient, url: str, adapter_id: str, tenant_id: str, prompt: list[int]
) -> tuple[int, dict[str, str], dict | list[int]]:
    """(status, headers, error body or token ids) of one greedy request for MAX_TOKENS tokens."""
    body = GenerateRequest(
        prompt_token_ids=prompt,
        adapter_id=adapter_id,
        tenant_id=tenant_id,
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
    )
    async with client.stream("POST", url, json=body.model_dump(exclude_none=True)) as resp:
        if resp.status_code != 200:
            return resp.status_code, dict(resp.headers), json.loads(await resp.aread())
        events = [json.loads(line) async for line in resp.aiter_lines() if line]
    tokens = [int(e["token_id"]) for e in events if e["type"] == "token"]
    assert len(tokens) == MAX_TOKENS, events
    return 200, dict(resp.headers), tokens
