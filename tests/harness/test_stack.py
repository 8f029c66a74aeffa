"""The builder's process handling without the services: a stack of no database whose processes are
stand-ins (a wrapper that never runs the interpreter), ready, failing and torn down."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness.readiness import ProcessExited
from harness.running import Running
from harness.seed import Seed, Tenant
from harness.spec import CheckReady, HttpReady, ProcessSpec, StackSpec
from harness.stack import private_stack
from lorafleet.config import PlatformSettings


def _sleeper(name: str, ready: tuple[CheckReady | HttpReady, ...] = ()) -> ProcessSpec:
    """A process that runs a minute and ignores the CLI arguments after its wrapper."""
    return ProcessSpec(name, (), wrapper=("sh", "-c", "exec sleep 60"), ready=ready, stop_grace_s=5)


async def test_the_body_runs_once_every_probe_holds_and_every_process_is_stopped_when_it_raises(
    tmp_path: Path,
) -> None:
    tries = 0

    async def third_try() -> bool:
        nonlocal tries
        tries += 1
        return tries == 3

    spec = StackSpec(processes=(_sleeper("a"), _sleeper("b", (CheckReady("the third try", third_try, 10),))))
    seen: list[Running] = []
    with pytest.raises(RuntimeError, match="the body failed"):
        async with private_stack(spec, PlatformSettings(), tmp_path) as stack:
            seen = list(stack.procs.values())
            assert tries == 3 and all(p.alive for p in seen)
            assert stack.env["LORAFLEET_PROFILE"] == "dev" and stack.keys == {}
            raise RuntimeError("the body failed")
    assert [p.name for p in seen] == ["a", "b"]
    assert all(p.proc is not None and p.proc.poll() is not None for p in seen)


async def test_a_process_that_exits_before_it_is_ready_fails_the_stack_at_once_with_its_log(
    tmp_path: Path,
) -> None:
    dies = ProcessSpec(
        "dies",
        (),
        wrapper=("sh", "-c", "echo out of memory; exit 3"),
        ready=(HttpReady("http://127.0.0.1:9/health", 120),),
    )
    spec = StackSpec(processes=(_sleeper("other"), dies))
    started = asyncio.get_running_loop().time()
    with pytest.raises(ProcessExited, match="dies exited with 3") as failed:
        async with private_stack(spec, PlatformSettings(), tmp_path):
            raise AssertionError("never ready")
    assert asyncio.get_running_loop().time() - started < 30  # long before the probe's two minutes
    assert "out of memory" in str(failed.value)
    assert (tmp_path / "dies.log").read_text() == "out of memory\n"


async def test_a_seed_needs_a_database_of_the_stacks_own(tmp_path: Path) -> None:
    spec = StackSpec(seed=Seed((Tenant("acme", 1, 1),)))
    with pytest.raises(ValueError, match="database of the stack's own"):
        async with private_stack(spec, PlatformSettings(), tmp_path):
            pass
