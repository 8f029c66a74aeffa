"""The event ids seen lately, so that an event delivered twice is counted once."""

from __future__ import annotations

import uuid
from collections import OrderedDict


class SeenIds:
    """The last `capacity` distinct ids; first_time(id) is True once per id while it is remembered."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[uuid.UUID, None] = OrderedDict()

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def add(self, event_id: uuid.UUID) -> None:
        """Remember event_id, forgetting the oldest past capacity."""
        self._ids[event_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def first_time(self, event_id: uuid.UUID) -> bool:
        if event_id in self._ids:
            return False
        self.add(event_id)
        return True
