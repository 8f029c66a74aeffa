"""Replicas a test speaks for: each id registered at its address under an identity key of its own (as a
replica registers at start-up), and its replica.state records signed with that key's state key, so the
consumers that believe only registered, signed states (the gateway, the placement worker) apply them."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping

from aiokafka import AIOKafkaProducer

from lorafleet.state_signature import SIGNATURE_HEADER, sign, state_key
from replica.control.registration import register
from schemas.events import Event, ReplicaState, ReplicaStatus


class SignedReplicas:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._keys: dict[str, str] = {}

    async def register(self, replica_id: str, url: str) -> None:
        """Register replica_id at url (again at a new url with the same key)."""
        key = self._keys.setdefault(replica_id, secrets.token_hex(32))
        await register(self.database_url, replica_id, url, key)

    def headers(self, state: ReplicaState, value: bytes) -> list[tuple[str, bytes]]:
        return [(SIGNATURE_HEADER, sign(state_key(self._keys[state.replica_id]), value))]

    async def send(self, producer: AIOKafkaProducer, event: Event) -> None:
        """Publish event; a replica.state signed by its replica (registered first)."""
        value = event.to_bytes()
        headers = self.headers(event, value) if isinstance(event, ReplicaState) else None
        await producer.send_and_wait(event.topic.name, value, key=event.key().encode(), headers=headers)

    async def report(
        self,
        producer: AIOKafkaProducer,
        statuses: Mapping[str, ReplicaStatus],
        stop: asyncio.Event,
        period_s: float = 0.3,
    ) -> None:
        """Each replica's signed state (its status as statuses holds it now, 4 GPU slots) every period_s,
        as the replicas report, until stop."""
        while not stop.is_set():
            for replica_id, status in sorted(statuses.items()):
                state = ReplicaState(
                    replica_id=replica_id, url=f"http://{replica_id}", status=status, gpu_slots=4
                )
                await self.send(producer, state)
            await asyncio.sleep(period_s)
