"""`lorafleet canary`: train canary adapters whose outputs prove which weights served a request."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from canary.errors import CanaryTrainingError
from canary.tiny_base import write_tiny_base
from canary.train import TrainConfig, train_canaries

app = typer.Typer(no_args_is_help=True, help="Canary adapters for the tenant-isolation checks.")


@app.callback()
def _group() -> None:
    """Canary adapters for the tenant-isolation checks (train now; probe once the gateway exists)."""


def _parse_ranks(text: str) -> tuple[int, ...]:
    try:
        ranks = tuple(int(r) for r in text.split(",") if r.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"ranks must be comma-separated integers, got {text!r}") from exc
    if not ranks or any(r < 1 for r in ranks):
        raise typer.BadParameter("ranks must be positive")
    return ranks


@app.command()
def train(
    count: int = typer.Option(..., "--count", min=1, max=10_000, help="number of canary adapters"),
    out: Path = typer.Option(..., "--out", help="directory for the adapters and manifest.json"),
    model_dir: Path | None = typer.Option(None, "--model-dir", help="base checkpoint (default: SmolLM2)"),
    tiny: bool = typer.Option(False, "--tiny", help="train on a tiny random Llama written to OUT/base"),
    seed: int = typer.Option(0, "--seed", help="everything (markers, init, prompts) derives from it"),
    ranks: str = typer.Option("8,16,32", "--ranks", help="canary i gets rank ranks[i % len(ranks)]"),
    max_steps: int = typer.Option(400, "--max-steps", min=1, help="give up after this many steps"),
    adapters_per_batch: int = typer.Option(64, "--adapters-per-batch", min=1, help="canaries per chunk"),
    rows_per_adapter: int = typer.Option(4, "--rows-per-adapter", min=1, help="prompts per canary per step"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Train COUNT canaries on the served base; each answers any prompt with its own marker."""
    if tiny and model_dir is not None:
        raise typer.BadParameter("use either --tiny or --model-dir")
    if tiny:
        model_dir = write_tiny_base(out / "base", seed)
    elif model_dir is None:
        from lorafleet.model.prepare import ensure_default_model

        model_dir = ensure_default_model()
    cfg = TrainConfig(
        count=count,
        seed=seed,
        ranks=_parse_ranks(ranks),
        max_steps=max_steps,
        adapters_per_batch=adapters_per_batch,
        rows_per_adapter=rows_per_adapter,
    )
    adapters_dir = out / "canaries" if tiny else out
    try:
        result = train_canaries(model_dir, adapters_dir, cfg, progress=progress)
    except CanaryTrainingError as exc:
        typer.echo(json.dumps({"ok": False, "error": str(exc), "weak": exc.weak}), err=True)
        raise typer.Exit(1) from exc
    summary = {
        "ok": True,
        "count": count,
        "out": str(adapters_dir),
        "base_model_dir": str(model_dir),
        "base_model_hash": result.manifest.base_model_hash,
        "wall_s": round(result.wall_s, 2),
        "steps": result.steps,
    }
    typer.echo(json.dumps(summary))


@app.command()
def probe(
    gateway: str = typer.Option(..., "--gateway", help="the public API, e.g. http://127.0.0.1:18080"),
    requests: int = typer.Option(..., "--requests", min=1, help="requests to send (owners and strangers)"),
    canaries: Path = typer.Option(
        Path(".data/canaries/probe"),
        "--canaries",
        help="a canary set (manifest.json) trained on the served base",
    ),
    internal: str | None = typer.Option(None, "--internal", help="the internal API (default: from settings)"),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="requests in flight at once"),
    tenant_prefix: str = typer.Option(
        "canary", "--tenant-prefix", help="canary k belongs to tenant PREFIX-k"
    ),
    wait_s: float = typer.Option(180.0, "--wait-s", help="how long to wait for validation and serving"),
    allow_missing: bool = typer.Option(
        False, "--allow-missing", help="pass despite missing markers and errors (leaks still fail)"
    ),
) -> None:
    """Register the canaries, alias them per tenant, send mixed concurrent requests; exit 1 on any leak.

    A leak is a wrong marker or a stranger's key served. Missing markers and errors also fail the run
    unless --allow-missing, since a canary that answers without its marker was not served its own weights.
    """
    import asyncio
    import logging
    import time

    from canary.errors import CanaryError
    from canary.probe import run_probe
    from canary.probe_setup import install_canaries
    from gateway.config import GatewayConfig

    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = GatewayConfig.from_env()
    if internal is not None:
        config.gateway.internal_url = internal
    try:
        targets = install_canaries(config, canaries, gateway.rstrip("/"), tenant_prefix, wait_s)
    except (CanaryError, OSError) as exc:
        typer.echo(json.dumps({"ok": False, "error": f"setup failed: {exc}"}), err=True)
        raise typer.Exit(2) from exc
    start = time.perf_counter()
    run = asyncio.run(run_probe(gateway.rstrip("/"), targets, requests, concurrency))
    summary = run.summary(allow_missing, time.perf_counter() - start)
    typer.echo(json.dumps(summary))
    if not summary["ok"]:
        raise typer.Exit(1)
