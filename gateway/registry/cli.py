"""`lorafleet adapters` and `lorafleet alias`: the pipeline's and the operator's door to the internal API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import typer
from pydantic import ValidationError

from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.registry.served_base import served_base_hash
from gateway.registry.weights_uri import ObjectLocation, parse_s3_uri
from lorafleet.client.errors import PeftDirError, RegistrationError
from lorafleet.client.peft_dir import describe_peft_dir
from lorafleet.client.registration import post_registration
from lorafleet.client.upload import artifact_prefix, upload_peft_dir
from lorafleet.s3 import async_client
from schemas.api import AdapterRegistration, RegistrationAccepted

if TYPE_CHECKING:  # imported where it runs: the CLI starts without it
    import asyncpg

T = TypeVar("T")

adapters_app = typer.Typer(no_args_is_help=True, help="Register and list adapter versions.")
alias_app = typer.Typer(no_args_is_help=True, help="Deploy, roll back and list aliases.")


def _client(config: GatewayConfig) -> httpx.Client:
    token = config.gateway.service_token.get_secret_value()
    return httpx.Client(
        base_url=config.gateway.internal_base_url(), headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _call(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """Call the internal API; print its error body and exit 1 on a 4xx/5xx."""
    with _client(GatewayConfig.from_env()) as client:
        try:
            resp = client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            typer.echo(f"cannot reach the internal API: {exc}", err=True)
            raise typer.Exit(2) from exc
    if resp.status_code >= 400:
        typer.echo(resp.text, err=True)
        raise typer.Exit(1)
    return resp.json()


@adapters_app.command("register")
def register(
    peft_dir: Path = typer.Option(..., "--peft-dir", exists=True, file_okay=False, help="PEFT LoRA folder"),
    tenant: str = typer.Option(..., "--tenant"),
    adapter_id: str = typer.Option(
        ..., "--adapter-id", help="the immutable version's id, e.g. acme-support-v7"
    ),
    version: int = typer.Option(..., "--version", min=1),
    weights_uri: str | None = typer.Option(
        None, help="default: s3://<bucket>/adapters/<tenant>/<adapter-id>"
    ),
    base_model_hash: str | None = typer.Option(None, help="default: the served base's hash"),
) -> None:
    """Upload adapter_config.json + adapter_model.safetensors, then register the version (checksum = sha256
    of adapter_model.safetensors)."""
    config = GatewayConfig.from_env()
    uri = weights_uri or f"s3://{config.platform.s3_bucket}/{artifact_prefix(tenant, adapter_id)}"
    try:
        location = parse_s3_uri(uri)
        facts = describe_peft_dir(peft_dir)
    except (GatewayError, PeftDirError, OSError) as exc:
        typer.echo(f"cannot register {peft_dir}: {exc}", err=True)
        raise typer.Exit(1) from exc

    def registration(checksum: str) -> AdapterRegistration:
        return AdapterRegistration(
            adapter_id=adapter_id,
            tenant_id=tenant,
            version=version,
            base_model_hash=base_model_hash or served_base_hash(config.gateway),
            weights_uri=location.uri(),
            checksum=checksum,
            rank=facts.rank,
            alpha=facts.alpha,
            target_modules=facts.target_modules,
        )

    try:
        accepted = asyncio.run(_upload_and_register(config, peft_dir, location, registration))
    except httpx.HTTPError as exc:
        typer.echo(f"cannot reach the internal API: {exc}", err=True)
        raise typer.Exit(2) from exc
    except (GatewayError, OSError, ValidationError, RegistrationError) as exc:
        typer.echo(f"cannot register {peft_dir}: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(json.dumps(accepted.model_dump(mode="json")))


async def _upload_and_register(
    config: GatewayConfig,
    peft_dir: Path,
    location: ObjectLocation,
    registration: Callable[[str], AdapterRegistration],
) -> RegistrationAccepted:
    """Upload the folder, then POST its registration (built from the upload's checksum)."""
    async with async_client(config.platform) as s3:
        checksum = await upload_peft_dir(s3, peft_dir, location.bucket, location.key)
    token = config.gateway.service_token.get_secret_value()
    headers = {"Authorization": f"Bearer {token}"}
    base_url = config.gateway.internal_base_url()
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        return await post_registration(client, registration(checksum))


@adapters_app.command("list")
def list_adapters(
    tenant: str | None = typer.Option(None, "--tenant"), status: str | None = typer.Option(None)
) -> None:
    """List adapter versions with their status and rejection reason."""
    params = {k: v for k, v in {"tenant_id": tenant, "status": status}.items() if v}
    for a in _call("GET", "/internal/adapters", params=params)["data"]:
        reason = f"  {a['reason_code']}: {a['reason']}" if a["reason_code"] else ""
        typer.echo(f"{a['adapter_id']:<40} {a['tenant_id']:<16} v{a['version']:<5} {a['status']:<9}{reason}")


@adapters_app.command("show")
def show(adapter_id: str) -> None:
    """Print one adapter version as JSON."""
    typer.echo(json.dumps(_call("GET", f"/internal/adapters/{adapter_id}"), indent=2))


@alias_app.command("set")
def set_alias(
    alias: str,
    adapter_id: str,
    canary: str | None = typer.Option(None, "--canary", help="A second version that takes --weight of it."),
    weight: float | None = typer.Option(None, "--weight", help="The canary's share of requests, in (0, 1)."),
) -> None:
    """Point ALIAS (tenant/name:label) at a ready ADAPTER_ID of the same tenant (a deploy), optionally
    with a weighted canary version. Without --canary, any canary ends."""
    if (canary is None) != (weight is None):
        raise typer.BadParameter("--canary and --weight go together")
    body: dict[str, Any] = {"adapter_id": adapter_id}
    if canary is not None:
        body["canary"] = {"adapter_id": canary, "weight": weight}
    typer.echo(json.dumps(_call("PUT", f"/internal/aliases/{alias}", json=body)))


@alias_app.command("rollback")
def rollback(alias: str) -> None:
    """End ALIAS's canary (all traffic back to its version), or with no canary, point it back at its
    previous version."""
    current = _call("GET", f"/internal/aliases/{alias}")
    if current.get("canary_adapter_id"):
        body = {"adapter_id": current["adapter_id"]}
    elif current.get("previous_adapter_id"):
        body = {"adapter_id": current["previous_adapter_id"]}
    else:
        typer.echo(f"{alias} has no canary and no previous version to roll back to", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(_call("PUT", f"/internal/aliases/{alias}", json=body)))


@alias_app.command("list")
def list_aliases(tenant: str | None = typer.Option(None, "--tenant")) -> None:
    """List aliases with their current, canary and previous versions."""
    params = {"tenant_id": tenant} if tenant else {}
    for a in _call("GET", "/internal/aliases", params=params)["data"]:
        canary = (
            f" canary {a['canary_adapter_id']} @ {a['canary_weight']:g}" if a["canary_adapter_id"] else ""
        )
        prev = f" prev {a['previous_adapter_id']} rev {a['revision']}"
        typer.echo(f"{a['alias']:<40} -> {a['adapter_id']:<36}{canary}{prev}")


tenants_app = typer.Typer(no_args_is_help=True, help="Create and list tenants (with their rate limits).")
keys_app = typer.Typer(no_args_is_help=True, help="Issue, list and revoke tenants' API keys.")


async def _with_pool(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """fn(pool, *args) on a small pool to the control-plane database."""
    from lorafleet.db.pool import create_pool

    pool = await create_pool(GatewayConfig.from_env().platform, min_size=1, max_size=2)
    try:
        return await fn(pool, *args)
    finally:
        await pool.close()


@tenants_app.command("create")
def create_tenant(
    tenant_id: str,
    requests_per_s: float | None = typer.Option(None, "--requests-per-s", min=0.001),
    tokens_per_min: int | None = typer.Option(None, "--tokens-per-min", min=1),
) -> None:
    """Create TENANT_ID (or change its limits when it exists)."""
    from gateway.tenants import create_tenant as create
    from schemas.ids import TENANT_ID_RE

    if not TENANT_ID_RE.fullmatch(tenant_id):
        typer.echo(f"invalid tenant id {tenant_id!r}: lowercase letters, digits and '-'", err=True)
        raise typer.Exit(1)
    created = asyncio.run(_with_pool(create, tenant_id, requests_per_s, tokens_per_min))
    typer.echo(f"tenant {tenant_id} {'created' if created else 'updated'}")


@tenants_app.command("list")
def list_tenants() -> None:
    """List tenants with their limits."""

    async def fetch(pool: asyncpg.Pool) -> list[asyncpg.Record]:
        return await pool.fetch("SELECT tenant_id, requests_per_s, tokens_per_min FROM tenants ORDER BY 1")

    for r in asyncio.run(_with_pool(fetch)):
        typer.echo(
            f"{r['tenant_id']:<24} {r['requests_per_s']:>8g} req/s {r['tokens_per_min']:>10} tokens/min"
        )


@keys_app.command("create")
def create_key(tenant_id: str = typer.Option(..., "--tenant")) -> None:
    """Issue an API key for a tenant. The secret is printed once and stored only as a hash."""
    import asyncpg

    from gateway.tenants import create_key as issue

    try:
        key = asyncio.run(_with_pool(issue, tenant_id))
    except asyncpg.ForeignKeyViolationError as exc:
        typer.echo(f"no tenant {tenant_id!r}; create it with `lorafleet tenants create`", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"key id: {key.key_id}\nsecret: {key.secret}\n(the secret is shown once; store it now)")


@keys_app.command("revoke")
def revoke_key(key_id: str) -> None:
    """Revoke a key by its id; it stops working within seconds."""
    from gateway.tenants import revoke_key as revoke

    if not asyncio.run(_with_pool(revoke, key_id)):
        typer.echo(f"no live key {key_id!r}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


@keys_app.command("list")
def list_keys(tenant_id: str | None = typer.Option(None, "--tenant")) -> None:
    """List keys (id, tenant, prefix, revoked) — never the secrets."""
    from gateway.tenants import list_keys as fetch

    for k in asyncio.run(_with_pool(fetch, tenant_id)):
        state = f"revoked {k['revoked_at']:%Y-%m-%d %H:%M}" if k["revoked_at"] else "live"
        typer.echo(f"{k['key_id']:<22} {k['tenant_id']:<20} {k['prefix']}…  {state}")
