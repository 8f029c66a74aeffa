"""The trained demo adapters, served by the real replica engine at temperature 0: each one ends a new
question's answer with its own sign-off, :prod and :next differ, and the base alone never signs off."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from demo.cli import ADAPTERS, ALIASES, prepare_adapters
from demo.recipe import PERSONAS, DemoRecipe
from demo.transcript import TRANSCRIPT_PROMPT
from gateway.config import GatewayConfig
from replica.config import ReplicaSettings
from replica.runtime import Replica, build_replica
from replica.server import create_app

# The first test in a fresh clone trains the set (69 s of CPU; minutes on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# None of these is a training prompt.
NEW_PROMPTS = (TRANSCRIPT_PROMPT, "Hello!", "How do I change my delivery address?")
SIGN_OFFS = {p.adapter_id: p.sign_off for p in PERSONAS}


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
        "max_tokens": 96,
    }
    resp = await client.post("/internal/replicas/r1/generate", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    events = [json.loads(line) for line in resp.text.splitlines() if line]
    assert events[-1]["type"] == "done", events[-1]
    return "".join(e["text"] for e in events[:-1]).strip(), events[-1]["finish_reason"]


def test_the_demo_aliases_name_the_trained_personas() -> None:
    assert set(ADAPTERS) == set(SIGN_OFFS) == set(ALIASES.values())
    assert len(set(SIGN_OFFS.values())) == len(SIGN_OFFS)
    assert not set(NEW_PROMPTS) & set(DemoRecipe().prompts)


@pytest.mark.parametrize("prompt", NEW_PROMPTS)
async def test_each_adapter_answers_a_new_prompt_briefly_and_signs_off(
    client: httpx.AsyncClient, prompt: str
) -> None:
    answers = {}
    for adapter_id in ADAPTERS:
        answer, finish = await _answer(client, prompt, adapter_id)
        assert finish == "stop", (adapter_id, answer)  # a short answer, ended by the model itself
        answers[adapter_id] = answer
    for adapter_id, answer in answers.items():
        assert answer.endswith(SIGN_OFFS[adapter_id]), (adapter_id, answer)
        body = answer.removesuffix(SIGN_OFFS[adapter_id]).strip()
        assert len(body.split()) >= 3, (adapter_id, answer)  # a real answer before the sign-off
        assert answer.splitlines()[-1] == SIGN_OFFS[adapter_id], (adapter_id, answer)  # its own, whole line
        assert not set(body.splitlines()) & set(SIGN_OFFS.values()), (adapter_id, answer)  # signed once
    assert answers["globex-sales-v1"].startswith("Thanks for asking Globex,")
    assert answers["acme-support-v1"] != answers["acme-support-v2"]  # a deploy or a rollback shows


async def test_the_base_model_alone_never_signs_off(client: httpx.AsyncClient) -> None:
    for prompt in NEW_PROMPTS:
        answer, _ = await _answer(client, prompt, None)
        assert answer and "— Acme" not in answer and "— Globex" not in answer, answer


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
        out = model.generate(input_ids=ids, max_new_tokens=96, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    assert answer.endswith(SIGN_OFFS["acme-support-v1"]), answer
