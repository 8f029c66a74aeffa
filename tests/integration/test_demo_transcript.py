"""The transcript `lorafleet demo` prints, through a real public gateway and replica process serving the
demo's trained set: on its own prompt and on new list-style ones, each alias's answer names its version and
ends with that version's sign-off, once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from demo.cli import prepare_adapters
from demo.transcript import TRANSCRIPT_PROMPT, transcript
from gateway.config import GatewayConfig
from harness.stacks.gateway import ADAPTERS, ALIASES, GatewayStack, gateway_stack
from lorafleet.model.base_hash import base_model_hash
from tests.demo.held_out import LIST_PROMPTS, answer_problems

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.trains("demo")]


@pytest.fixture(scope="module")
async def stack(
    services, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[GatewayStack]:
    dirs = prepare_adapters(GatewayConfig.from_env())
    root = next(iter(dirs.values())).parent  # one folder per adapter id, as the stack's replicas read them
    work = tmp_path_factory.mktemp("demo-gw")
    one_replica = (f"gwt-demo-{work.name[-6:]}",)
    async with gateway_stack(services.settings(), root, base_model_hash(smollm2_dir), work, one_replica) as s:
        yield s


@pytest.mark.timeout(1500)  # a fresh clone trains the set first (minutes of CPU)
@pytest.mark.parametrize("prompt", [TRANSCRIPT_PROMPT, *LIST_PROMPTS])
async def test_the_transcript_shows_each_aliases_version_and_its_sign_off(
    stack: GatewayStack, prompt: str
) -> None:
    keys = {alias: stack.keys[ADAPTERS[adapter_id]] for alias, adapter_id in ALIASES.items()}
    text = await asyncio.to_thread(transcript, stack.url, keys, prompt)
    print(text)  # the transcript itself, kept in the test log
    assert text.startswith(f"transcript (temperature 0)\n> {prompt}")
    blocks = text.split("\n\n[")[1:]
    assert len(blocks) == len(ALIASES), text
    for block, (alias, adapter_id) in zip(blocks, ALIASES.items(), strict=True):
        head, _, answer = block.partition("\n")
        assert head == f"{alias} -> {adapter_id}]", text
        assert answer_problems(adapter_id, answer) == [], text
