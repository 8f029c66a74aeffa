"""Replicas a test speaks for: each id registered at its address under an identity key of its own (as a
replica registers at start-up), and its replica.state records signed with that key's state key, so the
consumers that believe only registered, signed states (the gateway, the placement worker) apply them."""

from __future__ import annotations

import secrets

from aiokafka import AIOKafkaProducer

from lorafleet.state_signature import SIGNATURE_HEADER, sign, state_key
from replica.control.registration import register
from schemas.events import Event, ReplicaState


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
