"""The client side of a replica's POST /internal/drain: start a drain, then wait until the process is gone.

The autoscaler's scale-down, the Kubernetes preStop hook (`lorafleet replica drain --wait`) and an operator
use it; the replica answers the same drain to every repeated call.
"""

from __future__ import annotations

import time

import httpx

from schemas.api import ErrorBody
from schemas.replica_api import DrainRequest, DrainResponse


class DrainFailed(RuntimeError):
    """The replica refused the drain (a bad token) or answered something that is not a DrainResponse."""


def request_drain(
    url: str, token: str, deadline_s: float | None = None, timeout_s: float = 10.0
) -> DrainResponse:
    """Ask the replica at url to drain (deadline_s None: its configured deadline)."""
    body = DrainRequest(deadline_s=deadline_s).model_dump_json(exclude_none=True)
    resp = httpx.post(
        f"{url.rstrip('/')}/internal/drain",
        content=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=timeout_s,
    )
    if resp.status_code != 200:
        try:
            message = ErrorBody.model_validate_json(resp.content).error.message
        except ValueError:
            message = resp.text[:200]
        raise DrainFailed(f"{url} answered {resp.status_code}: {message}")
    return DrainResponse.model_validate_json(resp.content)


def wait_gone(url: str, timeout_s: float, poll_s: float = 0.5) -> bool:
    """Poll GET /health until nothing answers at url (True) or timeout_s passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url.rstrip('/')}/health", timeout=min(2.0, poll_s * 4))
        except httpx.ConnectError:  # the port is closed: the process is gone
            return True
        time.sleep(poll_s)
    return False
