"""Run every Triton kernel in this folder on CPU through Triton's interpreter."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

# Must be set before triton.jit decorates the kernels, i.e. before replica.kernels.lora_* is first imported.
os.environ["TRITON_INTERPRET"] = "1"

KERNEL_MODULES = (
    "replica.kernels.lora_shrink",
    "replica.kernels.lora_expand",
    "replica.kernels.triton_ops",
)


@pytest.fixture(scope="session")
def triton_ops() -> ModuleType:
    """The triton_ops module with interpreted kernels, re-imported if another test compiled them for a GPU."""
    from triton.runtime.interpreter import InterpretedFunction

    from replica.kernels import lora_shrink

    if not isinstance(lora_shrink._shrink_gathered_kernel, InterpretedFunction):
        for name in KERNEL_MODULES:
            importlib.reload(importlib.import_module(name))
    return importlib.import_module("replica.kernels.triton_ops")
