"""Build the faust app: topics, the window table, the forwarders and the window agent, from settings."""

from __future__ import annotations

import ssl
from typing import Any

import faust

from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import sasl_login
from stats_stream import tables
from stats_stream import topics as stream_topics
from stats_stream.agents import fleet, forward
from stats_stream.backlog import measure
from stats_stream.catchup import CatchUp
from stats_stream.config import StatsStreamSettings
from stats_stream.keeper import WindowKeeper
from stats_stream.sinks import Sinks
from stats_stream.trust import StateCheck


def broker_credentials(platform: PlatformSettings) -> faust.SASLCredentials | None:
    """The platform's Kafka login for faust's clients (the same principal and mechanism as aiokafka's)."""
    login = sasl_login(platform)
    if login is None:
        return None
    return faust.SASLCredentials(
        username=login.username,
        password=login.password,
        mechanism=login.mechanism,
        ssl_context=ssl.create_default_context() if login.tls else None,
    )


def build_app(platform: PlatformSettings, settings: StatsStreamSettings) -> faust.App:
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{platform.kafka_bootstrap}",
        broker_credentials=broker_credentials(platform),
        store=settings.store,
        datadir=str(settings.data_dir),
        topic_partitions=1,
        topic_replication_factor=platform.kafka_replication_factor,  # its own changelog and fleet topics
        web_enabled=False,
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
    )
    topics = stream_topics.declare(app)
    sinks = Sinks(platform, topics, settings.window_s)
    catchup = CatchUp()
    letters = DeadLetters.own_pool("stats-stream", platform)
    keeper = WindowKeeper(tables.declare(app), sinks, settings, catchup, letters)
    states = StateCheck(platform, settings.replica_id_prefix)
    forward.register(app, topics, catchup, letters, states)
    fleet.register(app, topics, keeper, catchup, settings.tick_s)

    @app.on_partitions_revoked.connect
    async def unvouch(app: faust.App, /, *args: Any, **kwargs: Any) -> None:
        catchup.stop()

    @app.on_partitions_assigned.connect
    async def measure_backlog(app: faust.App, /, *args: Any, **kwargs: Any) -> None:
        # what is waiting on the sources belongs to open windows; measured beside the rebalance, which a
        # retry must not hold up (an end measured after fetching began only makes the backlog longer)
        sources = {tp for tp in app.consumer.assignment() if tp.topic in topics.sources}
        app.add_future(measure(catchup, platform, app.conf.id, sources, catchup.assignment))

    @app.on_rebalance_complete.connect
    async def recount(app: faust.App, /, *args: Any, **kwargs: Any) -> None:
        keeper.forget_open_windows()  # the table may have been recovered; recount on the next message

    @app.on_before_shutdown.connect
    async def close_sinks(app: faust.App, /, *args: Any, **kwargs: Any) -> None:
        await sinks.close()
        await letters.close()
        await states.close()

    return app
