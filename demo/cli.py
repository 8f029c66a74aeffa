"""`lorafleet demo`: seed the local stack with two tenants, their keys, three real PEFT adapters and aliases,
idempotently, then print a working curl command and an openai-client snippet.

Adapters are small LoRAs trained on the served base on the CPU (demo.train), each with a visible
sign-off, cached under .data/demo/trained/<recipe key>; they are uploaded to the object store and
registered through the internal API (the registry validator marks them ready); aliases then point at them.
Once a replica is live, one chat per alias is printed as a transcript.
Demo keys are kept in .data/demo/keys.json (mode 600) so a rerun prints the same working key.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import typer

from demo.recipe import DemoRecipe
from demo.transcript import transcript
from gateway.config import GatewayConfig
from gateway.registry.served_base import served_base_hash
from lorafleet.client.errors import RegistrationError
from lorafleet.client.peft_dir import weights_checksum
from lorafleet.client.registration import AdapterUpload, register_and_wait

TENANTS = {"acme": (20.0, 200_000), "globex": (5.0, 100_000)}
ADAPTERS = {"acme-support-v1": ("acme", 1), "acme-support-v2": ("acme", 2), "globex-sales-v1": ("globex", 1)}
ALIASES = {
    "acme/support:prod": "acme-support-v1",
    "acme/support:next": "acme-support-v2",
    "globex/sales:prod": "globex-sales-v1",
}


def demo_dir(config: GatewayConfig) -> Path:
    return config.platform.data_path / "demo"


def prepare_adapters(config: GatewayConfig) -> dict[str, Path]:
    """The demo's trained PEFT folders (trained once per recipe and base, then reused)."""
    from demo.cache import ensure_trained
    from lorafleet.model.base_hash import base_model_hash
    from lorafleet.model.prepare import ensure_default_model

    model_dir = ensure_default_model()
    root = demo_dir(config) / "trained"
    out = ensure_trained(root, model_dir, DemoRecipe(), base_model_hash(model_dir), _train)
    return {adapter_id: out / adapter_id for adapter_id in ADAPTERS}


def _train(model_dir: Path, out: Path, recipe: DemoRecipe, base_hash: str) -> dict[str, object]:
    from demo.train import train_demo_adapters  # torch and transformers: only when a set is trained

    return train_demo_adapters(model_dir, out, recipe, base_hash)


async def _keys(config: GatewayConfig) -> dict[str, str]:
    """Tenants with their limits, and one live key each (reused from keys.json while it still works)."""
    from gateway.tenants import create_key, create_tenant, find_caller, key_hash
    from lorafleet.db.pool import create_pool

    path = demo_dir(config) / "keys.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    pool = await create_pool(config.platform, min_size=1, max_size=2)
    try:
        keys = {}
        for tenant, (rps, tpm) in TENANTS.items():
            await create_tenant(pool, tenant, rps, tpm)
            secret = saved.get(tenant)
            if secret is None or await find_caller(pool, key_hash(secret)) is None:
                secret = (await create_key(pool, tenant)).secret
            keys[tenant] = secret
    finally:
        await pool.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(keys))
    os.chmod(path, 0o600)
    return keys


def _register(config: GatewayConfig, dirs: dict[str, Path], wait_s: float) -> None:
    """Upload and register the demo versions not registered yet; wait until every one is ready, and say so
    when a version was registered earlier with other weights (it keeps serving those)."""
    uploads = [
        AdapterUpload(adapter_id, tenant, version, dirs[adapter_id])
        for adapter_id, (tenant, version) in ADAPTERS.items()
    ]
    token = config.gateway.service_token.get_secret_value()
    base_hash = served_base_hash(config.gateway)
    views = register_and_wait(
        config.gateway.internal_base_url(), token, config.platform, base_hash, uploads, wait_s
    )
    for view in views:  # versions are immutable: an older demo's registration keeps its own weights
        if view.checksum != weights_checksum(dirs[view.adapter_id]):
            typer.echo(
                f"{view.adapter_id} is registered with other weights than {dirs[view.adapter_id]}", err=True
            )


def snippet(public_url: str, key: str, alias: str) -> str:
    body = json.dumps(
        {
            "model": alias,
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 32,
            "stream": True,
        }
    )
    return f"""curl -N -i {public_url}/v1/chat/completions \\
  -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
  -d '{body}'

python - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{public_url}/v1", api_key="{key}")
for chunk in client.chat.completions.create(
    model="{alias}", messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=32, stream=True
):
    print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="", flush=True)
print()
EOF"""


def demo(
    prepare_only: bool = typer.Option(False, "--prepare-only", help="only make the adapter files"),
    wait_s: float = typer.Option(180.0, help="how long to wait for validation and live replicas"),
) -> None:
    """Seed two demo tenants, keys, adapters and aliases (idempotent); print a curl and an openai snippet."""
    import asyncio
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = GatewayConfig.from_env()
    dirs = prepare_adapters(config)
    if prepare_only:
        typer.echo(f"demo adapters in {next(iter(dirs.values())).parent}")
        return
    keys = asyncio.run(_keys(config))
    try:
        _register(config, dirs, wait_s)
    except RegistrationError as exc:
        typer.echo(f"demo adapters are not ready: {exc}", err=True)
        raise typer.Exit(1) from exc
    token = config.gateway.service_token.get_secret_value()
    with httpx.Client(
        base_url=config.gateway.internal_base_url(), headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        for alias, adapter_id in ALIASES.items():
            client.put(f"/internal/aliases/{alias}", json={"adapter_id": adapter_id}).raise_for_status()
    public = config.gateway.public_base_url()
    deadline = time.monotonic() + wait_s
    live: list[str] = []
    while time.monotonic() < deadline:
        try:
            live = httpx.get(f"{public}/ready", timeout=2).json().get("replicas", [])
        except (httpx.HTTPError, ValueError):
            live = []
        if live:
            break
        time.sleep(1)
    typer.echo(
        f"tenants: {', '.join(TENANTS)}; aliases: {', '.join(ALIASES)}; live replicas: {live or 'none yet'}"
    )
    typer.echo(f"keys are in {demo_dir(config) / 'keys.json'}\n")
    if live:
        typer.echo(transcript(public, {alias: keys[alias.split("/")[0]] for alias in ALIASES}) + "\n")
    typer.echo(snippet(public, keys["acme"], "acme/support:prod"))
