"""Annotated dependencies for the internal API: the service-token check, the pool and the registry rules."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

import asyncpg
from fastapi import Depends, Header, Request

from gateway.errors import GatewayError, TooManyAuthFailures, Unauthorized
from gateway.public.admission.rate_limit import retry_after_header
from gateway.registry.registration_rules import RegistryRules
from gateway.tenants import Caller
from schemas.ids import ALIAS_RE


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


async def require_service_token(request: Request, authorization: str | None = Header(default=None)) -> None:
    """Bearer service token, compared in constant time; one code for missing and wrong."""
    expected: bytes = request.app.state.service_token_digest
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(_digest(token.strip()), expected):
        raise Unauthorized("invalid_service_token", "a valid service token is required for /internal")


async def require_registry_reader(request: Request, authorization: str | None = Header(default=None)) -> None:
    """Bearer service token or registry-read token (the replicas'), in constant time; one code for both
    missing and wrong."""
    scheme, _, token = (authorization or "").partition(" ")
    digest = _digest(token.strip())
    allowed: tuple[bytes, ...] = (request.app.state.service_token_digest, request.app.state.read_token_digest)
    matches = [hmac.compare_digest(digest, expected) for expected in allowed]
    if scheme.lower() != "bearer" or not any(matches):
        raise Unauthorized("invalid_service_token", "a valid service or registry-read token is required")


def get_pool(request: Request) -> asyncpg.Pool:
    return request.app.state.pool


def get_rules(request: Request) -> RegistryRules:
    return request.app.state.rules


def valid_alias(alias: str) -> str:
    """The {alias} path parameter, checked against the alias grammar (tenant/name[:label])."""
    if not ALIAS_RE.fullmatch(alias):
        raise GatewayError(
            "invalid_alias", f"{alias[:200]!r} is not an alias like tenant/name:label", "alias"
        )
    return alias


async def public_caller(request: Request, authorization: str | None = Header(default=None)) -> Caller:
    """The tenant behind the bearer API key (401 invalid_api_key for missing, unknown or revoked); a source
    address past its limit of failed authentications gets 429 before its key is looked at, unless the key
    is one this gateway has found valid before (admission/auth.py: so a neighbour behind the same address
    cannot lock a working tenant out)."""
    online = request.app.state.online
    source = request.client.host if request.client is not None else "unknown"
    wait = await online.auth_failures.blocked_for(source)
    if wait > 0 and not online.auth.vouched(authorization):
        online.metrics.auth_refused.inc()
        raise TooManyAuthFailures(retry_after_header(wait))
    try:
        return await online.auth.authenticate(authorization)
    except Unauthorized:
        await online.auth_failures.failed(source)
        raise


ServiceAuth = Annotated[None, Depends(require_service_token)]
Pool = Annotated[asyncpg.Pool, Depends(get_pool)]
Rules = Annotated[RegistryRules, Depends(get_rules)]
AliasPath = Annotated[str, Depends(valid_alias)]
PublicCaller = Annotated[Caller, Depends(public_caller)]
