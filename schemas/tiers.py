"""How long bringing an adapter into a GPU slot takes from each tier (schemas.events.Tier), by the brief's
sizing: the router prices a replica with these and the fleet simulator replays them."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# tier -> seconds: already in a slot, RAM -> GPU 8 ms, local disk 40 ms, the object store 0.4 s.
LOAD_S: Mapping[str, float] = MappingProxyType({"gpu": 0.0, "ram": 0.008, "disk": 0.040, "remote": 0.4})
