"""Merged replicas first, pure: wrap any routing mode so an adapter's merged replicas take its traffic.

A merged replica serves only the adapter folded into its weights, so it is never a candidate for another
adapter, and the wrapped mode sees only unmerged replicas. When the adapter has a ready merged replica
with room (policy.has_room: an owner's test for a spill), its merged replicas go first (least loaded
first) and the wrapped mode's plan follows as overflow; when the least loaded merged one has none, the
wrapped plan goes first and the merged ones follow. Routing is by adapter id (a version), so a request
resolved to a new version never reaches the old version's merged replica.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from gateway.public.routing.policy import ReplicaLoad, RoutePlan, RouterPolicy, has_room

Route = Callable[[str, Sequence[ReplicaLoad], RouterPolicy, random.Random], RoutePlan]


def merged_first(route: Route) -> Route:
    """The routing mode `route`, with the adapter's merged replicas ahead of it (see the module rule)."""

    def plan(
        adapter_id: str, live: Sequence[ReplicaLoad], policy: RouterPolicy, rng: random.Random
    ) -> RoutePlan:
        merged = sorted(
            (r for r in live if r.merged == adapter_id), key=lambda r: (r.tokens_in_flight, r.replica_id)
        )
        inner = route(adapter_id, [r for r in live if r.merged is None], policy, rng)
        if not merged:
            return inner
        if has_room(merged[0], policy) or not inner.replicas:
            return RoutePlan((*merged, *inner.replicas), "merged")
        return RoutePlan((*inner.replicas, *merged), "merged_overflow")

    return plan
