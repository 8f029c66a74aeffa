"""Commands drive the cache idempotently; state and events are built from what the cache holds. A command
whose action keeps failing is dead-lettered; one that met an unreachable object store or registry is
raised, remembered as nothing, and applies when it is read again."""

from __future__ import annotations

from pathlib import Path

import pytest

from replica.adapter_cache.errors import RegistryUnavailableError
from replica.control.commands import CommandHandler, Where
from replica.control.events import EventPublisher
from replica.control.state_publisher import Load, build_state
from schemas.events import Event, ReplicaCommand, ReplicaEvent, parse_event
from tests.replica.adapter_cache.helpers import Unreachable, make_env


class Letters:
    consumer = "replica-commands"

    def __init__(self) -> None:
        self.recorded: list[tuple[str, int, int, bytes | None, str]] = []

    async def record(self, topic: str, partition: int, offset: int, value: bytes | None, reason: str) -> None:
        self.recorded.append((topic, partition, offset, value, reason))


def _cmd(command: str, adapter_id: str, replica_id: str = "r1", tier: str = "ram") -> ReplicaCommand:
    return ReplicaCommand(replica_id=replica_id, command=command, adapter_id=adapter_id, target_tier=tier)


def _read(*events: Event | None) -> list[tuple[Event | None, Where]]:
    """The events as consecutive records of partition 0."""
    return [(e, ("replica.commands", 0, i, e.to_bytes() if e else None)) for i, e in enumerate(events)]


def _handler(env, letters: Letters | None = None) -> CommandHandler:
    return CommandHandler(env.cache, "r1", letters or Letters(), backoff_s=0)  # type: ignore[arg-type]


async def test_load_prewarm_and_unload_move_the_adapter_between_tiers(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    handler = _handler(env)
    assert await handler.apply_batch(_read(_cmd("load", "a1"))) == 1
    assert env.cache.tier_of("a1") == "ram"
    await handler.apply_batch(_read(_cmd("prewarm", "a1")))
    assert env.cache.tier_of("a1") == "gpu"
    await handler.apply_batch(_read(_cmd("unload", "a1")))
    assert env.cache.tier_of("a1") == "remote" and env.cache.owned == set()


async def test_duplicates_and_other_replicas_commands_change_nothing(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    handler = _handler(env)
    load = _cmd("load", "a1", tier="gpu")
    assert await handler.apply_batch(_read(load, load, _cmd("load", "a1", replica_id="r2"), None)) == 1
    assert await handler.apply_batch(_read(load)) == 0  # redelivered after a restart of the consumer loop
    assert len(env.loads("remote")) == 1 and env.cache.tier_of("a1") == "gpu"


async def test_commands_for_one_adapter_apply_in_order_within_a_batch(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    env.add("a2", seed=2)
    handler = _handler(env)
    await handler.apply_batch(_read(_cmd("load", "a1", tier="gpu"), _cmd("load", "a2"), _cmd("unload", "a1")))
    assert env.cache.tier_of("a1") == "remote" and env.cache.tier_of("a2") == "ram"


async def test_a_load_that_keeps_failing_is_dead_lettered_with_its_error_and_the_next_command_applies(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    env.add("corrupt", seed=2, digest="0" * 64)  # its bytes do not hash to the registered checksum
    letters = Letters()
    handler = _handler(env, letters)
    records = _read(_cmd("load", "corrupt"), _cmd("load", "a1"))
    assert await handler.apply_batch(records) == 2
    assert env.cache.tier_of("a1") == "ram" and env.cache.tier_of("corrupt") == "remote"
    ((topic, partition, offset, value, reason),) = letters.recorded
    assert (topic, partition, offset, value) == records[0][1]
    assert "failed 3 times: ChecksumMismatchError" in reason, reason
    assert await handler.apply_batch(records) == 0  # the same loop reads it again: settled, nothing new


async def test_a_load_the_registry_cannot_answer_now_is_raised_and_applies_when_read_again(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path)
    env.cache.registry = env.registry = Unreachable(down=1)
    env.add("a1", seed=1)
    letters = Letters()
    handler = _handler(env, letters)
    records = _read(_cmd("load", "a1"))
    with pytest.raises(RegistryUnavailableError):
        await handler.apply_batch(records)
    assert letters.recorded == [] and env.cache.tier_of("a1") == "remote"
    assert await handler.apply_batch(records) == 1  # not remembered as seen: it applies now
    assert letters.recorded == [] and env.cache.tier_of("a1") == "ram"


async def test_a_load_declined_for_capacity_is_applied_and_nothing_is_dead_lettered(tmp_path: Path) -> None:
    env = make_env(tmp_path, ram_bytes=1)  # no adapter fits in RAM
    env.add("a1", seed=1)
    letters = Letters()
    handler = _handler(env, letters)
    assert await handler.apply_batch(_read(_cmd("load", "a1"))) == 1
    assert letters.recorded == [] and env.cache.owned == {"a1"}  # owned: its first request brings it in


async def test_state_lists_every_tier_and_events_carry_tier_duration_and_bytes(tmp_path: Path) -> None:
    publisher = EventPublisher("r1")
    env = make_env(tmp_path)
    env.cache.on_event = publisher
    env.add("a1", seed=1)
    env.add("a2", seed=2)
    await env.cache.own("a1", "gpu")
    await env.cache.own("a2", "disk")
    state = build_state("r1", "http://127.0.0.1:8100", "ready", env.cache, 4, Load(2, 30))
    assert parse_event(state.to_bytes(), "replica.state") == state
    assert (state.gpu_adapters, state.ram_adapters, state.disk_adapters) == (["a1"], ["a1"], ["a1", "a2"])
    assert (state.queue_depth, state.tokens_in_flight, state.loads_per_min) == (2, 30, 1.0)
    events: list[ReplicaEvent] = []
    while not publisher.queue.empty():
        events.append(publisher.queue.get_nowait())
    assert [(e.adapter_id, e.from_tier, e.to_tier) for e in events] == [
        ("a1", "remote", "ram"),  # verified as it streamed in, then validated into RAM
        ("a1", "ram", "gpu"),
        ("a1", "ram", "disk"),  # the disk copy is written from the same bytes behind the slot load
        ("a2", "remote", "disk"),
    ]
    assert all(e.kind == "load" and e.bytes > 0 and e.duration_s > 0 for e in events)
