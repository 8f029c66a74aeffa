"""`lorafleet replica ...` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="Run a replica (inference engine + adapter cache).")


@app.callback()
def _group() -> None:
    """Replica commands."""


@app.command()
def serve(
    model_dir: Annotated[
        Path | None, typer.Option(help="Hugging Face Llama directory (default: prepared SmolLM2)")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port")] = None,
    replica_id: Annotated[str | None, typer.Option(help="This replica's id")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32 | bfloat16 | float16")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda")] = None,
    merged_adapter_id: Annotated[
        str | None, typer.Option(help="Dedicated replica: fold this adapter into W")
    ] = None,
) -> None:
    """Serve generate, adapter load/unload and state over HTTP (LORAFLEET_REPLICA_* settings; flags win)."""
    from lorafleet.model.prepare import DEFAULT_MODEL_DIR, ensure_default_model
    from lorafleet.profile import object_store_keys, refuse_dev_tokens
    from replica.config import ReplicaSettings
    from schemas import principals

    flags: dict[str, object] = {
        "model_dir": model_dir,
        "host": host,
        "port": port,
        "replica_id": replica_id,
        "dtype": dtype,
        "device": device,
        "merged_adapter_id": merged_adapter_id,
    }
    # The flags given beat the environment; model_validate still reads LORAFLEET_REPLICA_* for the rest.
    settings = ReplicaSettings.model_validate({k: v for k, v in flags.items() if v is not None})
    # the credential it checks callers with: the digest, taken from the token when only that is set
    tokens = {"LORAFLEET_REPLICA_SERVICE_TOKEN_SHA256": settings.service_token_digest()}
    if settings.registry_url is not None:
        tokens["LORAFLEET_REPLICA_REGISTRY_TOKEN"] = settings.registry_token
    settings = settings.model_copy(update={"platform": settings.platform.as_service(principals.REPLICA)})
    tokens |= object_store_keys(settings.platform)  # adapters, and a merged replica's one, come from there
    refuse_dev_tokens(settings.platform, "replica", tokens)
    if settings.model_dir == DEFAULT_MODEL_DIR and not (DEFAULT_MODEL_DIR / "config.json").is_file():
        settings = settings.model_copy(update={"model_dir": ensure_default_model()})
    from replica.main import serve as run  # torch and the engine: after the secrets are known to be real

    run(settings)


@app.command()
def drain(
    url: Annotated[str, typer.Option(help="The replica's base URL, e.g. http://127.0.0.1:8100")],
    deadline_s: Annotated[
        float | None, typer.Option(help="End requests still running after this (default: the replica's)")
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Return only once the replica process no longer answers")
    ] = False,
    wait_extra_s: Annotated[
        float, typer.Option(help="With --wait: how long past the deadline to wait")
    ] = 30.0,
) -> None:
    """Drain a replica: no new requests, finish the running ones, move its adapters, exit (the preStop hook).

    The service token is LORAFLEET_REPLICA_SERVICE_TOKEN, the one the replica checks."""
    import httpx

    from lorafleet.replica_drain import DrainFailed, request_drain, wait_gone
    from replica.config import ReplicaSettings

    try:
        answer = request_drain(url, ReplicaSettings().service_token, deadline_s)
    except (DrainFailed, httpx.HTTPError) as exc:
        typer.echo(f"drain failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(answer.model_dump_json())
    if wait and not wait_gone(url, answer.deadline_s + wait_extra_s):
        typer.echo(f"{url} still answers {answer.deadline_s + wait_extra_s:.0f} s after the drain", err=True)
        raise typer.Exit(1)
