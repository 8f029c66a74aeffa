"""Run every Triton kernel in this folder on CPU through Triton's interpreter."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

# Triton decides interpreter or compiler when it is first imported (its own helpers are decorated then),
# so this must run before anything imports triton. Nothing collected before this folder does today; a root
# tests/conftest.py setting the same variable would make that independent of collection order.
os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def triton_ops() -> ModuleType:
    """The triton_ops module, its kernels interpreted; fails clearly if triton was imported too early."""
    import torch

    ops = importlib.import_module("replica.kernels.triton_ops")
    probe_x, probe_a = torch.ones(1, 4), torch.ones(1, 2, 4)
    try:
        ops.lora_shrink(probe_x, probe_a, torch.zeros(1, dtype=torch.int32))
    except Exception as exc:
        pytest.fail(
            "Triton kernels cannot run interpreted on CPU here: triton was probably imported (for example "
            "through peft) before TRITON_INTERPRET=1 was set. Set TRITON_INTERPRET=1 in the environment or "
            f"in tests/conftest.py. Cause: {exc!r}"
        )
    return ops
