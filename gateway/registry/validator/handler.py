"""The registry validator's handling of one adapters.registered event, from either door.

1. Record: a Kafka-door registration gets its pending row here; an unknown tenant, or an adapter_id already
   registered with different content, is answered with a rejected adapters.validated event and nothing else.
2. Verify, outside any transaction: the field checks again, then the files from the object store (sha256 of
   the weights bytes first, then the shared adapter rules, then the registration against the files).
3. Settle: ready or rejected with a reason code, the adapters.validated outbox event and the processed_events
   mark in one transaction. A redelivered event is a no-op; an object-store outage leaves the version pending
   and raises TransientFetchError, which the consumer records on the version with `defer` (its next check).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from gateway.config import GatewaySettings
from gateway.errors import InvalidRegistration
from gateway.registry import adapters
from gateway.registry.registration_rules import RegistryRules, check_fields
from gateway.registry.validator.artifact_checks import verify_artifact
from gateway.registry.validator.artifact_fetch import fetch_artifact
from lorafleet import metrics
from lorafleet.adapter_rules.base_spec import BaseSpec
from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.db.conn import Connection
from lorafleet.fetch_retry import FetchPolicy
from lorafleet.outbox.idempotency import apply_once
from lorafleet.outbox.writer import emit
from schemas.events import AdapterRegistered, ValidationStatus

if TYPE_CHECKING:  # a stub-only package (dev extras)
    from types_aiobotocore_s3 import S3Client

log = logging.getLogger(__name__)

CONSUMER = "registry-validator"


@dataclass(frozen=True)
class Verdict:
    status: ValidationStatus
    reason_code: str | None = None
    reason: str | None = None
    size_bytes: int | None = None


class RegistryValidator:
    """Validates registrations against the served base; holds no state beyond its clients."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        s3: S3Client,
        rules: RegistryRules,
        spec: BaseSpec,
        settings: GatewaySettings,
        policy: FetchPolicy | None = None,
    ) -> None:
        self._pool, self._s3, self._rules, self._spec, self._settings = pool, s3, rules, spec, settings
        self._policy = policy or FetchPolicy()

    async def handle(self, event: AdapterRegistered) -> str:
        """Process one registration; return what happened (for logs and tests)."""
        fields = adapters.content_of(event)
        async with self._pool.acquire() as conn:
            early = await self._record(conn, event, fields)
        if early is not None:
            return early
        verdict = await self.verify(event)
        async with self._pool.acquire() as conn:
            applied, _ = await apply_once(
                conn,
                CONSUMER,
                event.event_id,
                lambda c: adapters.settle(
                    c, fields, verdict.status, verdict.reason_code, verdict.reason, verdict.size_bytes
                ),
            )
        outcome = verdict.status if verdict.status == "ready" else f"rejected:{verdict.reason_code}"
        log.info("adapter %s: %s%s", event.adapter_id, outcome, "" if applied else " (duplicate)")
        return outcome if applied else "duplicate"

    async def defer(self, event: AdapterRegistered, exc: Exception) -> None:
        """Record a check the object store failed on the pending version, with when to check it again."""
        s = self._settings
        async with self._pool.acquire() as conn:
            row = await adapters.defer_check(
                conn, event.adapter_id, str(exc), s.registry_recheck_initial_s, s.registry_recheck_max_s
            )
        metrics.REGISTRY_CHECKS_DEFERRED.inc()
        if row is None:
            log.info("adapter %s: the store failed a check of a version no longer pending", event.adapter_id)
            return
        log.warning(
            "adapter %s stays pending: %s (failed checks %d; next at %s)",
            event.adapter_id,
            exc,
            row["check_attempts"],
            row["next_check_at"].isoformat(),
        )

    async def _record(self, conn: Connection, event: AdapterRegistered, fields: dict[str, Any]) -> str | None:
        """Insert or match the version row; return an outcome when the event needs no verification."""
        if await conn.fetchval(
            "SELECT true FROM processed_events WHERE consumer = $1 AND event_id = $2",
            CONSUMER,
            event.event_id,
        ):
            return "duplicate"
        async with conn.transaction():
            if not await adapters.tenant_exists(conn, event.tenant_id):
                return await self._refuse(conn, event, fields, "unknown_tenant", "the tenant does not exist")
            existing = await adapters.insert_pending(conn, fields)
            if existing is not None and not adapters.same_content(existing, fields):
                why = "adapter_id already registered with different content; versions are immutable"
                return await self._refuse(conn, event, fields, "adapter_conflict", why)
            if existing is not None and existing["status"] != "pending":
                await apply_once(conn, CONSUMER, event.event_id, _nothing)
                return f"already {existing['status']}"
        return None

    async def _refuse(
        self, conn: Connection, event: AdapterRegistered, fields: dict[str, Any], code: str, why: str
    ) -> str:
        """Answer a registration that gets no row of its own with a rejected event only."""

        async def effect(c: Connection) -> None:
            await emit(c, adapters.validated_event(fields, "rejected", code, why))

        applied, _ = await apply_once(conn, CONSUMER, event.event_id, effect)
        log.warning("registration of %s refused: %s", event.adapter_id, code)
        return f"rejected:{code}" if applied else "duplicate"

    async def verify(self, event: AdapterRegistered) -> Verdict:
        """All checks on the fields and the files; TransientFetchError propagates for a retry."""
        s = self._settings
        try:
            location = check_fields(
                self._rules,
                base_model_hash=event.base_model_hash,
                rank=event.rank,
                target_modules=event.target_modules,
                weights_uri=event.weights_uri,
                checksum=event.checksum,
            )
            artifact = await fetch_artifact(self._s3, location, s.config_cap(), s.weights_cap(), self._policy)
            rules = self._rules
            await asyncio.to_thread(
                verify_artifact, artifact, event, self._spec, rules.max_rank, rules.served_base_hash
            )
        except InvalidRegistration as exc:
            return Verdict("rejected", exc.code, exc.message)
        except AdapterRejected as exc:
            return Verdict("rejected", exc.code.value, exc.message)
        return Verdict("ready", size_bytes=len(artifact.weights))


async def _nothing(_conn: Connection) -> None:
    return None
