"""Event contracts: every topic has its event, the envelope is always there, bad events never validate."""

from __future__ import annotations

import json
import uuid

import pytest

from schemas import events, topics
from schemas.events import EVENT_TYPES, EventValidationError, parse_event, validate_payload

H = "sha256:" + "0f" * 32


def samples() -> list[events.Event]:
    now = events._now()
    return [
        events.AdapterRegistered(
            adapter_id="acme-support-v7",
            tenant_id="acme",
            version=7,
            base_model_hash=H,
            rank=16,
            alpha=32,
            target_modules=["q_proj", "v_proj"],
            weights_uri="s3://lorafleet-adapters/acme/v7/",
            checksum=H,
        ),
        events.AdapterValidated(
            adapter_id="acme-support-v7",
            tenant_id="acme",
            version=7,
            status="rejected",
            reason_code="checksum_mismatch",
            reason="sha256 differs",
        ),
        events.AliasChanged(
            alias="acme/support:prod",
            tenant_id="acme",
            adapter_id="acme-support-v7",
            previous_adapter_id="acme-support-v6",
            revision=3,
        ),
        events.ReplicaCommand(
            replica_id="r1", command="load", adapter_id="acme-support-v7", target_tier="gpu"
        ),
        events.ReplicaState(replica_id="r1", url="http://127.0.0.1:8101", gpu_adapters=["a"], queue_depth=2),
        events.ReplicaState(
            replica_id="m1", url="http://127.0.0.1:8201", gpu_adapters=["a"], merged_adapter_id="a"
        ),
        events.ReplicaEvent(
            replica_id="r1",
            kind="load",
            adapter_id="a",
            from_tier="disk",
            to_tier="gpu",
            duration_s=0.04,
            bytes=1 << 20,
        ),
        events.RequestCompleted(
            request_id="req-1",
            tenant_id="acme",
            alias="acme/support:prod",
            adapter_id="a",
            replica_id="r1",
            tier="gpu",
            status="ok",
            prompt_tokens=10,
            completion_tokens=5,
            ttft_s=0.1,
            total_s=0.5,
        ),
        events.AdapterStats(
            adapter_id="a",
            window_start=now,
            window_seconds=60,
            requests=3,
            tokens_per_s=1.5,
            gpu_hit_rate=0.9,
        ),
        events.AutoscaleSignal(
            current_replicas=2,
            desired_replicas=3,
            reason="queue depth",
            hot_adapters=[events.HotAdapter(adapter_id="a", tokens_per_s=900, owners=3)],
        ),
        events.Alert(
            subject="acme", kind="slo_ttft", message="p95 TTFT 1.4s > 1.0s", value=1.4, threshold=1.0
        ),
        events.MergedTarget(adapter_id="a", desired_replicas=1, tokens_per_s=900.0, reason="promote"),
    ]


def test_every_design_topic_has_exactly_one_event_type() -> None:
    assert {cls.topic.name for cls in EVENT_TYPES.values()} == {t.name for t in topics.ALL_TOPICS}
    assert len(EVENT_TYPES) == len(topics.ALL_TOPICS)


@pytest.mark.parametrize("event", samples(), ids=lambda e: e.type)
def test_events_round_trip_through_json_with_the_envelope(event: events.Event) -> None:
    raw = json.loads(event.to_bytes())
    assert {"event_id", "type", "occurred_at", "schema_version"} <= raw.keys()
    assert uuid.UUID(raw["event_id"]) == event.event_id
    back = parse_event(event.to_bytes(), event.topic.name)
    assert back == event
    assert back.key() == str(raw[event.topic.key_field])  # every event carries its topic's key field


def test_an_event_on_the_wrong_topic_is_rejected() -> None:
    event = samples()[2]
    with pytest.raises(EventValidationError, match="does not belong"):
        parse_event(event.to_bytes(), topics.REPLICA_STATE.name)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"checksum": "md5:abc"}, "checksum"),
        ({"rank": 0}, "rank"),
        ({"adapter_id": "../etc/passwd"}, "adapter_id"),
        ({"tenant_id": "Acme Corp"}, "tenant_id"),
        ({"target_modules": []}, "target_modules"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_registration_with_a_bad_field_fails_with_a_clear_error(change: dict, message: str) -> None:
    payload = samples()[0].model_dump(mode="json", exclude={"type"}) | change
    with pytest.raises(EventValidationError, match=message):
        validate_payload("adapter.registered", payload)


def test_unknown_event_types_and_garbage_are_rejected() -> None:
    with pytest.raises(EventValidationError, match="unknown event type"):
        validate_payload("adapter.exploded", {})
    with pytest.raises(EventValidationError):
        parse_event(b"not json")
    with pytest.raises(EventValidationError):
        parse_event(b'{"type": "alias.changed", "alias": "acme/x:prod"}')


def test_an_event_of_a_schema_version_this_code_does_not_know_is_rejected() -> None:
    event = events.MergedTarget(adapter_id="acme-v7", desired_replicas=1, reason="promote")
    data = json.loads(event.to_bytes())
    assert parse_event(json.dumps(data).encode()) == event
    for version in (0, events.SCHEMA_VERSION + 1):
        with pytest.raises(EventValidationError, match="schema_version"):
            parse_event(json.dumps({**data, "schema_version": version}).encode())


def test_a_merged_target_is_keyed_by_its_adapter_and_refuses_a_negative_count() -> None:
    target = events.MergedTarget(adapter_id="acme-v7", desired_replicas=0, reason="demote")
    assert target.key() == "acme-v7"
    assert topics.MERGED_TARGETS.compacted
    with pytest.raises(EventValidationError, match="desired_replicas"):
        validate_payload("merged.target", {"adapter_id": "a", "desired_replicas": -1, "reason": "promote"})
