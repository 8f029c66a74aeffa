"""`lorafleet registry-validator`: consume adapters.registered (both doors) and settle each version.

Offsets are committed only after an event is settled, so a crash redelivers it (a no-op by event_id).
A record that does not decode is dead-lettered (lorafleet.dead_letters) and committed past, and so is one
whose handler keeps failing for another reason than the infrastructure (lorafleet.settle). A check the object
store failed is recorded on the pending version (attempts, error, next check) and committed past, so one
failing object never holds the partition; the reconciler (reconciler.py) asks for the check again when it is
due, and for any pending version whose event never arrived.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Literal

from aiokafka import AIOKafkaConsumer, TopicPartition

from gateway.config import GatewayConfig
from gateway.registry.registration_rules import RegistryRules
from gateway.registry.served_base import served_base_hash, served_base_spec
from gateway.registry.validator.artifact_fetch import TransientFetchError
from gateway.registry.validator.handler import RegistryValidator
from gateway.registry.validator.reconciler import reconcile_forever
from lorafleet import metrics
from lorafleet.db.pool import close_pool, create_pool
from lorafleet.dead_letters import DeadLetters
from lorafleet.fetch_retry import FetchPolicy
from lorafleet.kafka import make_consumer
from lorafleet.profile import object_store_keys, refuse_dev_tokens
from lorafleet.retry import run_with_retry
from lorafleet.s3 import async_client
from lorafleet.settle import settle
from lorafleet.worker import run_until_signal
from schemas import principals
from schemas.events import AdapterRegistered
from schemas.topics import ADAPTERS_REGISTERED

log = logging.getLogger(__name__)

Where = tuple[str, int, int, bytes | None]  # a record's topic, partition, offset and value
Outcome = Literal["handled", "dead_lettered", "deferred", "invalid"]


async def _handle(
    validator: RegistryValidator, event: AdapterRegistered, letters: DeadLetters, where: Where
) -> Outcome:
    """How the event settled: handled; dead-lettered once its handler kept failing for another reason than
    the infrastructure (lorafleet.settle); or deferred when the object store failed the check (the version
    stays pending with its error and its next check, which the reconciler asks for)."""
    try:
        applied = await settle(
            partial(validator.handle, event), letters, *where, transient=(TransientFetchError,)
        )
    except TransientFetchError as exc:
        await validator.defer(event, exc)
        return "deferred"
    return "handled" if applied else "dead_lettered"


async def run_validator(
    config: GatewayConfig,
    stop: asyncio.Event,
    rules: RegistryRules | None = None,
    ready: asyncio.Event | None = None,
    from_end: bool = False,
) -> None:
    """Consume until stop is set. from_end skips what the topic held before start (tests use fresh groups)."""
    settings = config.gateway
    rules = rules or RegistryRules.build(
        served_base_hash(settings), settings.max_rank, config.platform.object_store_prefixes
    )
    spec = served_base_spec(settings)
    pool = await create_pool(config.platform, min_size=1, max_size=4)
    consumer = make_consumer(config.platform, ADAPTERS_REGISTERED.name, group_id=settings.validator_group)
    letters = DeadLetters("registry-validator", pool)
    reconciler: asyncio.Task | None = None
    try:
        async with async_client(config.platform) as s3:
            policy = FetchPolicy.from_settings(config.platform)
            validator = RegistryValidator(pool, s3, rules, spec, settings, policy)
            await consumer.start()
            await _wait_assigned(consumer, from_end)
            reconciler = asyncio.create_task(reconcile_forever(pool, settings, stop))
            if ready is not None:
                ready.set()
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=300, max_records=100)
                for tp, records in batch.items():
                    for record in records:
                        event = await letters.parse(tp.topic, tp.partition, record.offset, record.value)
                        assert event is None or isinstance(event, AdapterRegistered)  # the topic's one type
                        where = (tp.topic, tp.partition, record.offset, record.value)
                        outcome: Outcome = "invalid"
                        if event is not None:
                            outcome = await _handle(validator, event, letters, where)
                        metrics.EVENTS_HANDLED.labels("registry-validator", tp.topic, outcome).inc()
                        await consumer.commit({tp: record.offset + 1})
    finally:
        if reconciler is not None:
            reconciler.cancel()
            await asyncio.gather(reconciler, return_exceptions=True)
        await consumer.stop()
        await close_pool(pool)


async def _wait_assigned(consumer: AIOKafkaConsumer, from_end: bool) -> None:
    while not consumer.assignment():  # the group join runs in aiokafka's background task
        await asyncio.sleep(0.05)
    if from_end:
        parts: list[TopicPartition] = list(consumer.assignment())
        await consumer.seek_to_end(*parts)
        for tp in parts:
            await consumer.position(tp)


def registry_validator() -> None:
    """Validate adapter registrations (both doors) and mark each version ready or rejected."""

    config = GatewayConfig.from_env(principals.REGISTRY_VALIDATOR)
    refuse_dev_tokens(config.platform, "registry-validator", object_store_keys(config.platform))
    metrics.serve(config.gateway.validator_metrics_port, config.gateway.validator_metrics_host)
    run_until_signal(
        lambda stop: run_with_retry(
            "registry-validator", lambda s: run_validator(config, s), stop, config.platform
        )
    )
