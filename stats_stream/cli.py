"""`lorafleet stats-stream` runs the stream as its own process; `lorafleet stats` prints the fleet picture."""

from __future__ import annotations

import asyncio
import json
import logging

import typer
from pydantic import ValidationError

from lorafleet.config import get_settings
from lorafleet.kafka import ensure_topics
from lorafleet.profile import refuse_dev_tokens
from schemas import principals
from stats_stream.config import StatsStreamSettings

log = logging.getLogger(__name__)


def stats_stream() -> None:
    """Aggregate replica state, replica events and completed requests into stats, alerts and autoscaling."""
    import faust

    from stats_stream import metrics
    from stats_stream.app import build_app
    from stats_stream.reader import STATS_TOPICS
    from stats_stream.topics import SOURCES

    platform = get_settings().as_service(principals.STATS_STREAM)
    try:
        settings = StatsStreamSettings()
    except ValidationError as exc:  # e.g. a /metrics beyond loopback without its token: say which, and stop
        raise SystemExit(f"stats-stream: {'; '.join(e['msg'] for e in exc.errors())}") from None
    token = settings.metrics_token
    held = {"LORAFLEET_STATS_METRICS_TOKEN": token} if token is not None else {}
    refuse_dev_tokens(platform, "stats-stream", held)
    asyncio.run(ensure_topics(platform, (*SOURCES, *STATS_TOPICS)))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    secret = token.get_secret_value() if token is not None else ""
    metrics.serve(settings.metrics_port, settings.metrics_host, secret or None)
    app = build_app(platform, settings)
    log.info(
        "stats stream %s: %.0fs windows, metrics on %s:%d%s",
        settings.app_id,
        settings.window_s,
        settings.metrics_host,
        settings.metrics_port,
        " (token)" if secret else "",
    )
    faust.Worker(app, loglevel=settings.log_level).execute_from_commandline()


def stats(
    as_json: bool = typer.Option(False, "--json", help="Print the picture as JSON."),
    minutes: float = typer.Option(15.0, help="How far back to read the stats topics."),
    top: int = typer.Option(10, help="How many adapters to list."),
    timeout_s: float = typer.Option(10.0, help="Give up reading after this long."),
) -> None:
    """Print the fleet picture from the stats topics: top adapters, hit rates, alerts, autoscaling."""
    from stats_stream.picture import render, summarize
    from stats_stream.reader import read_recent

    events = asyncio.run(read_recent(get_settings(), minutes * 60, timeout_s))
    picture = summarize(events, top=top)
    typer.echo(json.dumps(picture, indent=2, default=str) if as_json else render(picture))
