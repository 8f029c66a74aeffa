"""Markers are distinct, unlikely, and found exactly where they occur."""

from __future__ import annotations

import pytest

from canary.check import IsolationTally
from canary.markers import make_markers, markers_in_text, markers_in_tokens


def test_token_markers_have_distinct_first_tokens_so_one_token_names_the_adapter() -> None:
    markers = make_markers(64, seed=3, vocab_size=320)
    assert len({m.token_ids[0] for m in markers}) == 64
    assert all(min(m.token_ids) >= 240 for m in markers)  # the marker zone: no prompt token, no EOS/BOS


def test_text_markers_share_one_length_so_none_contains_another() -> None:
    markers = make_markers(200, seed=1, vocab_size=4000)
    assert len({len(m.text) for m in markers}) == 1 and len({m.text for m in markers}) == 200
    assert markers[42].text[3:9] == "-0042-"


def test_markers_are_deterministic_from_the_seed() -> None:
    assert make_markers(8, 5, vocab_size=320) == make_markers(8, 5, vocab_size=320)
    assert make_markers(8, 5, vocab_size=320) != make_markers(8, 6, vocab_size=320)


def test_detection_finds_a_marker_anywhere_and_nothing_else() -> None:
    a, b = make_markers(2, seed=0, vocab_size=320)
    assert markers_in_tokens([9, *a.token_ids, 9], [a, b]) == {a.adapter_id}
    assert markers_in_tokens(list(a.token_ids[:-1]), [a, b]) == set()
    assert markers_in_text(f"Sure! {b.text}", [a, b]) == {b.adapter_id}


def test_too_many_canaries_for_the_vocabulary_are_refused() -> None:
    with pytest.raises(ValueError):
        make_markers(81, seed=0, vocab_size=320)


def test_tally_counts_each_kind_of_leak() -> None:
    tally = IsolationTally()
    tally.record("r1", "a", {"a"})
    tally.record("r2", "a", {"a", "b"})  # another tenant's marker beside its own
    tally.record("r3", "a", {"b"})  # wrong weights: a leak and a missing marker
    tally.record("r4", None, {"b"})  # base row with a marker
    tally.record("r5", None, set())
    assert (tally.wrong_marker, tally.missing_marker, tally.base_with_marker) == (2, 1, 1)
    assert tally.leaks() == 3 and not tally.ok()
    assert [f.kind for f in tally.findings] == [
        "wrong_marker",
        "wrong_marker",
        "missing_marker",
        "base_with_marker",
    ]


def test_tally_of_clean_rows_passes() -> None:
    tally = IsolationTally()
    tally.record("r1", "a", {"a"})
    tally.record("r2", None, set())
    assert tally.ok() and tally.summary()["requests"] == 2
