"""The connection type the database edges take: a plain asyncpg connection or one acquired from a pool."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

# `pool.acquire()` yields a proxy that forwards to the pooled connection; both run the same queries.
# asyncpg's classes are generic only in their stubs, so the parameterised form is for the type checker.
if TYPE_CHECKING:
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
else:
    Connection = asyncpg.Connection | PoolConnectionProxy
