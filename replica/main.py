"""Entry point of a replica process: settings -> replica -> uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from replica.config import ReplicaSettings
from replica.runtime import build_replica
from replica.server import create_app

log = logging.getLogger(__name__)


def serve(settings: ReplicaSettings) -> None:
    """Load the base model, then serve HTTP until interrupted."""
    replica = build_replica(settings)
    log.info(
        "replica %s serving %s (base %s) on %s:%d",
        settings.replica_id,
        settings.model_dir,
        replica.base_model_hash,
        settings.host,
        settings.port,
    )
    uvicorn.run(create_app(replica), host=settings.host, port=settings.port, log_level="info")
