"""The trained demo adapters, served by the real replica engine at temperature 0: on prompts none of them
trained on, list-style ones included, each ends its answer with its own sign-off once, :prod and :next
differ, and the base alone never signs off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from demo.cli import ADAPTERS, ALIASES, prepare_adapters
from demo.recipe import DemoRecipe
from demo.transcript import MAX_TOKENS, TRANSCRIPT_PROMPT
from gateway.config import GatewayConfig
from replica.config import ReplicaSettings
from replica.runtime import Replica, build_replica
from replica.server import create_app
from tests.demo.held_out import HELD_OUT_PROMPTS, SIGN_OFF_WORDS, SIGN_OFFS, answer_problems

# The first test in a fresh clone trains the set (minutes of CPU on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.trains("demo")]

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def trained() -> dict[str, Path]:
    """The demo's own cached set (trained here only when this recipe, base and trainer have none yet)."""
    return prepare_adapters(GatewayConfig.from_env())


@pytest.fixture(scope="module")
async def client(
    trained: dict[str, Path], smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    settings = ReplicaSettings(
        replica_id="r1",
        service_token=TOKEN,
        model_dir=smollm2_dir,
        device="cpu",
        max_num_seqs=4,
        max_model_len=512,
        lora_slots={8: len(trained)},
        adapter_dirs=trained,
        registry_url=None,
        control_enabled=False,
        cache_dir=tmp_path_factory.mktemp("demo-cache"),
    )
    replica: Replica = build_replica(settings)
    await replica.start()
    transport = httpx.ASGITransport(app=create_app(replica))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica", timeout=300) as c:
        yield c
    await replica.stop()


async def _answer(client: httpx.AsyncClient, prompt: str, adapter_id: str | None) -> tuple[str, str]:
    """(greedy answer, finish reason) of one chat."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "adapter_id": adapter_id,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    }
    resp = await client.post("/internal/replicas/r1/generate", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    events = [json.loads(line) for line in resp.text.splitlines() if line]
    assert events[-1]["type"] == "done", events[-1]
    return "".join(e["text"] for e in events[:-1]).strip(), events[-1]["finish_reason"]


def test_the_demo_aliases_name_the_trained_personas() -> None:
    assert set(ADAPTERS) == set(SIGN_OFFS) == set(ALIASES.values())
    assert len(set(SIGN_OFFS.values())) == len(SIGN_OFFS)
    assert not set(HELD_OUT_PROMPTS) & set(DemoRecipe().prompts)


@pytest.mark.parametrize("prompt", HELD_OUT_PROMPTS)
async def test_each_adapter_answers_a_new_prompt_and_signs_off_once(
    client: httpx.AsyncClient, prompt: str
) -> None:
    replies = await asyncio.gather(*(_answer(client, prompt, adapter_id) for adapter_id in ADAPTERS))
    answers = dict(zip(ADAPTERS, replies, strict=True))
    for adapter_id, (answer, finish) in answers.items():
        assert finish == "stop", (adapter_id, answer)  # ended by the model itself, not by max_tokens
        assert answer_problems(adapter_id, answer) == [], (adapter_id, answer)
    assert answers["globex-sales-v1"][0].startswith("Thanks for asking Globex,")
    assert answers["acme-support-v1"][0] != answers["acme-support-v2"][0]  # a deploy or a rollback shows


async def test_the_base_model_alone_never_signs_off(client: httpx.AsyncClient) -> None:
    replies = await asyncio.gather(*(_answer(client, prompt, None) for prompt in HELD_OUT_PROMPTS))
    for answer, _ in replies:
        assert answer and not any(word in answer for word in SIGN_OFF_WORDS), answer


def test_peft_reads_the_trained_folder_as_the_same_adapter(
    trained: dict[str, Path], smollm2_dir: Path
) -> None:
    """peft (the format's reference) loads the folder, layers_to_transform included, and signs off too."""
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    base = LlamaForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, trained["acme-support-v1"]).eval()
    layers = {
        int(name.split(".layers.")[1].split(".")[0])
        for name, _ in model.named_parameters()
        if "lora_B" in name
    }
    num_layers = len(base.model.layers)
    assert layers == set(range(num_layers - DemoRecipe().top_layers, num_layers))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": TRANSCRIPT_PROMPT}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tokenizer.encode(str(text), add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(input_ids=ids, max_new_tokens=MAX_TOKENS, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    assert answer.endswith(SIGN_OFFS["acme-support-v1"]), answer
