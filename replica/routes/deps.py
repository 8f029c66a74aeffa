"""The replica routes' dependencies: the service token, the replica addressed, and the serving objects."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Request

from lorafleet.profile import token_digest
from replica.control.drain import Drain
from replica.errors import UnauthorizedError, WrongReplicaError
from replica.runtime import Replica


def service_authorized(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """A valid service token: one whose sha256 is the replica's (it may hold only the digest)."""
    settings = request.app.state.replica.settings
    scheme, _, token = (authorization or "").partition(" ")
    presented = token_digest(token) if scheme == "Bearer" and token else ""
    expected = settings.service_token_digest()
    if not presented or not expected or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise UnauthorizedError("missing or invalid service token")


def authorized(
    request: Request, replica_id: str, authorization: Annotated[str | None, Header()] = None
) -> None:
    """Every per-replica internal route: a valid service token, addressed to this replica."""
    service_authorized(request, authorization)
    settings = request.app.state.replica.settings
    if replica_id != settings.replica_id:
        raise WrongReplicaError(f"this is replica {settings.replica_id!r}, not {replica_id!r}")


async def serving_replica(request: Request) -> Replica:
    """The Replica the app was built around."""
    replica: Replica = request.app.state.replica
    return replica


async def replica_drain(request: Request) -> Drain:
    """The replica's one drain."""
    drain: Drain = request.app.state.drain
    return drain


Authorized = Annotated[None, Depends(authorized)]
ServiceAuthorized = Annotated[None, Depends(service_authorized)]
ServingReplica = Annotated[Replica, Depends(serving_replica)]
ReplicaDrain = Annotated[Drain, Depends(replica_drain)]
