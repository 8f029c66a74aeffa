"""Commands drive the cache idempotently; state and events are built from what the cache holds."""

from __future__ import annotations

from pathlib import Path

from replica.control.commands import CommandHandler
from replica.control.events import EventPublisher
from replica.control.state_publisher import Load, build_state
from schemas.events import ReplicaCommand, ReplicaEvent, parse_event
from tests.replica.adapter_cache.helpers import make_env


def _cmd(command: str, adapter_id: str, replica_id: str = "r1", tier: str = "ram") -> ReplicaCommand:
    return ReplicaCommand(replica_id=replica_id, command=command, adapter_id=adapter_id, target_tier=tier)


async def test_load_prewarm_and_unload_move_the_adapter_between_tiers(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    handler = CommandHandler(env.cache, "r1")
    assert await handler.apply_batch([_cmd("load", "a1")]) == 1
    assert env.cache.tier_of("a1") == "ram"
    await handler.apply_batch([_cmd("prewarm", "a1")])
    assert env.cache.tier_of("a1") == "gpu"
    await handler.apply_batch([_cmd("unload", "a1")])
    assert env.cache.tier_of("a1") == "remote" and env.cache.owned == set()


async def test_duplicates_and_other_replicas_commands_change_nothing(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    handler = CommandHandler(env.cache, "r1")
    load = _cmd("load", "a1", tier="gpu")
    assert await handler.apply_batch([load, load, _cmd("load", "a1", replica_id="r2"), None]) == 1
    assert await handler.apply_batch([load]) == 0  # redelivered after a restart of the consumer loop
    assert len(env.loads("remote")) == 1 and env.cache.tier_of("a1") == "gpu"


async def test_commands_for_one_adapter_apply_in_order_within_a_batch(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    env.add("a2", seed=2)
    handler = CommandHandler(env.cache, "r1")
    await handler.apply_batch([_cmd("load", "a1", tier="gpu"), _cmd("load", "a2"), _cmd("unload", "a1")])
    assert env.cache.tier_of("a1") == "remote" and env.cache.tier_of("a2") == "ram"


async def test_a_failed_load_is_logged_and_the_next_command_still_applies(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    handler = CommandHandler(env.cache, "r1")
    assert await handler.apply_batch([_cmd("load", "missing"), _cmd("load", "a1")]) == 2
    assert env.cache.tier_of("a1") == "ram"


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
