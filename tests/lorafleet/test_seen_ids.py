"""The console's memory of event ids: a completion delivered twice is counted once."""

from __future__ import annotations

import uuid

from lorafleet.seen_ids import SeenIds


def test_an_id_is_new_once_while_remembered_and_the_oldest_are_forgotten() -> None:
    seen = SeenIds(capacity=2)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    assert seen.first_time(a) and not seen.first_time(a)
    assert seen.first_time(b) and seen.first_time(c)  # a falls out: only the last 2 are kept
    assert not seen.first_time(c) and not seen.first_time(b)
    assert seen.first_time(a)
