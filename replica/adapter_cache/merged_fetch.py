"""The one adapter of a merged replica, fetched the way the adapter cache fetches any adapter.

The record comes from the same sources (the configured folders as file:// records, then the registry),
the bytes from the same ObjectStore (the sha256 verified against the registered checksum as they arrive),
and the files pass the same adapter rules (replica.lora.weights.adapter_from_bytes) before any weight
is touched. Nothing is read from a folder that configuration did not name, and a production replica names
none: its adapter comes from the registry and the object store.
"""

from __future__ import annotations

import asyncio
import logging

from replica.adapter_cache.errors import AdapterNotRegisteredError
from replica.adapter_cache.local_source import RecordSource
from replica.adapter_cache.object_store import ObjectStore
from replica.lora.spec import AdapterSpec
from replica.lora.weights import AdapterWeights, adapter_from_bytes

log = logging.getLogger(__name__)


async def fetch_adapter(
    adapter_id: str, source: RecordSource, store: ObjectStore, spec: AdapterSpec
) -> AdapterWeights:
    """The adapter's verified, validated weights in host memory; a cache or adapter error otherwise."""
    record = await source.get(adapter_id)
    if record.adapter_id != adapter_id:
        raise AdapterNotRegisteredError(f"the registry answered for another adapter than {adapter_id!r}")
    fetched = await store.fetch(record)  # ChecksumMismatchError before any byte is used
    weights = await asyncio.to_thread(
        adapter_from_bytes,
        fetched.config,
        fetched.weights,
        adapter_id,
        spec,
        record.base_model_hash or None,  # empty: the config's own base_model_hash is checked
    )
    log.info("fetched merged adapter %s from %s (%d bytes)", adapter_id, record.weights_uri, fetched.nbytes)
    return weights
