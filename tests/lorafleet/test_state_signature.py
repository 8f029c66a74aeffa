"""A replica.state verifies only under the state key of the replica that signed it, and only as signed."""

from __future__ import annotations

from lorafleet.state_signature import SIGNATURE_HEADER, header, sign, state_key, verify

VALUE = b'{"replica_id": "r0", "url": "http://10.0.0.1:8100", "status": "ready"}'


def test_a_state_verifies_under_its_replicas_key_only() -> None:
    mine, theirs = state_key("identity key of r0" * 2), state_key("identity key of r1" * 2)
    signature = sign(mine, VALUE)
    assert verify(mine, VALUE, signature)
    assert not verify(theirs, VALUE, signature)  # another replica's key
    assert not verify(mine, VALUE.replace(b"ready", b"draining"), signature)  # the value changed
    assert not verify(mine, VALUE, None) and not verify(None, VALUE, signature)  # unsigned, or no key


def test_the_state_key_is_fixed_by_the_identity_key() -> None:
    assert state_key("k" * 32) == state_key("k" * 32) != state_key("j" * 32)


def test_the_signature_is_read_from_the_records_headers() -> None:
    assert header([("other", b"x"), (SIGNATURE_HEADER, b"abc")]) == b"abc"
    assert header([("other", b"x")]) is None and header(None) is None
    assert header({SIGNATURE_HEADER: b"abc"}) == b"abc"  # faust may hand the headers over as a mapping
