"""Whether the forwarders have read every source partition up to the end it had when it was assigned.

Events published while the stream was down, or while its partitions moved, belong to open windows but
reach the fleet topic only once the forwarders read them. A window may close on idleness only after that
backlog is forwarded, so each tick carries a token that vouches for it: a tick sent under the current
assignment's token follows every backlog event on the single fleet partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

Partition = tuple[str, int]  # (topic, partition)


class CatchUp:
    """Source progress against the end offsets seen at assignment; plain values, no Kafka."""

    def __init__(self) -> None:
        self._run = uuid.uuid4().hex  # a tick another process sent never vouches for this one's input
        self._generation = 0
        self._ends: dict[Partition, int] | None = None  # None: no assignment measured yet
        self._next: dict[Partition, int] = {}  # the next offset to read, per partition

    @property
    def assignment(self) -> int:
        """Changes on every revocation and measured assignment: a measurement made under another is stale."""
        return self._generation

    def start(self, ends: Mapping[Partition, int], starts: Mapping[Partition, int]) -> None:
        """A new assignment: each partition's end offset now, and the offset its reading resumes from."""
        self._generation += 1
        self._ends = dict(ends)
        for partition, offset in starts.items():
            self._next[partition] = max(offset, self._next.get(partition, 0))

    def stop(self) -> None:
        """The assignment was revoked: nothing is vouched for until the next one is measured."""
        self._generation += 1
        self._ends = None

    def read(self, partition: Partition, offset: int) -> None:
        """The message at this offset was forwarded or skipped."""
        self._next[partition] = max(offset + 1, self._next.get(partition, 0))

    def caught_up(self) -> bool:
        ends = self._ends
        return ends is not None and all(self._next.get(p, 0) >= end for p, end in ends.items())

    def token(self) -> str | None:
        """What a tick sent now carries: the assignment's token once its backlog is read, else None."""
        return f"{self._run}/{self._generation}" if self.caught_up() else None

    def vouches(self, token: str | None) -> bool:
        """Whether a tick with this token was sent after the current assignment's backlog was read."""
        return token is not None and token == f"{self._run}/{self._generation}" and self.caught_up()
