"""Entry point of a replica process: settings -> replica -> uvicorn, where SIGTERM drains before exiting."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from replica.config import SHUTDOWN_GRACE_S, ReplicaSettings
from replica.runtime import build_replica
from replica.server import create_app

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM starts a drain (the process exits when it ends); SIGINT and a
    second SIGTERM stop at once as uvicorn does."""

    def __init__(self, config: uvicorn.Config, start_drain: Callable[[], object]) -> None:
        super().__init__(config)
        self._start_drain = start_drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self._draining and self._loop is not None and self.started:
            self._draining = True
            log.info("SIGTERM: draining")
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)


def serve(settings: ReplicaSettings) -> None:
    """Load the base model, then serve HTTP until drained or interrupted."""
    replica = build_replica(settings)
    log.info(
        "replica %s serving %s (base %s) on %s:%d",
        settings.replica_id,
        settings.model_dir,
        replica.base_model_hash,
        settings.host,
        settings.port,
    )

    def exit_drained() -> None:
        server.should_exit = True

    app = create_app(replica, on_drained=exit_drained)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
        **settings.platform.listener_options(),
    )
    server = DrainingServer(config, lambda: app.state.drain.start())
    server.run()
