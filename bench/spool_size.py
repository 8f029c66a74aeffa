"""`lorafleet bench spool-size`: the disk a full requests.completed spool takes, for sizing its volume.

Fills a UsageSpool in a temp folder with copies of one typical event (a request with every field set),
in batches as the gateway's writer commits them, checkpoints the WAL into the file, and prints the bytes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from bench._util import emit
from gateway.public.usage_spool import Record, UsageSpool
from schemas.events import RequestCompleted


def spool_size(
    events: Annotated[int, typer.Option(help="events to spool (the default bound is 1,000,000)")] = 1_000_000,
    batch: Annotated[int, typer.Option(help="events per committed batch")] = 1_000,
) -> None:
    """Print the spool file's size with EVENTS waiting in it."""
    event = RequestCompleted(
        request_id="req_" + "0" * 24,
        tenant_id="acme",
        alias="acme/support:prod",
        adapter_id="acme-support-v12",
        replica_id="replica-17",
        tier="gpu",
        status="ok",
        prompt_tokens=1_024,
        completion_tokens=256,
        ttft_s=0.251,
        total_s=6.43,
    )
    record = Record(event.topic.name, event.key().encode(), event.to_bytes())
    with tempfile.TemporaryDirectory() as folder:
        spool = UsageSpool.open(Path(folder) / "usage.sqlite", events)
        for start in range(0, events, batch):
            spool.append([record] * min(batch, events - start))
        spool.checkpoint()
        on_disk = sum(p.stat().st_size for p in Path(folder).iterdir())
        spool.close()
    emit({"events": events, "event_bytes": len(record.value), "spool_bytes": on_disk}, None)
