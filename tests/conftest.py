"""Process-wide test settings that must be in place before any test module imports torch, triton or peft."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from harness.env import SMALL_REPLICA_ENV

# Nothing in the suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The suite's processes run on the well-known dev tokens, which only the dev profile accepts.
os.environ.setdefault("LORAFLEET_PROFILE", "dev")
# A replica's KV cache is a byte budget allocated at start (2 GiB by default on the CPU): the suite's
# replicas, in this process and in the ones it starts, get a budget its small models and prompts fill.
os.environ.setdefault("LORAFLEET_REPLICA_KV_CACHE_BYTES", str(256 << 20))
# The replica's defaults are the production profile; the suite's replicas get the sizes it was written for.
# Not the slots: pydantic-settings merges a dict from the environment into one given in code, so a test's
# own lora_slots would grow by these. The stacks' processes get them from harness.env.stack_env.
for _name, _value in SMALL_REPLICA_ENV.items():
    if _name != "LORAFLEET_REPLICA_LORA_SLOTS":
        os.environ.setdefault(_name, _value)

# Triton picks interpreter or compiler when it is first imported (peft imports it too), so choose here:
# without a GPU, Triton kernels run through the interpreter on CPU tensors.
# (A device node check, not torch.cuda.is_available(), so that this file does not import torch.)
if not os.path.exists("/dev/nvidia0") or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Hypothesis's per-example deadline (200 ms) measures the machine, not the property: on a loaded CI box a
# slow example fails as "flaky". The suite's per-test timeout bounds a test's time instead.
settings.register_profile("lorafleet", deadline=None)
settings.load_profile("lorafleet")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The default base model as a Hugging Face directory (prepared once from the bundled GGUF)."""
    from lorafleet.model.prepare import ensure_default_model

    return ensure_default_model()


_PRETRAINING = pytest.StashKey[subprocess.Popen[bytes]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start training the sets that the selected tests name in pytest.mark.trains, in the order they first
    need them, in the background: they train while the tests before them run (harness.pretraining)."""
    if session.config.option.collectonly:
        return
    names = list(
        dict.fromkeys(
            name for item in session.items for mark in item.iter_markers("trains") for name in mark.args
        )
    )
    if names:
        from harness.pretraining import start
        from lorafleet.config import get_settings

        log_path = get_settings().data_path / "logs" / "pretraining.log"
        session.config.stash[_PRETRAINING] = start(names, log_path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """While a test that needs a set is set up, it may wait for the background: let that run at full speed."""
    proc = item.config.stash.get(_PRETRAINING, None)
    if proc is None or item.get_closest_marker("trains") is None:
        return (yield)
    from harness.pretraining import ease, hurry

    hurry(proc)
    try:
        return (yield)
    finally:
        ease(proc)


def pytest_sessionfinish(session: pytest.Session) -> None:
    proc = session.config.stash.get(_PRETRAINING, None)
    if proc is not None:
        from harness.pretraining import stop

        stop(proc)
